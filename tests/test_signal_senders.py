"""A signal's headline names the signal and where it came from: ``kill -INT`` by its sender, a terminal's Ctrl-C
as the kernel's (the verdict read "interrupted (Ctrl-C or SIGINT)" for both, though the ring held the sender); a
job ended by a signal, by its name (it read "was ended by a signal" where no sender was recorded: SIGQUIT)."""

from __future__ import annotations

import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

JOB = """
import sys, time
if len(sys.argv) > 1:
    import blackbox
    blackbox.arm(sys.argv[1] + "/")
print("ready", flush=True)
for step in range(600):
    if len(sys.argv) > 1:
        blackbox.step(step)
    time.sleep(0.05)
"""


def _start(tmp_path: Path, script: str, *args: str, armed: bool = True) -> subprocess.Popen[str]:
    """The job (under `blackbox run`, into tmp_path/runs, where ``armed``), once it says "ready"."""
    run = [sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "runs"), "--quiet", "--"]
    (tmp_path / "train.py").write_text(script)
    proc = subprocess.Popen([*(run if armed else []), sys.executable, str(tmp_path / "train.py"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def _job_pid(proc: subprocess.Popen[str], tmp_path: Path) -> int:
    """The job's own python under `blackbox run` (the launcher's child that runs it, beside a witness)."""
    kids = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    job = bytes(tmp_path / "train.py")
    return next(int(k) for k in kids if Path(f"/proc/{k}/cmdline").read_bytes().split(b"\0")[1:2] == [job])


@pytest.mark.slow
@pytest.mark.parametrize("launch", ["unarmed", "blackbox run"])
def test_kill_int_names_its_sender_and_the_job_ends_as_unarmed(tmp_path: Path, launch: str) -> None:
    # GIVEN a job (unarmed, or under `blackbox run`) that a known process, a shell, interrupts
    proc = _start(tmp_path, JOB, armed=launch == "blackbox run")
    target = _job_pid(proc, tmp_path) if launch == "blackbox run" else proc.pid
    sender = subprocess.Popen(["sh", "-c", f"kill -INT {target}; sleep 1"])  # it outlives its signal: named
    assert sender.wait(timeout=30) == 0
    _, err = proc.communicate(timeout=120)
    # THEN it ends as unarmed: KeyboardInterrupt's traceback, then death by SIGINT (Python re-raises it at exit)
    assert proc.returncode == -signal.SIGINT and "KeyboardInterrupt" in err, err[-2000:]
    if launch == "unarmed":
        return
    # AND the verdict names the sender, by name and pid, in the headline and the evidence
    (bundle,) = (tmp_path / "runs").glob("run-*/bundle")
    death = json.loads((bundle / "metadata.json").read_text())["death"]
    assert death["cause"] == "interrupted" and death["headline"] == "The job was interrupted by SIGINT from sh."
    assert (death["killed_by"]["sender"], death["killed_by"]["sender_pid"]) == ("sh", sender.pid), death
    assert f"raised by SIGINT from sh (pid {sender.pid})" in " ".join(death["evidence"]), death["evidence"]


@pytest.mark.slow
def test_a_terminals_ctrl_c_is_told_as_the_kernels_with_no_sender(tmp_path: Path) -> None:
    # GIVEN an armed job in the foreground of a terminal (a pty), and Ctrl-C typed there
    job = tmp_path / "train.py"
    job.write_text(JOB)
    pid, fd = pty.fork()
    if pid == 0:  # the child: a session leader whose controlling terminal is the pty
        os.environ["PYTHONPATH"] = str(REPO)
        os.execv(sys.executable, [sys.executable, str(job), str(tmp_path / "rings")])
    seen, deadline = b"", time.monotonic() + 60
    while b"ready" not in seen and time.monotonic() < deadline:
        if select.select([fd], [], [], 1)[0]:
            seen += os.read(fd, 1024)
    assert b"ready" in seen, seen
    time.sleep(0.3)
    os.write(fd, b"\x03")
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGINT, status
    # THEN the verdict says the kernel sent it (a terminal's Ctrl-C), and names no process as its sender
    done = subprocess.run([sys.executable, "-m", "blackbox", "recover", str(tmp_path / "rings"), "-o",
                           str(tmp_path / "bundle")], capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert done.returncode == 0, done.stderr
    death = json.loads((tmp_path / "bundle" / "metadata.json").read_text())["death"]
    assert death["cause"] == "interrupted" and death["killed_by"] is None, death
    assert "raised by SIGINT from the kernel (a terminal's Ctrl-C)" in " ".join(death["evidence"]), death["evidence"]
    assert death["headline"] == "The job was interrupted (Ctrl-C or SIGINT)."


ENDS = """
import os, signal, sys, time, blackbox
for i in range(5):
    blackbox.step(i)
    time.sleep(0.05)
print("ready", flush=True)
if sys.argv[1] == "SIGQUIT":
    os.kill(os.getpid(), signal.SIGQUIT)  # recorded (its default action in force), itself its sender
time.sleep(60)
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGQUIT", "SIGUSR1"])
def test_a_job_ended_by_a_signal_is_told_by_that_signals_name(tmp_path: Path, name: str) -> None:
    # GIVEN a job under `blackbox run` ended by SIGQUIT it sends itself, or by SIGUSR1 from /bin/kill
    proc = _start(tmp_path, ENDS, name)
    sender = None
    if name == "SIGUSR1":
        # /bin/kill is gone at once: named by its pid, or by its name
        sender = subprocess.Popen(["/bin/kill", "-USR1", str(_job_pid(proc, tmp_path))])
        assert sender.wait(timeout=30) == 0
    proc.communicate(timeout=120)
    assert proc.returncode == -getattr(signal, name)  # as unarmed: the signal's default action
    # THEN the headline names the signal (and its sender, where one was recorded)
    (bundle,) = (tmp_path / "runs").glob("run-*/bundle")
    death = json.loads((bundle / "metadata.json").read_text())["death"]
    assert death["cause"] == "signal", death
    ends = [f"{name} from kill.", f"{name} from pid {sender.pid}."] if sender else [f"{name}, which it sent itself."]
    assert any(death["headline"].endswith(f") was ended by {end}") for end in ends), death["headline"]


@pytest.mark.slow
def test_a_signal_a_relay_passed_on_names_the_relay_as_one(tmp_path: Path) -> None:
    # GIVEN a job started through a program that passes signals on (`docker run --init`'s tini), run bare and under
    # `blackbox run`, and a SIGTERM sent to that program (as `docker stop` sends it to the container's first process)
    if shutil.which("tini") is None:
        pytest.skip("tini is not installed (CI installs it: tools/ci_packages.sh)")
    (tmp_path / "train.py").write_text("import numpy\n" + JOB)  # (a job's python under a program arms at numpy)
    ended = {}
    for armed in (False, True):
        run = [sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "runs"), "--quiet", "--"]
        job = ["tini", "-s", "--", sys.executable, str(tmp_path / "train.py")]
        proc = subprocess.Popen([*(run if armed else []), *job],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        tini = proc.pid if not armed else next(
            int(k) for k in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
            if Path(f"/proc/{k}/comm").read_text().strip() == "tini")  # fmt: skip
        os.kill(tini, signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        ended[armed] = (proc.returncode, out)
    # THEN the job ends as it does bare
    assert ended[True] == ended[False] and ended[False][0] == 128 + signal.SIGTERM, ended
    # AND tini is named as what passed the signal on, not as who ended the job (it read "ended by SIGTERM from tini.")
    (run_dir,) = (tmp_path / "runs").glob("run-*")
    death = json.loads((run_dir / "bundle" / "metadata.json").read_text())["death"]
    said = ("was ended by SIGTERM from tini (a container's init, passing on a signal it got: `docker stop`, a pod's "
            "deletion; who sent it is not recorded).")
    assert death["cause"] == "signal" and said in death["headline"], death["headline"]
