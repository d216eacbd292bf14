"""A signal a process takes after blackbox's clean end, while it shuts down (exit handlers registered before
arm, finalization): recorded by the C handler left in place for the shutdown, before the exit record, and
told as what ended the process. The job is run armed and unarmed side by side."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, spawn_py

from blackbox.collect.exceptions import exit_status_unrecorded
from blackbox.recovery.pipeline import recover_rings
from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import find_rings, read_ring
from blackbox.ring.writer import built_module

pytestmark = pytest.mark.skipif(exit_status_unrecorded(built_module()) != "", reason="needs the C extension")
DUMPS = built_module() is not None and built_module().signals_late_text(-1)  # the interpreter's dump is there

# An exit handler registered before arm runs after blackbox's clean end (atexit: last in, first out).
LATE = """
import atexit, ctypes, signal, sys, time
got = []
def late():
    print("shutting down", flush=True)
    if sys.argv[2] == "segv":
        ctypes.string_at(0)
    deadline = time.monotonic() + 60
    while sys.argv[2] != "in-exit" and not got and time.monotonic() < deadline:
        time.sleep(0.01)
atexit.register(late)
if sys.argv[2] == "in-exit":  # a native exit handler that hangs, run inside exit() after blackbox's exit record
    libc = ctypes.CDLL(None)
    libc.on_exit(ctypes.cast(libc.pause, ctypes.c_void_p), None)
