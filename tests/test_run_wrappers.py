"""Every Python process of a `blackbox run` job keeps its death, whatever its place in the process tree.

Jobs launched the ways users launch them (a shell wrapper that does not `exec` python, a `train.sh`, a
Python child of the job, a multiprocessing worker), each run unarmed and armed side by side: the same exit
status and output, and the bundle's verdict checked against the planted truth. Only a clean end (status 0,
no uncaught exception) is folded into `folded.jsonl`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

ENV = dict(os.environ, PYTHONPATH=str(REPO))
PY = sys.executable
STEPS = """\
import sys, time
import numpy
try:
    import blackbox
except ImportError:  # unarmed: the same job, with no recorder to tell its steps to
    blackbox = None
for step in range(int(sys.argv[1])):
    if blackbox is not None:
        blackbox.step(step)
    time.sleep(0.05)
time.sleep(float(sys.argv[2]))
{end}
"""


def _run(tmp_path: Path, armed: bool, *cmd: str) -> subprocess.CompletedProcess[str]:
    run = [PY, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--"] if armed else []
    env = ENV if armed else {**ENV, "PYTHONPATH": ""}
    return subprocess.run([*run, *cmd], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


def _side_by_side(tmp_path: Path, *cmd: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    """Run unarmed, then armed; the same status and stdout, the job's stderr lines kept; the bundle's metadata."""
    plain, armed = _run(tmp_path, False, *cmd), _run(tmp_path, True, *cmd)
    assert (armed.returncode, armed.stdout) == (plain.returncode, plain.stdout), (plain.stderr, armed.stderr)
    job_lines = [ln for ln in plain.stderr.splitlines() if "pid" not in ln]  # bash names pids in its own lines
    assert all(ln in armed.stderr for ln in job_lines), (plain.stderr, armed.stderr)
    (run,) = (tmp_path / "run").glob("run-*")
    return armed, json.loads((run / "bundle" / "metadata.json").read_text())


def test_a_shell_wrappers_python_that_raises_is_the_jobs_death(tmp_path: Path) -> None:
    # GIVEN `bash -c "python train.py; exit $?"`: bash stays the job's top process, python its child, and
    # python raises a ValueError at step 4 (the planted truth)
    (tmp_path / "train.py").write_text(STEPS.format(end="raise ValueError('planted at step 4')"))
    proc, meta = _side_by_side(tmp_path, "bash", "-c", f"{PY} train.py 5 0; exit $?")
    # THEN armed as unarmed it exits 1 with the traceback; the python's ring was kept (not folded as a helper
    # that ended cleanly) and the verdict is its exception, at its step, in the job's own process
    assert proc.returncode == 1
    death = meta["death"]
    assert (death["cause"], death["step"], death["exit_status"]) == ("exception", 4, 1), death
    line = STEPS.splitlines().index("{end}") + 1  # the raise, as planted
    assert death["victim"]["role"] == "main process" and death["headline"] == (
        f'The job died of an uncaught ValueError at <module> (train.py:{line}): "planted at step 4".')
    assert any("ValueError: planted at step 4" in e for e in death["evidence"]), death
    assert "helpers" not in meta


def test_train_sh_verdict_follows_the_process_that_died_first(tmp_path: Path) -> None:
    # GIVEN a train.sh that runs one Python process in the background, which raises after 2 steps, and
    # another in the foreground, which exits 3 a second later: the script ends with the second's status
    (tmp_path / "first.py").write_text(STEPS.format(end="raise KeyError('first to die')"))
    (tmp_path / "later.py").write_text(STEPS.format(end="raise SystemExit(3)"))
    (tmp_path / "train.sh").write_text(
        f"#!/bin/bash\ncd \"$(dirname \"$0\")\"\n{PY} first.py 2 0 &\n{PY} later.py 1 1.5\n"
        "status=$?\nwait\nexit $status\n"
    )
    (tmp_path / "train.sh").chmod(0o755)
    proc, meta = _side_by_side(tmp_path, str(tmp_path / "train.sh"))
    # THEN both Python processes kept their rings, each with its own end, and the verdict is the death that
    # came first (the background one's KeyError), not the one whose status the script passed on
    assert proc.returncode == 3
    ends = {tuple(r["argv"][:1]): (r["death"]["cause"], r["death"]["exit_status"]) for r in meta["rings"]}
    assert ends == {("first.py",): ("exception", 1), ("later.py",): ("nonzero_exit", 3)}, ends
    first = meta["first_death"]
    assert (first["cause"], first["step"]) == ("exception", 1), first
    assert next(r for r in meta["rings"] if r["pid"] == first["pid"])["argv"][0] == "first.py"


WORKER_RAISES = """\
import multiprocessing as mp, subprocess, sys
import numpy
def boom():
    raise KeyError("in the worker")
