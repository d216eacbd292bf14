"""`blackbox run`: any Python job armed with no code change, recovered and diagnosed after it dies, and
run exactly as it would run without us (status, stdout, signals, its own environment)."""

from __future__ import annotations

import contextlib
import json
import os
import pty
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

LEAKY_SCRIPT = """\
import time
kept = []
for step in range(100000):
    kept.append(bytearray(4 << 20))   # an unmodified script that leaks 4 MiB a step
    time.sleep(0.005)
"""
BLACKBOX = [sys.executable, "-m", "blackbox", "run"]
ENV = dict(os.environ, PYTHONPATH=str(REPO))


def blackbox_run(work: Path, *cmd: str, preexec_fn=None, env=None, stdin=None) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    """Run through a shell, which prints the status as a shell reports it (128 + n for signal n)."""
    return subprocess.run(
        ["sh", "-c", '"$@"; echo "shell-status=$?" >&2', "sh", *BLACKBOX, "--dir", str(work), "--", *cmd],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        preexec_fn=preexec_fn,
        env=env or ENV,
        stdin=stdin,
    )


def shell_status(proc: subprocess.CompletedProcess[str]) -> int:
    return int(proc.stderr.rsplit("shell-status=", 1)[1].split()[0])


def run_folder(work: Path) -> Path:
    (folder,) = work.glob("run-*")
    return folder


def _meta(work: Path) -> dict:  # type: ignore[type-arg]
    return json.loads((run_folder(work) / "bundle" / "metadata.json").read_text())


