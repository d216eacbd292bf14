"""Rings of one process that replaced its program (exec): the same owner, host, boot, pid and start time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

import blackbox
from blackbox.recovery.pipeline import exec_successors


def _ident(pid: int, ticks: int | None, argv: list[str], uid: int = 1000) -> dict[str, Any]:
    return {"host": "h", "boot_id": "b", "pid_ns": "pid:[1]", "pid": pid, "start_ticks": ticks, "argv": argv,
            "_uid": uid}


def test_a_later_ring_of_the_same_process_is_what_it_execd() -> None:
    a, b, c = Path("launch.ring"), Path("train.ring"), Path("again.ring")
    idents = {b: (_ident(7, 500, ["train.py", "6"]), 20), a: (_ident(7, 500, ["launch.py"]), 10),
              c: (_ident(7, 500, ["train.py", "--resume"]), 30)}  # fmt: skip
    assert exec_successors(idents) == {a: "train.py 6", b: "train.py --resume"}


def test_a_pid_used_again_another_owner_or_container_or_no_start_time_is_no_exec() -> None:
    first, reused, planted, old, boxed = (Path(f"{n}.ring") for n in range(5))
    idents = {first: (_ident(7, 500, ["train.py"]), 10), reused: (_ident(7, 900, ["other.py"]), 20),
              planted: (_ident(7, 500, ["evil.py"], uid=1001), 30), old: (_ident(8, None, ["x.py"]), 5),
              boxed: ({**_ident(7, 500, ["rank1.py"]), "pid_ns": "pid:[2]"}, 40)}  # fmt: skip
    assert exec_successors(idents) == {}


# An armed process that replaces itself (arm() alone, no `blackbox run` to arm what it becomes)
EXEC_JOB = """
import os, sys, blackbox
blackbox.arm(sys.argv[1])
for n in range(4):
    blackbox.step(n)
how = sys.argv[2]
if how == "execvp":  # a search through PATH: its first directories fail, then sh is found
    os.environ["PATH"] = "/nonexistent-a:/nonexistent-b:" + os.environ["PATH"]
    os.execvp("sh", ["sh", "-c", "echo replaced; exit 3"])
if how == "failed":  # an exec that fails, which the job catches and goes on from, then raises
    try:
        os.execv("/nonexistent/program", ["program"])
    except OSError:
        print("exec failed", flush=True)
    raise ValueError("after the failed exec")  # RAISED
if how == "child":  # a forked child that execs (the parent's mapping is its too), then the parent is killed
    pid = os.fork()
    if pid == 0:
        os.execv("/bin/sh", ["sh", "-c", "exit 0"])
    os.waitpid(pid, 0)
    os.kill(os.getpid(), 9)