if __name__ == "__main__":
    mp.set_start_method("forkserver")
    p = mp.Process(target=boom)
    p.start()
    p.join()
    print("worker exitcode", p.exitcode, flush=True)
    child = subprocess.run([sys.executable, "-c", "import numpy, sys; sys.exit(4)"])
    print("child status", child.returncode, flush=True)
"""


def test_helpers_that_fail_keep_their_rings_and_the_job_that_outlived_them_says_so(tmp_path: Path) -> None:
    # GIVEN a job whose multiprocessing worker's target raises (it exits 1 by os._exit, no excepthook sees it)
    # and whose Python child exits 4; the job itself goes on and exits 0
    (tmp_path / "job.py").write_text(WORKER_RAISES)
    proc, meta = _side_by_side(tmp_path, PY, "job.py")
    assert proc.returncode == 0 and proc.stdout == "worker exitcode 1\nchild status 4\n"
    # THEN neither was folded away: the worker's exception and the child's status are in the bundle; the
    # first death is the worker's, and the job is told as having outlived it
    ends = {r["role"]: (r["death"]["cause"], r["death"]["exit_status"]) for r in meta["rings"] if r["role"] != "main"}
    assert ends.get("worker", ("",))[0] == "exception" and ends.get("child") == ("nonzero_exit", 4), ends
    worker = next(r for r in meta["rings"] if r["role"] == "worker")
    assert any("KeyError: 'in the worker'" in e for e in worker["death"]["evidence"]), worker["death"]
    assert meta["first_death"]["pid"] == worker["pid"] and meta["exit_status"] == 0
    assert "exit status 0: the job ended cleanly; a process of it died before: exception;" in proc.stderr
    assert all(h["role"] == "mp_service" for h in meta.get("helpers", [])), meta.get("helpers")


LAUNCHER = """\
import os, sys
import numpy  # a launcher that checks the install, sets the environment, then execs the trainer
os.environ["OMP_NUM_THREADS"] = "2"
os.execv(sys.executable, [sys.executable, "train.py", "6", "0"])
"""


@pytest.mark.parametrize("end", ["segv", "clean"])
def test_a_python_launcher_that_execs_the_trainer_is_no_death(tmp_path: Path, end: str) -> None:
    # GIVEN launch.py, which execs train.py in its own process (same pid): train.py crashes in native code at
    # step 5, or ends cleanly
    (tmp_path / "launch.py").write_text(LAUNCHER)
    crash = "import ctypes; ctypes.string_at(0)" if end == "segv" else "print('done')"
    (tmp_path / "train.py").write_text(STEPS.format(end=crash))
    proc, meta = _side_by_side(tmp_path, PY, "launch.py")
    # THEN the job's death is train.py's, with its status (the launcher's ring, left without a clean end by
    # the exec, read "killed with SIGKILL" first); the launcher's ring says it went on as train.py
    assert proc.returncode == (-11 if end == "segv" else 0)
    if end == "segv":
        first = meta["first_death"]
        told = "died of SIGSEGV in native code (a null pointer: address 0x0, in libc.so.6), called from <module> ("
        assert first["cause"] == "signal" and f"{told}train.py:" in first["headline"], first
        assert first["step"] == 5, first
    else:
        assert meta["cause"] == "clean_exit", meta.get("first_death")
    (launcher,) = [r for r in meta["rings"] if "launch.py" in " ".join(r["argv"])]
    assert launcher["death"]["cause"] == "clean_exit", launcher["death"]
    assert launcher["death"]["headline"].endswith("replaced itself with `train.py 6 0` (exec): it went on there.")


GRACEFUL = """\
import signal, sys, time
import numpy
try:
    import blackbox