if sys.argv[1] != "unarmed":
    import blackbox
    blackbox.arm(sys.argv[1] + "/", sample_interval=0.02)
    blackbox.step(7)
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
print("done", flush=True)
sys.exit(3 if sys.argv[2] == "usr1" else 0)
"""


def _run(tmp_path: Path, rings: str, what: str) -> tuple[int, str, int]:
    """The job to its end: (its return code, its stdout, its pid); the signal sent by a process named timeout."""
    job = spawn_py(LATE, rings, what, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert job.stdout is not None and job.stdout.readline() == "done\n"
    assert job.stdout.readline() == "shutting down\n"
    if what == "in-exit" and rings != "unarmed":  # inside exit(), once it wrote its status
        deadline = time.monotonic() + 30
        while "process exit" not in _details(Path(rings)) and time.monotonic() < deadline:
            time.sleep(0.05)
    if what != "segv":
        time.sleep(0.2)
        sender = tmp_path / "timeout"  # a named sender, which outlives its signal a moment (as a daemon does)
        if not sender.exists():
            shutil.copy(sys.executable, sender)
        sig = signal.SIGUSR1 if what == "usr1" else signal.SIGTERM
        send = f"import os, time; os.kill({job.pid}, {int(sig)}); time.sleep(1)"
        subprocess.run([str(sender), "-c", send], check=True, env={"PYTHONHOME": sys.base_prefix})
    out, _ = job.communicate(timeout=60)
    return job.returncode, out, job.pid


def _details(rings: Path) -> list[str]:
    found = list(find_rings([rings]))
    return [str(d) for d in ring_table(read_ring(found[0]))["detail"].to_pylist()] if found else []


@pytest.mark.parametrize("what", ["term", "in-exit", "segv", "usr1"])
def test_a_signal_while_the_process_shuts_down_is_recorded_and_told(tmp_path: Path, what: str) -> None:
    # GIVEN a job whose exit handler runs after blackbox's clean end: it hangs until SIGTERM (a rank stuck in
    # its teardown, ended by timeout), or crashes in native code, or takes SIGUSR1 in its handler and exits 3;
    # or whose native exit handler hangs inside exit(), after blackbox's exit record, until SIGTERM
    # WHEN it runs unarmed and armed
    unarmed = _run(tmp_path, "unarmed", what)
    rings = tmp_path / "rings"
    armed = _run(tmp_path, str(rings), what)
    # THEN the job is unchanged: the same status and output
    expected = {"term": -signal.SIGTERM, "in-exit": -signal.SIGTERM, "segv": -signal.SIGSEGV, "usr1": 3}[what]
    assert unarmed[:2] == armed[:2] == (expected, ""), (unarmed, armed)
    # AND the ring holds the signal after the clean end, then (where the process reached exit()) the exit record
    ring = read_ring(next(iter(find_rings([rings]))))
    assert ring.clean
    table = ring_table(ring)
    kinds = table["kind"].to_pylist()
    last_disarm = len(kinds) - 1 - kinds[::-1].index("disarm")
    after = list(zip(kinds[last_disarm + 1 :], table["label"].to_pylist()[last_disarm + 1 :], strict=True))
    sig = {"term": "SIGTERM", "in-exit": "SIGTERM", "segv": "SIGSEGV", "usr1": "SIGUSR1"}[what]
    assert after == {"usr1": [("signal", sig), ("exit", None)], "in-exit": [("exit", None), ("signal", sig)]}.get(
        what, [("signal", sig)]), after  # fmt: skip
    # AND the verdict tells what ended it, and who sent it
    meta = recover_rings([rings]).meta
    death = meta["death"]
    pid = armed[2]
    if what == "usr1":  # the handler took it; the process went on to exit 3, which the exit record holds
        assert (death["cause"], death["confidence"], death["exit_status"]) == ("nonzero_exit", "certain", 3), death
        assert "in_shutdown" not in death
        return
    assert (death["cause"], death["confidence"], death["in_shutdown"]) == ("signal", "certain", True), death
    assert death["step"] == 7
    if what == "segv":
        site = ", called from late (<string>:7)" if DUMPS else ""
        lib = ", in libc.so.6" if DUMPS else ""  # the native frame, after the stacks
        assert death["headline"] == (f"The main process (pid {pid}) died of SIGSEGV in native code (a null pointer: "
                                     f"address 0x0{lib}){site}."), death  # fmt: skip
        assert death["killed_by"]["sender"] is None
    else:
        assert (death["killed_by"]["signal"], death["killed_by"]["sender"]) == ("SIGTERM", "timeout"), death
        assert death["headline"] == (f"The main process (pid {pid}) was ended by SIGTERM from timeout while it "
                                     "shut down, after its work.")  # fmt: skip
    # AND where it was: every thread's stack at the signal, while the interpreter is whole (its exit handlers;
    # not inside exit()), where this Python exports the dump faulthandler uses (3.11, 3.12, 3.14)
    stacks = meta["native_crash"] if what == "segv" else meta["shutdown_stacks"]
    if DUMPS and what != "in-exit":
        assert stacks["signal"] == sig and "late (<string>:" in stacks["stack"], stacks
        assert what == "segv" or "(in late (<string>:" in death["evidence"][-1], death["evidence"]
    else:
        assert stacks is None, stacks
    said = next(e for e in death["evidence"] if "while it shut down, " in e)
    assert float(said.split("while it shut down, ")[1].split(" s after")[0]) >= (0.0 if what == "segv" else 0.2)
    began = any(e.startswith("exit(0) began") for e in death["evidence"])  # its status, then death inside exit()
    assert began == (what == "in-exit"), death["evidence"]


HUNG_AT_EXIT = """
import atexit, sys, time
def stuck():  # an exit handler of a library imported before arm(): it never returns
    print("shutting down", flush=True)
    while True:
        time.sleep(0.05)
atexit.register(stuck)
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
for step in range(30):
    blackbox.step(step)
    time.sleep(0.01)