@pytest.mark.slow
def test_run_around_a_script_the_kernel_oom_kills(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    cg = memory_cgroup(300 << 20)
    script = tmp_path / "train.py"
    script.write_text(LEAKY_SCRIPT)
    proc = blackbox_run(tmp_path / "run", sys.executable, str(script), preexec_fn=cg.join)
    assert shell_status(proc) == 137, proc.stderr  # 128 + SIGKILL, as a shell reports it
    meta = _meta(tmp_path / "run")
    assert meta["death"]["cause"] == "host_oom_kill", meta["death"]
    assert "host_oom_kill" in proc.stderr and "exit status 137" in proc.stderr and proc.stdout == ""
    bundle = run_folder(tmp_path / "run") / "bundle"
    assert (bundle / "timeline.parquet").exists()
    png = bundle / "memory.png"
    if os.environ.get("BLACKBOX_KEEP_PLOT"):  # to look at it: BLACKBOX_KEEP_PLOT=/some/file.png
        shutil.copyfile(png, os.environ["BLACKBOX_KEEP_PLOT"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


@pytest.mark.parametrize(
    "code,status",
    [
        ("raise SystemExit(3)", 3),
        ("import os, signal; signal.signal(signal.SIGTERM, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGTERM)", 143),
        ("raise RuntimeError('boom')", 1),
        ("import os; os.kill(os.getpid(), 9)", 137),
    ],
    ids=["exit-3", "sigterm", "exception", "sigkill"],
)
@pytest.mark.slow
def test_run_ends_as_the_job_ended(tmp_path: Path, code: str, status: int) -> None:
    unarmed = subprocess.run(["sh", "-c", '"$@"; echo "shell-status=$?" >&2', "sh", sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    armed = blackbox_run(tmp_path / "run", sys.executable, "-c", code)
    assert shell_status(armed) == shell_status(unarmed) == status, armed.stderr
    direct = subprocess.run([*BLACKBOX, "--dir", str(tmp_path / "d"), "--", sys.executable, "-c", code],
                            capture_output=True, timeout=60, env=ENV)  # fmt: skip
    assert direct.returncode == (status if status < 128 else -(status - 128))  # killed by the job's signal


def test_stdout_is_the_jobs_alone(tmp_path: Path) -> None:
    code = "import json; print(json.dumps({'loss': [1.5, 0.75]}))"
    proc = blackbox_run(tmp_path / "run", sys.executable, "-c", code)
    assert shell_status(proc) == 0 and json.loads(proc.stdout) == {"loss": [1.5, 0.75]}
    assert "# blackbox:" in proc.stderr  # the summary went to stderr


@pytest.mark.slow
def test_the_launcher_stays_small_while_the_job_runs(tmp_path: Path) -> None:
    # GIVEN a job that says it is up and then sleeps
    code = "import time; print('up', flush=True); time.sleep(2)"
    launcher = subprocess.Popen([*BLACKBOX, "--dir", str(tmp_path / "run"), "--", sys.executable, "-c", code],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)  # fmt: skip
    assert launcher.stdout is not None and launcher.stdout.readline().strip() == "up"
    # WHEN the launcher is looked at while the job runs
    maps = Path(f"/proc/{launcher.pid}/maps").read_text()
    rss_kib = int(next(line for line in Path(f"/proc/{launcher.pid}/status").read_text().splitlines()
                       if line.startswith("VmRSS")).split()[1])  # fmt: skip
    _, err = launcher.communicate(timeout=120)
    # THEN it has loaded nothing of the recovery's (Arrow, Parquet) yet: that waits for the job's end
    assert "libarrow" not in maps and "libparquet" not in maps, [m for m in maps.splitlines() if "arrow" in m][:3]
    assert rss_kib < 60 << 10, rss_kib
    assert launcher.returncode == 0 and "cause: clean_exit" in err


@pytest.mark.slow
def test_reusing_dir_never_merges_an_earlier_runs_rings(tmp_path: Path) -> None:
    for k in range(2):
        blackbox_run(tmp_path / "d", sys.executable, "-c", f"print({k})")
    metas = [json.loads((f / "bundle" / "metadata.json").read_text()) for f in sorted((tmp_path / "d").glob("run-*"))]
    assert len(metas) == 2 and all("rings" not in m for m in metas)  # one ring each
    assert {stat.S_IMODE((f).stat().st_mode) for f in (tmp_path / "d").glob("run-*")} == {0o700}


def test_exit_status_survives_a_recovery_that_fails(tmp_path: Path) -> None:
    # the job leaves a file where the bundle folder must go: recovery cannot write it
    code = (
        "import os, pathlib; p = pathlib.Path(os.environ['BLACKBOX_DIR']).parent / 'bundle'; p.write_text('x')\n"
        "raise SystemExit(5)"
    )
    proc = blackbox_run(tmp_path / "run", sys.executable, "-c", code)
    assert shell_status(proc) == 5 and "recovery failed" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_run_chains_the_jobs_own_sitecustomize(tmp_path: Path) -> None:
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.JOB_SITE = 'ran'\n")
    env = {"PYTHONPATH": str(own), "PATH": "/usr/bin:/bin"}
    code = "import builtins, blackbox; print(builtins.JOB_SITE, blackbox.active().armed)"
    proc = blackbox_run(tmp_path / "run", sys.executable, "-c", code, env=dict(env, PYTHONPATH=f"{own}:{REPO}"))
    assert shell_status(proc) == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "ran True"


def test_only_blackbox_is_put_on_the_jobs_path(tmp_path: Path) -> None:
    # GIVEN a job in its own environment, without numpy or torch (blackbox's venv has both)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    code = (
        "import importlib.util as u, sys\n"
        "print('numpy', u.find_spec('numpy') is not None, 'torch', u.find_spec('torch') is not None)\n"
        "raise SystemExit(4)\n"
    )
    unarmed = subprocess.run([str(venv / "bin/python"), "-c", code], capture_output=True, text=True, timeout=60)
    proc = blackbox_run(tmp_path / "run", str(venv / "bin/python"), "-c", code)
    # THEN it sees its own environment, runs unarmed after one line saying why, and its status is reported
    assert proc.stdout == unarmed.stdout == "numpy False torch False\n"
    assert shell_status(proc) == 4 and proc.stderr.count("blackbox: not armed") == 1
    assert "left no ring" in proc.stderr


def test_run_of_a_non_python_command_says_so_and_keeps_its_status(tmp_path: Path) -> None:
    proc = blackbox_run(tmp_path / "run", "sh", "-c", "exit 7")
    assert shell_status(proc) == 7 and "left no ring" in proc.stderr


def test_run_of_a_missing_command_is_127_as_in_a_shell(tmp_path: Path) -> None:
    proc = blackbox_run(tmp_path / "run", "no-such-command-anywhere")
    assert shell_status(proc) == 127 and "cannot start" in proc.stderr


def test_run_without_a_command_is_one_line_error(tmp_path: Path) -> None:
    proc = blackbox_run(tmp_path / "run")
    assert shell_status(proc) == 1 and "expected a command" in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------ signals reach the job exactly once
COUNTER = """
import os, signal, sys, time
got = []
for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1):
    signal.signal(s, lambda n, f: got.append(n))
open(sys.argv[1], "w").write(str(os.getpid()))
t = time.time()
while time.time() - t < 20 and not got:
    time.sleep(0.01)
time.sleep(0.5)  # a duplicate would arrive now
print("got", sorted(got), flush=True)
"""


def _start(tmp_path: Path, *cmd: str, **kw) -> tuple[subprocess.Popen[str], int]:  # type: ignore[no-untyped-def]
    ready = tmp_path / "pid"
    proc = subprocess.Popen(
        [*BLACKBOX, "--dir", str(tmp_path / "run"), "--quiet", "--", *cmd, str(ready)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV, **kw)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    return proc, int(ready.read_text())


@pytest.mark.parametrize(
    "how",
    ["pid", "group", "pid-sigint"],
    ids=["SIGTERM to blackbox run's pid", "SIGTERM to its process group", "SIGINT to its pid"],
)
@pytest.mark.slow
def test_a_signal_reaches_the_job_exactly_once(tmp_path: Path, how: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(COUNTER)
    proc, _ = _start(tmp_path, sys.executable, str(script), start_new_session=True)
    sig = signal.SIGINT if how == "pid-sigint" else signal.SIGTERM
    if how == "group":
        os.killpg(proc.pid, sig)  # Slurm, `timeout`: the whole group blackbox run was started in
    else:
        os.kill(proc.pid, sig)
    out, err = proc.communicate(timeout=30)
    assert out.strip() == f"got [{int(sig)}]", err
    assert proc.returncode == 0


# blackbox run's relay, driven by hand: the job (a child counting SIGUSR1) in our group, the signal taken from
# our pid before its copy sent to the group came (as `timeout`'s two come, when blackbox run wakes between them)
RELAY_TWICE = """\
import os, signal, sys
from pathlib import Path
from blackbox.run.launcher import FORWARDED, Relayer, _sigtimedwait
from blackbox.run.witness import Witness
signal.pthread_sigmask(signal.SIG_BLOCK, set(FORWARDED))
relayer = Relayer(Path(sys.argv[1]), Witness(FORWARDED), Witness(FORWARDED, own_group=True))
up_r, up_w = os.pipe()
end_r, end_w = os.pipe()
job = os.fork()
if job == 0:
    got = []
    signal.signal(signal.SIGUSR1, lambda *_: got.append(1))
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    os.close(end_w)
    os.write(up_w, b"u")
    os.read(end_r, 1)
    os._exit(len(got))
os.read(up_r, 1)
relayer.job = job
os.kill(os.getpid(), signal.SIGUSR1)
taken = signal.sigtimedwait({signal.SIGUSR1}, 5)
os.killpg(0, signal.SIGUSR1)
relayer.relay(taken)
while (info := _sigtimedwait(set(FORWARDED), 0.5)) is not None:
    relayer.relay(info)
os.close(end_w)
print("job got", os.waitstatus_to_exitcode(os.waitpid(job, 0)[1]))
relayer.close()
"""


def test_a_signal_sent_to_our_pid_then_our_group_reaches_the_job_once(tmp_path: Path) -> None:
    # GIVEN blackbox run's relay with its witnesses, the job's process in its group, and SIGUSR1 sent to blackbox
    # run's pid, taken, then sent to the group (which reaches the job directly, and blackbox run once more)
    # WHEN blackbox run passes on what it got
    done = subprocess.run([sys.executable, "-c", RELAY_TWICE, str(tmp_path)], capture_output=True, text=True,
                          env=ENV, timeout=60, start_new_session=True)  # fmt: skip
    # THEN the job got it once, as unarmed both reach it before its handler runs (it got the group's copy, then
    # blackbox run's second copy passed on: twice)
    assert done.stdout.strip() == "job got 1", done.stderr


def test_slurmstepd_signalling_every_process_is_not_relayed_again(tmp_path: Path) -> None:
    # A sender named slurmstepd that signals every process of the step itself (proctrack/linuxproc: the whole
    # tree below it, deepest first, blackbox run's witness included): blackbox run must not add one.
    script = tmp_path / "job.py"
    script.write_text(COUNTER)
    proc, job_pid = _start(tmp_path, sys.executable, str(script))
    fake = tmp_path / "slurmstepd"
    shutil.copy(sys.executable, fake)
    kill_tree = (
        "import os\n"
        "def tree(pid):\n"
        "    kids = [int(c) for t in os.listdir(f'/proc/{pid}/task')\n"
        "            for c in open(f'/proc/{pid}/task/{t}/children').read().split()]\n"
        "    return [p for k in kids for p in tree(k)] + [pid]\n"
        f"for p in tree({proc.pid}): os.kill(p, 15)\n"
    )
    subprocess.run([str(fake), "-c", kill_tree], check=True, timeout=30, env={"PYTHONHOME": sys.base_prefix})
    out, err = proc.communicate(timeout=30)
    assert out.strip() == "got [15]", err


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_reaches_the_job_exactly_once(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(COUNTER.replace("time.sleep(0.5)", "time.sleep(0.5); print(input('say: '), flush=True)"))
    ready = tmp_path / "pid"
    pid, master = pty.fork()
    if pid == 0:  # a session whose controlling terminal is the pty: blackbox run in its foreground
        os.execve(sys.executable, [*BLACKBOX, "--dir", str(tmp_path / "run"), "--quiet", "--", sys.executable,
                                   str(script), str(ready)], ENV)  # fmt: skip
    deadline = time.monotonic() + 30
    while not (ready.exists() and ready.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)
    os.write(master, b"\x03")  # Ctrl-C: the terminal signals its foreground process group
    time.sleep(0.3)
    os.write(master, b"typed\n")  # and the job, in the foreground, can still read the terminal
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    _, status = os.waitpid(pid, 0)
    text = out.decode(errors="replace")
    assert "got [2]" in text and "typed" in text.split("say:")[-1], text
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


@pytest.mark.slow
def test_a_signal_after_the_job_ended_changes_neither_status_nor_bundle(tmp_path: Path) -> None:
    # GIVEN a job that exits 3 by itself
    script = tmp_path / "job.py"
    script.write_text("import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\n"
                      "time.sleep(0.3)\nsys.exit(3)\n")  # fmt: skip
    proc, job_pid = _start(tmp_path, sys.executable, str(script))
    while Path(f"/proc/{job_pid}").exists() and proc.poll() is None:
        time.sleep(0.002)
    # WHEN SIGTERMs keep arriving while blackbox run recovers its ring (a scheduler cleaning up)
    while proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        time.sleep(0.01)
    # THEN blackbox run still ends as the job did, with its bundle whole
    proc.communicate(timeout=30)
    assert proc.returncode == 3
    assert (run_folder(tmp_path / "run") / "bundle" / "metadata.json").is_file()


# ------------------------------------------------------------------ paths, leftovers
def test_a_relative_dir_arms_python_children_started_after_a_chdir(tmp_path: Path) -> None:
    # GIVEN `blackbox run --dir rel` from tmp_path, and a job that changes folder, then starts a Python child
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    code = (
        "import os, subprocess, sys\nos.chdir(sys.argv[1])\n"
        "subprocess.run([sys.executable, '-c', 'import numpy, blackbox; print(blackbox.active().armed)'], check=True)\n"
    )
    proc = subprocess.run([*BLACKBOX, "--dir", "rel", "--", sys.executable, "-c", code, str(elsewhere)],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, env=ENV)  # fmt: skip
    # THEN the child armed (its sitecustomize and ring folder are absolute paths) and wrote nowhere else
    assert proc.returncode == 0 and proc.stdout == "True\n", proc.stderr
    (child,) = [json.loads(line) for line in (run_folder(tmp_path / "rel") / "rings" / "folded.jsonl").open()]
    assert child["role"] == "child" and list(elsewhere.iterdir()) == []
    assert _meta(tmp_path / "rel")["helpers"][0]["count"] == 1


@pytest.mark.slow
def test_processes_the_job_left_running_are_named(tmp_path: Path) -> None:
    # GIVEN a job whose worker outlives it: the main process dies (SIGKILL), its worker sleeps on
    code = (
        "import os, subprocess, sys\n"
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)', 'left-behind'],\n"
        "                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "open(sys.argv[1], 'w').write(str(w.pid))\nos.kill(os.getpid(), 9)\n"
    )
    worker = tmp_path / "worker"
    try:
        proc = blackbox_run(tmp_path / "run", sys.executable, "-c", code, str(worker))
        # THEN blackbox run ends as the job did, naming the worker left running, on stderr and in the bundle
        pid = int(worker.read_text())
        assert shell_status(proc) == 137, proc.stderr
        assert "1 process of the job still running after it ended" in proc.stderr
        assert f"pid {pid}: {sys.executable} -c import time; time.sleep(120) left-behind" in proc.stderr
        assert _meta(tmp_path / "run")["left_running"] == [
            {"pid": pid, "command": f"{sys.executable} -c import time; time.sleep(120) left-behind"}
        ]
        assert Path(f"/proc/{pid}").exists()  # named, never signalled
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(worker.read_text()), signal.SIGKILL)
