"""`blackbox run` keeps the job's process-group semantics: a signal to the group reaches every process the job
started, exactly as it does unarmed.

Each job runs unarmed and under `blackbox run`, side by side, started as an interactive shell starts a job
(a process group of its own); a group signal is sent the ways the field sends one (`kill -KILL -PGID`,
`timeout -s KILL`), and what is left running is compared (`ps -eo pid,pgid,sid,cmd`, read from /proc).
"""

from __future__ import annotations

import contextlib
import os
import pty
import select
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow

ENV = dict(os.environ, PYTHONPATH=str(REPO))
BLACKBOX = [sys.executable, "-m", "blackbox", "run", "--quiet"]
# A Python process of the job: notes its pid in a file of its own, then works until it is killed.
WORKER = """\
import os, sys, time
import numpy
open(sys.argv[1] + f".{os.getpid()}", "w").write("up")
time.sleep(120)
"""


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for its parent counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[-1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _pids(marks: Path, count: int) -> list[int]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = [int(p.name.rsplit(".", 1)[1]) for p in marks.parent.glob(marks.name + ".*")]
        if len(found) >= count:
            time.sleep(0.3)  # armed: the ring is made; both: the process is past its start
            return sorted(found)
        time.sleep(0.05)
    raise AssertionError(f"the job's {count} Python processes were not all up within 60 s")


def _left_after(pids: list[int]) -> list[int]:
    deadline = time.monotonic() + 5
    while any(map(_alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return [p for p in pids if _alive(p)]


def _cleanup(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _shell_wrapper(tmp_path: Path, armed: bool) -> tuple[subprocess.Popen[bytes], list[int]]:
    """`bash -c "python worker.py; true"` (bash stays the job's top process, python its child), started in a
    process group of its own as an interactive shell starts a job; and python's pid."""
    (tmp_path / "worker.py").write_text(WORKER)
    marks = tmp_path / "up"
    job = ["bash", "-c", f"{sys.executable} {tmp_path / 'worker.py'} {marks}; true"]
    cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--", *job] if armed else job
    proc = subprocess.Popen(cmd, env=ENV, start_new_session=True, stderr=subprocess.DEVNULL)
    return proc, _pids(marks, 1)


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_kill_of_the_group_ends_a_shell_wrappers_python(tmp_path: Path, armed: bool) -> None:
    # GIVEN a shell wrapper's python
    proc, pids = _shell_wrapper(tmp_path, armed)
    try:
        # WHEN the group is SIGKILLed (`kill -KILL -PGID`)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        # THEN nothing of the job is left running, armed as unarmed
        assert proc.returncode == -signal.SIGKILL
        assert _left_after(pids) == []
    finally:
        _cleanup(pids)


# A child of the job's process (as a DataLoader worker or a subprocess is): notes a SIGTERM in a file.
CHILD = """\
import os, signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: (open(sys.argv[2], "w").write("got it"), sys.exit(3)))
open(sys.argv[1] + f".{os.getpid()}", "w").write("up")
time.sleep(120)
"""
# The job's process: its SIGTERM handler gives the child time to get one too, then ends it and exits 5.
PARENT = """\
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, *sys.argv[1:]])
def ended(*_):
    time.sleep(0.5)
    child.kill()
    child.wait()
    sys.exit(5)
signal.signal(signal.SIGTERM, ended)
time.sleep(120)
"""


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_kill_of_the_jobs_pid_reaches_its_own_process_alone(tmp_path: Path, armed: bool) -> None:
    # GIVEN a Python job with a child process of its own, started as an interactive shell starts a job
    (tmp_path / "parent.py").write_text(PARENT)
    (tmp_path / "child.py").write_text(CHILD)
    marks, got = tmp_path / "up", tmp_path / "child-got-sigterm"
    job = [sys.executable, str(tmp_path / "parent.py"), str(tmp_path / "child.py"), str(marks), str(got)]
    cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--", *job] if armed else job
    proc = subprocess.Popen(cmd, env=ENV, start_new_session=True, stderr=subprocess.DEVNULL)
    pids = _pids(marks, 1)
    try:
        # WHEN SIGTERM is sent to the job's pid alone (`kill PID`; a pod's PID 1, Slurm's proctrack/cgroup)
        os.kill(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        # THEN the main process takes it and ends its child itself; the child never got it, armed as unarmed
        # (armed, blackbox run relayed it to every process of the job: the child too)
        assert proc.returncode == 5
        assert not got.exists()
        assert _left_after(pids) == []
    finally:
        _cleanup(pids)


# A training loop with two fork DataLoader workers; its SIGTERM handler saves for a second, then exits 5.
LOADER = """\
import os, signal, sys, time
from torch.utils.data import DataLoader, Dataset
class Slow(Dataset):
    def __len__(self):
        return 10**6
    def __getitem__(self, i):
        time.sleep(0.05)
        return i
def ended(*_):
    time.sleep(1.0)
    sys.exit(5)
if __name__ == "__main__":
    signal.signal(signal.SIGTERM, ended)
    batches = iter(DataLoader(Slow(), num_workers=2, multiprocessing_context="fork"))
    next(batches)
    open(sys.argv[1] + f".{os.getpid()}", "w").write("up")
    for _ in batches:
        pass
"""


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_kill_of_the_jobs_pid_leaves_its_dataloader_workers_working(tmp_path: Path, armed: bool) -> None:
    pytest.importorskip("torch")
    # GIVEN a training loop with fork DataLoader workers whose SIGTERM handler takes a second to save
    (tmp_path / "train.py").write_text(LOADER)
    marks = tmp_path / "up"
    job = [sys.executable, str(tmp_path / "train.py"), str(marks)]
    cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--", *job] if armed else job
    proc = subprocess.Popen(cmd, env=ENV, start_new_session=True, stderr=subprocess.PIPE, text=True)
    pids = _pids(marks, 1)
    try:
        # WHEN SIGTERM is sent to the job's pid alone
        os.kill(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        # THEN its handler saves and exits 5, armed as unarmed (armed, the workers died of a SIGTERM of their
        # own meanwhile and the loop's SIGCHLD handler ended it with "DataLoader worker ... killed", exit 1)
        assert proc.returncode == 5 and "DataLoader worker" not in err, err[-2000:]
    finally:
        _cleanup(pids)


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_kill_of_a_shell_wrappers_pid_leaves_its_python_running(tmp_path: Path, armed: bool) -> None:
    # GIVEN a shell wrapper's python
    proc, pids = _shell_wrapper(tmp_path, armed)
    try:
        # WHEN SIGTERM is sent to the job's pid alone, and again once the shell has died of it
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(1.5)
        os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.5)
        # THEN the shell dies of it and python runs on, armed as unarmed (armed, python got the first too and
        # died; then, the second: blackbox run passed it on to what the shell left)
        assert [p for p in pids if _alive(p)] == pids
        _cleanup(pids)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGTERM
    finally:
        _cleanup(pids)


THREAD_MASKS = """\
import os, multiprocessing as mp
import numpy
def masks():  # the signals each thread other than the main one blocks (numpy's BLAS threads, blackbox's sampler)
    me = os.getpid()
    tasks = [t for t in os.listdir(f"/proc/{me}/task") if int(t) != me]
    return sorted(int(open(f"/proc/{me}/task/{t}/status").read().split("SigBlk:")[1].split()[0], 16) for t in tasks)
if __name__ == "__main__":
    with mp.get_context("spawn").Pool(1) as pool:
        print(masks(), pool.apply(masks))
"""
HELD = sum(1 << (s - 1) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2))


def test_blas_threads_block_the_recorded_signals_in_a_helper_and_not_in_the_jobs_own_process(tmp_path: Path) -> None:
    # GIVEN a job that loads numpy (one BLAS thread besides the main one) and runs a spawn Pool helper, unarmed and
    # under `blackbox run`, whose start-up loads numpy before the job's code in both processes
    env = dict(ENV, OPENBLAS_NUM_THREADS="2")
    (tmp_path / "job.py").write_text(THREAD_MASKS)
    masks = {}
    for armed in (False, True):
        cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--"] if armed else []
        done = subprocess.run([*cmd, sys.executable, "job.py"], env=env, capture_output=True, text=True,
                              timeout=120, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
        masks[armed] = [[int(m) for m in part.strip(" []").split(",") if m.strip()] for part in
                        done.stdout.strip()[1:-1].split("] [")]  # fmt: skip
    (main, helper), (armed_main, armed_helper) = masks[False], masks[True]
    assert set(main) == {0} and helper == [0], masks[False]  # (the main's: the BLAS thread and the Pool's three)
    # THEN in the job's own process the BLAS thread blocks nothing, as unarmed: a job that blocks SIGTERM on its
    # main thread for a critical section still dies of it at once (a BLAS thread takes it) armed as unarmed (with
    # the hold there too, it waited for the section's end); blackbox's sampler blocks them
    assert armed_main.count(0) == len(main) and all(m & HELD == HELD for m in armed_main if m), masks[True]
    # AND in the helper the BLAS thread blocks them: a SIGTERM as it arms (a Pool's teardown) waits for the handler,
    # where it took it and died unrecorded ("killed with SIGKILL; no handler ran")
    assert len(armed_helper) == 2 and all(m & HELD == HELD for m in armed_helper), masks[True]


def _unshare_works() -> bool:
    unshare = shutil.which("unshare")
    return unshare is not None and subprocess.run([unshare, "-fp", "--mount-proc", "true"], capture_output=True,
                                                  timeout=30).returncode == 0  # fmt: skip


PID1 = """\
import os, signal, sys, threading, time
mode = sys.argv[2]
if mode == "handler":
    signal.signal(signal.SIGTERM, lambda *_: (print("took it", flush=True), sys.exit(3)))
if mode == "sigwait":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    waiter = threading.Thread(target=lambda: print("waited for", int(signal.sigwait({signal.SIGTERM})), flush=True))
    waiter.start()
open(sys.argv[1], "w").close()
if mode == "self":
    os.kill(os.getpid(), signal.SIGTERM)
time.sleep(30 if mode == "handler" else 2)
if mode == "sigwait":
    waiter.join()
print("ran on", flush=True)
"""
RAN_ON = (0, "ran on\n")
PID1_JOBS = {  # (the job's mode, how it is started, and how it ends unarmed as PID 1 after the SIGTERM)
    "handler": ("handler", lambda job: job, (3, "took it\n")),
    "no handler": ("none", lambda job: job, RAN_ON),  # the kernel drops it: no handler
    "shell, no handler": ("none", lambda job: ["bash", "-c", " ".join(job) + "; exit $?"], RAN_ON),  # (bash has none)
    "no handler, no C extension": ("none", lambda job: job, RAN_ON),  # (faulthandler records signals there)
    "no handler, signals itself": ("self", lambda job: job, RAN_ON),  # dropped too, whoever sends it
    "waits for it": ("sigwait", lambda job: job, (0, "waited for 15\nran on\n")),  # blocked: queued, even for PID 1
    "waits for it, unarmed (-I)": ("sigwait", lambda job: [job[0], "-I", *job[1:]], (0, "waited for 15\nran on\n")),
}


@pytest.mark.skipif(not _unshare_works(), reason="no PID namespace can be made here (unshare -fp)")
@pytest.mark.parametrize("kind", list(PID1_JOBS))
def test_sigterm_to_a_pid_namespaces_first_process_is_what_the_kernel_makes_of_it(tmp_path: Path, kind: str) -> None:
    # GIVEN a Python job as a container's first process (PID 1 of its PID namespace), directly or under a shell,
    # unarmed and under `blackbox run` (then blackbox run is PID 1); with a SIGTERM handler that ends it, or none
    (tmp_path / "job.py").write_text(PID1)
    mode, wrap, (status, said) = PID1_JOBS[kind]
    procs = {}
    for armed in (False, True):
        job = wrap([sys.executable, str(tmp_path / "job.py"), str(tmp_path / f"up-{armed}"), mode])
        cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--", *job] if armed else job
        env = dict(ENV, BLACKBOX_NO_C_EXTENSION="1") if "no C" in kind else ENV
        env = dict(env, OPENBLAS_NUM_THREADS="1") if mode == "sigwait" else env  # (test_signals says why)
        procs[armed] = subprocess.Popen(["unshare", "-fp", "--mount-proc", *cmd], env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"up-{a}").exists() for a in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    # WHEN the container's runtime sends SIGTERM to that first process (from outside the namespace)
    inits = [int(p) for proc in procs.values() for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text()
             .split()]  # fmt: skip
    try:
        for init in inits:
            os.kill(init, signal.SIGTERM)
        ended = {armed: proc.communicate(timeout=60) for armed, proc in procs.items()}
    finally:  # a namespace whose first process is SIGKILLed is ended whole
        _cleanup(inits)
    # THEN the job takes it in its handler, or runs on where it has none (the kernel drops it for PID 1), armed as
    # unarmed: blackbox run passes on to the job alone what it has a handler for, and the recorder of a job with
    # none drops what blackbox run passed on from pid 1
    for armed, (out, err) in ended.items():
        assert (procs[armed].returncode, out) == (status, said), (armed, err[-2000:])
    # AND the bundle of a Python job with no handler says the SIGTERM was dropped, not that a handler took it
    if kind == "no handler":
        summary = next((tmp_path / "run").glob("run-*/bundle/summary.md")).read_text()
        assert "**The job exited cleanly.**" in summary and "SIGTERM at " in summary, summary[:3000]
        assert "was dropped (no handler; the kernel spares its PID namespace's first process" in summary


LEAVER = """\
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3); print('left', flush=True)"])
print("done", flush=True)
"""


@pytest.mark.skipif(not _unshare_works(), reason="no PID namespace can be made here (unshare -fp)")
def test_what_a_pid_namespaces_first_process_left_ends_with_it(tmp_path: Path) -> None:
    # GIVEN a job, a container's first process, that leaves a process running as it exits, unarmed and under
    # `blackbox run` (then blackbox run is PID 1)
    (tmp_path / "job.py").write_text(LEAVER)
    ended = {}
    for armed in (False, True):
        job = [sys.executable, str(tmp_path / "job.py")]
        cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--", *job] if armed else job
        # WHEN the job exits
        proc = subprocess.run(["unshare", "-fp", "--mount-proc", *cmd], env=ENV, capture_output=True, text=True,
                              timeout=60)  # fmt: skip
        ended[armed] = (proc.returncode, proc.stdout)
    # THEN what it left dies with it at once (the kernel SIGKILLs the rest of a namespace whose first process
    # ends), armed as unarmed: blackbox run, PID 1 there, does not give it 10 s to end by itself (it said "left")
    assert ended[False] == ended[True] == (0, "done\n"), ended


@pytest.mark.skipif(shutil.which("timeout") is None, reason="coreutils timeout is not installed")
@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_ctrl_c_reaches_a_job_that_made_a_group_of_its_own(tmp_path: Path, armed: bool) -> None:
    # GIVEN `timeout 120 python worker.py` run in the foreground by a shell with job control, on a terminal
    # (timeout moves into a process group of its own, with python: not the terminal's foreground group armed)
    (tmp_path / "worker.py").write_text(WORKER)
    marks = tmp_path / "up"
    job = ["timeout", "120", sys.executable, str(tmp_path / "worker.py"), str(marks)]
    cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--", *job] if armed else job
    pid, master = pty.fork()
    if pid == 0:
        os.execve(str(shutil.which("bash")), ["bash", "-c", f"set -m; {shlex.join(cmd)}; echo ended-$?"], ENV)
    pids = _pids(marks, 1)
    try:
        # WHEN Ctrl-C is typed
        typed = time.monotonic()
        os.write(master, b"\x03")
        text = _read_until(master, None).decode(errors="replace")  # until the terminal's last process ended
        os.waitpid(pid, 0)
        # THEN python ends at once with its KeyboardInterrupt, armed as unarmed (armed it ran on: the SIGINT
        # reached blackbox run's group alone, and nothing passed it on, until timeout's own 120 s); bash, which
        # waited for a job that died of SIGINT, ends by it too (its echo never runs), armed as unarmed
        assert time.monotonic() - typed < 20 and "KeyboardInterrupt" in text and "ended-" not in text, text
        assert _left_after(pids) == []
    finally:
        _cleanup(pids)


def _tree(root: int) -> list[int]:
    """``root`` and every process below it (blackbox run's witnesses among them), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                ppid = int((entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[1])
                parents.setdefault(ppid, []).append(int(entry.name))
    out, todo = [root], [root]
    while todo:
        for child in parents.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _timeout_job(tmp_path: Path, armed: bool) -> tuple[subprocess.Popen[str], list[int]]:
    """`timeout 120 python worker.py`, under `blackbox run` or not, in a session of its own; and python's pid."""
    (tmp_path / "worker.py").write_text(WORKER)
    marks = tmp_path / "up"
    job = ["timeout", "120", sys.executable, str(tmp_path / "worker.py"), str(marks)]
    cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--", *job] if armed else job
    proc = subprocess.Popen(cmd, env=ENV, start_new_session=True, stderr=subprocess.PIPE, text=True)
    return proc, _pids(marks, 1)


@pytest.mark.skipif(shutil.which("timeout") is None, reason="coreutils timeout is not installed")
@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_kill_int_of_the_group_reaches_a_job_that_made_a_group_of_its_own(tmp_path: Path, armed: bool) -> None:
    # GIVEN `timeout 120 python worker.py` started as an interactive shell starts a job (a group of its own:
    # unarmed timeout leads it; armed blackbox run does, and timeout moves into a group of its own, with python)
    proc, pids = _timeout_job(tmp_path, armed)
    try:
        # WHEN a process sends SIGINT to the job's group (`kill -INT -PGID`)
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        # THEN python ends at once with its KeyboardInterrupt, armed as unarmed (armed it ran on until timeout's
        # own 120 s: the signal reached blackbox run's group alone and was not passed on)
        assert time.monotonic() - sent < 20 and "KeyboardInterrupt" in err, err[-2000:]
        assert proc.returncode == -signal.SIGINT and _left_after(pids) == [], err[-2000:]  # (timeout dies of it)
    finally:
        _cleanup(pids)


@pytest.mark.skipif(shutil.which("timeout") is None, reason="coreutils timeout is not installed")
def test_a_signal_sent_to_every_process_is_not_passed_on_to_a_moved_group(tmp_path: Path) -> None:
    # GIVEN the same job under blackbox run (timeout in a group of its own)
    proc, pids = _timeout_job(tmp_path, armed=True)
    try:
        # WHEN a sender signals every process of it, one by one (Slurm's proctrack/linuxproc, systemd)
        every = _tree(proc.pid)
        assert len(every) >= 5, every  # blackbox run, its two witnesses, timeout, python
        for pid in every:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        # THEN the job ends of it and blackbox run passed nothing on: the moved group had it already
        assert "KeyboardInterrupt" in err and _left_after(pids) == [], err[-2000:]
        relayed = list((tmp_path / "run").glob("run-*/rings/relayed.jsonl"))
        assert all(p.read_text() == "" for p in relayed), [p.read_text() for p in relayed]
    finally:
        _cleanup(pids)


PIPELINE = """\
#!/bin/bash
{py} {worker} {marks} | {py} {worker} {marks}
echo done
"""


@pytest.mark.skipif(shutil.which("timeout") is None, reason="coreutils timeout is not installed")
@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_timeout_kill_ends_every_process_of_a_pipeline_script(tmp_path: Path, armed: bool) -> None:
    # GIVEN a train.sh that runs a pipeline of two Python processes, under `timeout -s KILL`
    (tmp_path / "worker.py").write_text(WORKER)
    marks = tmp_path / "up"
    script = tmp_path / "train.sh"
    script.write_text(PIPELINE.format(py=sys.executable, worker=tmp_path / "worker.py", marks=marks))
    script.chmod(0o755)
    run = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--"] if armed else []
    proc = subprocess.Popen(["timeout", "-s", "KILL", "120", *run, str(script)], env=ENV, stderr=subprocess.DEVNULL)
    pids = _pids(marks, 2)
    try:
        # WHEN timeout's SIGKILL goes to its process group (SIGALRM: timeout's timer ran out, now)
        os.kill(proc.pid, signal.SIGALRM)
        proc.wait(timeout=60)
        # THEN both Python processes of the pipeline are gone, armed as unarmed
        assert proc.returncode == -signal.SIGKILL  # timeout is in its group too
        assert _left_after(pids) == []
    finally:
        _cleanup(pids)


TICKS = "import time\nfor i in range(12):\n    print('tick', i, flush=True)\n    time.sleep(0.1)\n"


@pytest.mark.parametrize("armed", [False, True], ids=["unarmed", "armed"])
def test_ctrl_z_stops_the_job_and_fg_goes_on(tmp_path: Path, armed: bool) -> None:
    # GIVEN a job run in the foreground by a shell with job control, on a terminal
    job = [sys.executable, "-c", TICKS]
    cmd = [*BLACKBOX, "--dir", str(tmp_path / "run"), "--", *job] if armed else job
    script = f"set -m; {shlex.join(cmd)}; echo stopped-with-$?; sleep 0.5; echo resuming; fg; echo ended-$?"
    pid, master = pty.fork()
    if pid == 0:
        os.execve(str(shutil.which("bash")), ["bash", "-c", script], ENV)
    out = _read_until(master, b"tick 3")
    # WHEN Ctrl-Z is typed, and the shell later brings the job back (fg)
    os.write(master, b"\x1a")
    out += _read_until(master, None)
    os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    # THEN the job stopped (the shell saw 128 + SIGTSTP), wrote nothing while stopped, then ended its work
    assert "stopped-with-148" in text, text
    stopped = text.split("stopped-with-148", 1)[1].split("resuming", 1)[0]
    assert "tick" not in stopped, text
    assert "tick 11" in text and "ended-0" in text, text


def _read_until(fd: int, mark: bytes | None) -> bytes:
    out, deadline = b"", time.monotonic() + 60
    while time.monotonic() < deadline and (mark is None or mark not in out):
        if select.select([fd], [], [], 0.1)[0]:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the terminal's last process has ended
                break
            if not chunk:
                break
            out += chunk
    return out
