"""Signals whose default action ends the process and that jobs seldom mean to die of (collect/signals.py,
ENDINGS: SIGQUIT, SIGALRM, SIGXCPU, SIGVTALRM, SIGPROF, SIGPIPE): named as what ended the job, and left alone where the
job handles them.

Each job runs under a shell, as `train.sh` runs it (`python train.py; echo status $?`): the shell, not the
Python process, has the exit status, so the ring alone must say what the process died of. Before these
signals were recorded, every one of them read "killed with SIGKILL; no handler ran".
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.recovery.kinds import of_kind
from blackbox.recovery.pipeline import recover_rings
from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import read_ring
from blackbox.ring.writer import c_writer_module

pytestmark = pytest.mark.skipif(c_writer_module() is None, reason="signals are recorded by the C extension")

ARM = "import blackbox\nblackbox.arm(sys.argv[1], sample_interval=0.05)\n"
ENDS = {  # how the job meets each, at its planted line
    "SIGQUIT": "print('READY', os.getpid(), flush=True)\ntime.sleep(60)",  # the test sends it (as Ctrl-\\ would)
    "SIGXCPU": "resource.setrlimit(resource.RLIMIT_CPU, (1, resource.RLIM_INFINITY))\nwhile True:\n    pass",
    "SIGALRM": "signal.alarm(1)\ntime.sleep(60)",
    # a job that puts SIGPIPE's default action back (as `| head` scripts do), then writes to a pipe nobody reads
    "SIGPIPE": "signal.signal(signal.SIGPIPE, signal.SIG_DFL)\nr, w = os.pipe()\nos.close(r)\nos.write(w, b'x')",
}


def under_a_shell(tmp_path: Path, body: str, armed: bool) -> tuple[str, Path]:
    """Run the job as `python job.py RINGS; echo status $?` under bash (no core file); (bash's output, rings)."""
    rings = tmp_path / ("armed" if armed else "unarmed")
    job = tmp_path / "job.py"
    job.write_text("import os, resource, signal, sys, time\n" + (ARM if armed else "") + body + "\n")
    proc = subprocess.Popen(["bash", "-c", f'ulimit -c 0; "{sys.executable}" "{job}" "{rings}/"; echo "status $?"'],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    if "READY" in body:
        assert proc.stdout is not None
        ready, pid = proc.stdout.readline().split()
        time.sleep(0.3)  # (in its sleep)
        os.kill(int(pid), signal.SIGQUIT)
    out, _ = proc.communicate(timeout=120)
    return out, rings


@pytest.mark.parametrize("name", sorted(ENDS))
def test_a_signal_whose_default_action_ended_the_job_is_named_not_called_sigkill(tmp_path: Path, name: str) -> None:
    # GIVEN a job under a shell that dies of `name` with its default action: sent by this test (SIGQUIT), by
    # the kernel at the CPU-time limit (SIGXCPU) or at an alarm nobody handles (SIGALRM)
    signum = getattr(signal, name)
    plain, _ = under_a_shell(tmp_path, ENDS[name], armed=False)
    armed, rings = under_a_shell(tmp_path, ENDS[name], armed=True)
    # THEN armed as unarmed, the shell sees it die of that signal
    assert plain == armed == f"status {128 + signum}\n", (plain, armed)
    # AND the ring names it, with its sender where one sent it, or what it means where the kernel did
    death = recover_rings([rings]).meta["death"]
    assert death["cause"] == "signal" and name in death["headline"] and "SIGKILL" not in death["headline"], death
    if name == "SIGQUIT":
        assert death["killed_by"]["sender_pid"] == os.getpid(), death["killed_by"]
    elif name == "SIGXCPU":
        assert "CPU-time limit" in death["headline"], death["headline"]
    elif name == "SIGPIPE":  # (it read "killed with SIGKILL; no handler ran")
        assert "a pipe or socket whose reader had gone" in death["headline"], death["headline"]
    else:
        assert "an alarm" in death["headline"], death["headline"]


TIMERS = """
import json, os, signal, sys, time
ARM
counts = {"SIGALRM": 0, "SIGPROF": 0}
def tick(signum, frame):
    counts[signal.Signals(signum).name] += 1
signal.signal(signal.SIGALRM, tick)
signal.signal(signal.SIGPROF, tick)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)  # a job's timer and a profiler's, a thousand a second
signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
end = time.process_time() + 1.0  # a second of CPU: ITIMER_PROF counts it, however busy the machine is
while time.process_time() < end:
    pass
signal.setitimer(signal.ITIMER_REAL, 0)
signal.setitimer(signal.ITIMER_PROF, 0)
same = signal.getsignal(signal.SIGALRM) is tick and signal.getsignal(signal.SIGPROF) is tick
print(json.dumps(dict(counts, same=same)), flush=True)
signal.signal(signal.SIGALRM, signal.SIG_DFL)  # the default back: an alarm now ends the job
signal.alarm(1)
time.sleep(0.3)
time.sleep(60)
"""


def test_the_jobs_own_timer_handlers_are_left_alone_and_the_default_action_is_recorded_again(tmp_path: Path) -> None:
    # GIVEN a job whose own handlers take SIGALRM and SIGPROF a thousand times a second, then puts SIGALRM's
    # default action back and lets an alarm end it
    rings = tmp_path / "rings"
    runs = {}
    for armed in (False, True):
        code = TIMERS.replace("ARM", ARM if armed else "")
        proc = subprocess.run([sys.executable, "-c", code, f"{rings}/"], capture_output=True, text=True, timeout=60,
                              env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
        runs[armed] = (proc.returncode, json.loads(proc.stdout.splitlines()[0]))
    # THEN armed as unarmed, its handlers ran and still are its own, and the alarm ended it
    for armed, (status, counts) in runs.items():
        assert status == -signal.SIGALRM, runs
        assert counts["same"] and counts["SIGALRM"] > 300 and counts["SIGPROF"] > 100, (armed, counts)
    # AND the ring holds no record of the signals its handlers took, only the alarm that ended it
    (ring,) = rings.glob("*.ring")
    rows = of_kind(ring_table(read_ring(ring)), "signal").to_pylist()
    assert [(r["label"], r["detail"]) for r in rows] == [("SIGALRM", "default action")], rows
    death = recover_rings([rings]).meta["death"]
    assert death["cause"] == "signal" and death["headline"].endswith("that no handler took."), death