print("done", flush=True)
"""


def test_a_job_that_hangs_as_it_shuts_down_is_told_where(tmp_path: Path) -> None:
    # GIVEN a job that did its 30 steps, then hung in an exit handler that runs after blackbox's clean end,
    # ended 2.5 s later by a SIGTERM from a process named timeout
    rings = tmp_path / "rings"
    job = spawn_py(HUNG_AT_EXIT, str(rings), stdout=subprocess.PIPE)
    assert job.stdout is not None and job.stdout.readline() == "done\n"
    assert job.stdout.readline() == "shutting down\n"
    time.sleep(2.5)
    sender = tmp_path / "timeout"
    shutil.copy(sys.executable, sender)
    send = f"import os, signal, time; os.kill({job.pid}, signal.SIGTERM); time.sleep(1)"
    subprocess.run([str(sender), "-c", send], check=True, env={"PYTHONHOME": sys.base_prefix})
    assert job.wait(timeout=30) == -signal.SIGTERM
    # THEN it is a hang as it shut down, after its work: how long after its clean end, and where (not blackbox's
    # own end, whose stack the last sample holds); its last step and timeout's SIGTERM
    death = recover_rings([rings]).meta["death"]
    assert (death["cause"], death["step"], death["killed_by"]["sender"]) == ("hang", 29, "timeout"), death
    lasted = float(death["headline"].split("after its work: ")[1].split(" s after")[0])
    assert 2.4 <= lasted <= 8.0, death["headline"]  # the sleep, then the sender starting (slow under load)
    where = "stuck in stuck (<string>:6)" if DUMPS else "where no stack was taken"
    assert death["headline"] == (f"The main process (pid {job.pid}) hung as it shut down, after its work: "
                                 f"{lasted:.1f} s after its clean end, {where}; then SIGTERM from timeout ended it.")
    assert "blackbox" not in death["headline"] and "_jobsignal" not in str(death["hang"]), death["hang"]



RELEASED = """
import os, signal, sys
import blackbox
rec = blackbox.active() if blackbox.active().armed else blackbox.arm(sys.argv[1] + "/", sample_interval=0.02)
blackbox.step(4)
class SendsAtRelease:  # planted: a SIGTERM the moment the handler stops writing into the ring, before the exit
    def __init__(self, cmod):  # record's slots are armed (a Pool's teardown SIGTERMing a helper as it shut down)
        self._cmod = cmod
    def __getattr__(self, name):
        return getattr(self._cmod, name)
    def signals_release(self, keep_late):
        self._cmod.signals_release(keep_late)
        os.kill(os.getpid(), signal.SIGTERM)
rec._signals._cmod = SendsAtRelease(rec._signals._cmod)
print("done", flush=True)
"""


@pytest.mark.parametrize("how", ["arm", "blackbox run"])
def test_a_signal_as_the_handler_stops_writing_at_exit_waits_for_the_exit_records_slots(tmp_path: Path,
                                                                                         how: str) -> None:
    # GIVEN a job that ends cleanly, SIGTERMed by itself as blackbox's clean end releases the signals: between
    # that release and the arming of the exit record's slots, where a signal had no slot. Armed by arm() or by
    # `blackbox run`, with no BLAS thread: where numpy started BLAS threads in the job's own process, one of them
    # can take it in that window (a few system calls), as they do unarmed: noted in _sigmask.py
    rings = tmp_path / "rings"
    env = dict(os.environ, PYTHONPATH=str(REPO), OPENBLAS_NUM_THREADS="1")
    run = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(rings), "--"] if how != "arm" else []
    job = subprocess.run([*run, sys.executable, "-c", RELEASED, str(rings)], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert (job.returncode, job.stdout) == (-signal.SIGTERM, "done\n"), job.stderr[-2000:]
    # THEN the ring holds it after the clean end (held on the ending thread, it came once the slots were armed),
    # and the verdict is that SIGTERM while it shut down, sent by the process itself (it was "killed with SIGKILL
    # while it shut down", no handler having recorded it)
    folder = rings if how == "arm" else next(rings.glob("run-*/rings"))
    kinds = ring_table(read_ring(next(iter(find_rings([folder])))))["kind"].to_pylist()
    assert kinds[len(kinds) - 1 - kinds[::-1].index("disarm") + 1 :] == ["signal"], kinds[-5:]
    death = recover_rings([folder]).meta["death"]
    assert (death["cause"], death["in_shutdown"], death["step"]) == ("signal", True, 4), death
    killer = death["killed_by"]
    assert (killer["signal"], killer["sender_pid"]) == ("SIGTERM", death["victim"]["pid"]), death