os.execv("/bin/sh", ["sh", "-c", "echo replaced; exit 3"])
"""
RAISED = EXEC_JOB.splitlines().index('    raise ValueError("after the failed exec")  # RAISED') + 1



def _exec_job(tmp_path: Path, how: str, armed: bool) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    ring = tmp_path / f"{how}-{armed}.ring"
    code = EXEC_JOB if armed else EXEC_JOB.replace("blackbox.arm(sys.argv[1])", "").replace("blackbox.step(n)", "n")
    proc = subprocess.run([sys.executable, "-c", code, str(ring), how], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    if not armed:
        return proc, {}
    bundle = blackbox.recover(ring, tmp_path / f"{how}-bundle")
    return proc, json.loads((bundle / "metadata.json").read_text())["death"]


@pytest.mark.parametrize("how", ["execv", "execvp"])
def test_an_armed_process_that_execs_is_told_as_replaced_not_killed(tmp_path: Path, how: str) -> None:
    # GIVEN a process that arm()s, steps, and replaces itself with a shell (os.execv; os.execvp through PATH)
    plain, _ = _exec_job(tmp_path, how, armed=False)
    proc, death = _exec_job(tmp_path, how, armed=True)
    # THEN it ran as unarmed, and its ring, with no clean end, is told as the exec it was (before: "killed with
    # SIGKILL; no handler ran"), naming the program
    assert (proc.returncode, proc.stdout) == (plain.returncode, plain.stdout) == (3, "replaced\n"), proc.stderr
    assert death["cause"] == "clean_exit" and death["step"] == 3, death
    assert "replaced itself with `sh -c echo replaced; exit 3` (exec)" in death["headline"], death


@pytest.mark.parametrize("how", ["failed", "child"])
def test_an_exec_that_failed_or_a_forked_childs_is_not_the_armed_process_leaving(tmp_path: Path, how: str) -> None:
    # GIVEN an exec that raised (the job caught it, then died of a ValueError), or a forked child's exec (the
    # parent then SIGKILLed)
    plain, _ = _exec_job(tmp_path, how, armed=False)
    proc, death = _exec_job(tmp_path, how, armed=True)
    assert (proc.returncode, proc.stdout) == (plain.returncode, plain.stdout), (proc.stderr, plain.stderr)
    # THEN the death is the process's own: its exception, or the SIGKILL, never an exec
    assert death["cause"] == ("exception" if how == "failed" else "killed"), death
    told = death["headline"].split(': "')[0]  # (the exception's message, quoted after, is the job's own words)
    assert "exec" not in told, death
    if how == "failed":
        assert death["headline"] == (f"The job died of an uncaught ValueError at <module> (<string>:{RAISED}): "
                                     '"after the failed exec".')  # fmt: skip


def test_an_exec_whose_program_fails_is_told_by_that_programs_status(tmp_path: Path) -> None:
    # GIVEN a job's own process that execs a shell which exits 3 (`blackbox run` sees the status)
    code = "import numpy, os; os.execv('/bin/sh', ['sh', '-c', 'exit 3'])"
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path), "--",
                           sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    (run,) = tmp_path.glob("run-*")
    death = json.loads((run / "bundle" / "metadata.json").read_text())["death"]
    # THEN the end is that status (not "replaced itself ... it went on there", a clean exit), the exec in evidence
    assert (death["cause"], death["exit_status"]) == ("nonzero_exit", 3), death
    assert any("replaced itself (exec) with `sh -c exit 3`" in e for e in death["evidence"]), death["evidence"]


TICKS = """
import os, signal, sys, time
if sys.argv[1] == "armed":
    import blackbox
    blackbox.arm(sys.argv[2])
class Tick(Exception):
    pass
fired = caught = 0
inside = False
def on_alarm(signum, frame):
    global fired, inside
    if inside:  # (raised only inside attempt(), which the loop's try wraps whole; once an attempt, so that a
        inside = False  # handler run nested in this one, at its first line, raises the one Tick counted)
        fired += 1
        raise Tick()
def attempt():
    global inside
    inside = True
    try:
        os.execv("/nonexistent/program", ["program"])
    except OSError:
        pass
    finally:
        inside = False
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)
end = time.monotonic() + 1.5
while time.monotonic() < end:
    try:
        attempt()
    except Tick:
        caught += 1
signal.setitimer(signal.ITIMER_REAL, 0)
print(fired, caught)
"""


def test_a_signal_handlers_exception_during_an_exec_reaches_the_job(tmp_path: Path) -> None:
    # GIVEN a job whose SIGALRM handler raises, often, while it calls os.execv in vain (each call: two marks)
    counts = []
    for mode in ("unarmed", "armed"):
        proc = subprocess.run([sys.executable, "-c", TICKS, mode, str(tmp_path / "r.ring")], capture_output=True,
                              text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-1000:]
        fired, caught = map(int, proc.stdout.split())
        counts.append((fired, caught))
    # THEN every exception the handler raised reached the job, armed as unarmed (the wrapper once kept some);
    # armed, the wrapper's Python code gives the handler many chances (unarmed, the builtin gives it few)
    assert all(fired == caught for fired, caught in counts) and counts[1][0] > 100, counts


def test_os_exec_wrapped_still_pickles_and_binds_as_the_builtin(tmp_path: Path) -> None:
    code = f"""
import os, pickle, blackbox
blackbox.arm({str(tmp_path / 'r.ring')!r})
assert type(os.execv).__name__ != "builtin_function_or_method"  # (ours is in place)
assert pickle.loads(pickle.dumps(os.execv)) is os.execv and pickle.loads(pickle.dumps(os.execve)) is os.execve
class Job:
    run = os.execv
assert Job().run is os.execv  # as the builtin: no method binding, no instance passed as the path
blackbox.disarm()
assert type(os.execv).__name__ == "builtin_function_or_method"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert proc.stdout == "ok\n", proc.stderr[-1500:]