except ImportError:  # unarmed: the same job, with no recorder to tell its steps to
    blackbox = None
asked = []
signal.signal(signal.SIGTERM, lambda signum, frame: asked.append(signum))
for step in range(2000):
    if blackbox is not None:
        blackbox.step(step)
    time.sleep(0.02)
    if asked:
        print("checkpoint saved", flush=True)
        sys.exit(0)
"""


def test_a_wrapped_python_that_shuts_down_on_sigterm_keeps_its_ring_and_its_story(tmp_path: Path) -> None:
    # GIVEN `timeout -s TERM 4 python train.py` (python is timeout's child, not the job's own process): its
    # handler takes the SIGTERM, saves a checkpoint and exits 0; timeout exits 124
    (tmp_path / "train.py").write_text(GRACEFUL)
    proc, meta = _side_by_side(tmp_path, "timeout", "-s", "TERM", "4", PY, "train.py")
    assert proc.returncode == 124 and proc.stdout == "checkpoint saved\n"
    # THEN its ring was kept (it was folded as a helper that ended cleanly: "the job's own process left no
    # ring"), and the bundle tells the graceful shutdown and who asked for it
    death = meta["death"]
    assert death["cause"] == "clean_exit" and death["victim"]["role"] == "main process", death
    assert "after SIGTERM from timeout, which its own handler took (a graceful shutdown)" in death["headline"], death


@pytest.mark.parametrize("detach", ["subshell", "nohup"])
def test_a_python_whose_shell_ended_before_it_armed_never_takes_the_shells_status(tmp_path: Path, detach: str) -> None:
    # GIVEN a script that starts python in the background and leaves it: `( python train.py & )`, or `nohup python
    # train.py &` as the script's last line. The shell is gone before python arms, so python is handed to
    # `blackbox run` (a subreaper) and has it as its parent at arm, as the job's own process has. Python is
    # SIGKILLed at step 3 (the planted truth); the script exits 0, then 3 (at once after nohup: `blackbox run`
    # waits for the rest of the job; after the subshell, 3 s later: bash never reaps that python either way)
    (tmp_path / "train.py").write_text(STEPS.format(end="import os; os.kill(os.getpid(), 9)"))
    start = f"( {PY} train.py 4 0 & )\nsleep 3" if detach == "subshell" else f"nohup {PY} train.py 4 0 > out.log 2>&1 &"
    for status in (0, 3):
        for run in (tmp_path / "run").glob("run-*"):
            run.rename(tmp_path / f"old-{run.name}")
        proc, meta = _side_by_side(tmp_path, "bash", "-c", f"{start}\nexit {status}")
        # THEN the status is the script's, as unarmed; python's death is its own, SIGKILL at its step, not the
        # script's clean exit (before: "The job exited cleanly", certain) nor its exit 3
        assert proc.returncode == status
        death = meta.get("first_death") or meta["death"]
        assert (death["cause"], death["step"]) == ("killed", 3), death
        assert death.get("exit_status") in (None, 128 + 9), death


def test_a_python_left_running_after_the_script_ended_is_told_as_running_not_as_a_death(tmp_path: Path) -> None:
    # GIVEN a launch script that starts training with nohup in the background and exits 0 two seconds later;
    # the training runs on (the planted truth: alive, not dead) past `blackbox run`'s grace for the job's rest
    (tmp_path / "train.py").write_text("import os\nopen(f'pid-{os.getpid()}', 'w').close()\n" + STEPS.format(end=""))
    try:
        proc, meta = _side_by_side(tmp_path, "bash", "-c", f"nohup {PY} train.py 4 40 > out.log 2>&1 &\nsleep 2")
        # THEN the job's status is the script's 0, and its ring is a snapshot of a process still running, told
        # so (before: "a process of it died before: unknown", "Process that died")
        assert proc.returncode == 0
        first = meta["first_death"]
        assert first["alive"] is True and first["cause"] == "unknown", first
        # AND where it sits: 4 steps, then its long sleep (line 13), the stall measured to its last record
        lines = (tmp_path / "train.py").read_text().splitlines()
        sleep = lines.index("time.sleep(float(sys.argv[2]))") + 1
        assert ") is still running: this is a snapshot of it, not a death. It has made no step for " in first[
            "headline"] and first["headline"].endswith(f", stuck in <module> (train.py:{sleep})."), first
        (run,) = (tmp_path / "run").glob("run-*")
        summary = (run / "bundle" / "summary.md").read_text()
        assert "Process still running: main process pid" in summary and "Process that died" not in summary
        assert "still running: this is a snapshot" in proc.stderr and "died before" not in proc.stderr, proc.stderr
    finally:
        for mark in tmp_path.glob("pid-*"):  # the trainings this test left running (unarmed, armed)
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(mark.name[4:]), signal.SIGKILL)


def test_a_failing_status_of_the_shell_is_told_as_the_shells_when_every_python_ended_cleanly(tmp_path: Path) -> None:
    # GIVEN a script that starts its Python process detached (`( python train.py & )`: handed to `blackbox run`, it
    # is kept, not folded as a shell's helper), which ends cleanly, and then fails by itself (`exit 3`): the status
    # is the shell's, no process with a ring had it (it read "exit status 3; cause: clean_exit; The job exited
    # cleanly.")
    (tmp_path / "train.py").write_text(STEPS.format(end=""))
    proc, meta = _side_by_side(tmp_path, "bash", "-c", f"( {PY} train.py 3 0 & )\nsleep 3\nexit 3")
    # THEN the status is 3, armed as unarmed, and the bundle and `blackbox run` say whose it is
    assert proc.returncode == 3 and meta["cause"] == "clean_exit" and meta["exit_status"] == 3, meta.get("death")
    (run,) = (tmp_path / "run").glob("run-*")
    summary = (run / "bundle" / "summary.md").read_text()
    assert "**The job exited with status 3**, its own (a shell, or a program that is not Python)" in summary
    assert "exit status 3, the job's own (a shell, or a program that is not Python)" in proc.stderr, proc.stderr


@pytest.mark.parametrize("armed_child", [True, False], ids=["child armed", "child never armed"])
def test_a_python_child_killed_by_the_oom_killer_gets_no_dataloader_worker_levers(
    tmp_path: Path, memory_cgroup: Any, armed_child: bool
) -> None:
    # GIVEN a job whose Python starts another Python (a notebook's kernel under nbconvert, a script's
    # subprocess) that leaks until the kernel OOM-kills it in a 300 MiB cgroup (its levers were a DataLoader
    # worker's: "a cache in the Dataset that grows in every worker", "fewer DataLoader workers"); it imports numpy
    # (armed, a ring of its own), or never does (never armed: a kernel that runs no array code; the levers then
    # came from its growth as the parent's child)
    block = "np.ones(1 << 19)" if armed_child else "bytearray(4 << 20)"
    (tmp_path / "child.py").write_text(f"import time\n{'import numpy as np' if armed_child else ''}\nkept = []\n"
                                       f"while True:\n    kept.append({block})  # PLANT\n    time.sleep(0.01)\n")
    (tmp_path / "parent.py").write_text(f"import subprocess, sys\nsys.exit(subprocess.run([{PY!r}, 'child.py'])"
                                        ".returncode & 0xFF)\n")  # fmt: skip
    cg = memory_cgroup(300 << 20)
    kills = cg.oom_kills()
    run = [PY, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--", PY, "parent.py"]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, env=ENV, cwd=tmp_path,
                          preexec_fn=cg.join)  # fmt: skip
    assert cg.oom_kills() == kills + 1, done.stderr[-2000:]
    (bundle,) = (tmp_path / "run").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    first = meta["first_death"]
    # THEN the child's OOM kill is the first death, with the levers of a process of its own
    assert (first["cause"], first["victim"]["role"]) == ("host_oom_kill", "child process"), first
    change = (bundle / "summary.md").read_text().split("What to change:", 1)[1].split("\n## ", 1)[0]
    assert "Dataset" not in change and "DataLoader" not in change, change
    assert ("child.py:5" if armed_child else "caches that never evict") in change.split("\n- ", 2)[1], change
