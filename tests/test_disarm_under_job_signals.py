"""Ending a recording while the job's own signal handler raises: the ring still gets its clean end and its
exit record, and the job still gets its exception, after them.

torch's SIGCHLD handler raises ``RuntimeError: DataLoader worker (pid N) is killed by signal`` in whatever
the main thread runs when a worker dies; when the job is exiting that can be blackbox's disarm at exit. It
used to end the disarm midway (the ring read as SIGKILLed, though the process exited with status 1: 1 run
in 30 of tests/test_causes.py's DataLoader OOM) or be swallowed as blackbox's own failure (one warning, and
the job's exception lost).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, run_py

import blackbox
from blackbox import _recorder_end
from blackbox._jobsignal import HeldForTheJob
from blackbox.recovery.pipeline import recover_rings
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring
from blackbox.ring.writer import NO_C_EXTENSION

ENV = dict(os.environ, PYTHONPATH=str(REPO))


def blackbox_warned(stderr: str) -> bool:
    """A BlackboxWarning in a job's stderr, but arm()'s notice that the C extension is not built (an install
    without a C compiler: the Python lanes of .ci/run, BLACKBOX_NO_C_EXTENSION=1), which is no failure."""
    return any("BlackboxWarning" in line and NO_C_EXTENSION not in line for line in stderr.splitlines())


class WorkerDied(RuntimeError):
    pass


@pytest.fixture
def raising_handler() -> Iterator[None]:
    """SIGUSR1's handler raises, as torch's SIGCHLD handler does when a DataLoader worker dies."""

    def on_usr1(signum: int, frame: object) -> None:
        raise WorkerDied("DataLoader worker (pid 4242) is killed by signal: Killed.")

    old = signal.signal(signal.SIGUSR1, on_usr1)
    yield
    signal.signal(signal.SIGUSR1, old)


def _signal_during(owner: object, step: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's signal lands while the disarm runs ``step`` (of ``owner``: the recorder, or the module
    whose function the disarm calls), once its work is done (the hooks it puts back are back): sent from
    inside it, so its handler runs at the next bytecode, there."""
    real = getattr(owner, step)

    def interrupted(*args: object, **kwargs: object) -> object:
        result = real(*args, **kwargs)
        os.kill(os.getpid(), signal.SIGUSR1)
        return result

    monkeypatch.setattr(owner, step, interrupted)


@pytest.mark.parametrize("step", ["uninstall_collectors", "sample_now"])
def test_the_jobs_exception_raised_during_disarm_reaches_it_after_the_clean_end(
    tmp_path: Path, raising_handler: None, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN an armed recorder, and the job's handler raising while the disarm puts its hooks back, or takes
    # its last sample
    before = sys.excepthook
    rec = blackbox.Recorder.arm(tmp_path / "job.ring", capacity=1024, sample_interval=3600)
    rec.mark("loss", 1)
    _signal_during(_recorder_end if step == "uninstall_collectors" else rec, step, monkeypatch)
    # WHEN it is disarmed
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with pytest.raises(WorkerDied, match="pid 4242"):
            rec.disarm()
    # THEN the job got its exception, blackbox said nothing of its own, its hooks are back, and the ring
    # ends cleanly
    assert not [w for w in said if "blackbox" in str(w.message)], [str(w.message) for w in said]
    assert sys.excepthook is before
    ring = read_ring(tmp_path / "job.ring")
    assert ring.clean and ring.header.state == fmt.STATE_CLEAN
    assert fmt.KIND_CODES["disarm"] in ring.records["kind"].tolist()
    assert not rec.armed


JOB = textwrap.dedent(
    """
    import os, signal, sys
    import blackbox
    from blackbox import _api

    def on_usr1(signum, frame):
        raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed.")

    blackbox.arm(sys.argv[1] + "/", sample_interval=3600)
    signal.signal(signal.SIGUSR1, on_usr1)
    blackbox.mark("loss", 1)
    rec = _api._active
    last_sample = rec.sample_now

    def sample_now():  # the worker dies as blackbox takes its last sample at exit
        os.kill(os.getpid(), signal.SIGUSR1)
        return last_sample()

    rec.sample_now = sample_now
    sys.exit(3)
    """
)


def test_a_job_whose_handler_raises_as_blackbox_ends_at_exit_keeps_its_status_and_its_verdict(tmp_path: Path) -> None:
    # GIVEN a job that exits with status 3, whose handler raises while blackbox ends its ring at exit
    job = tmp_path / "job.py"
    job.write_text(JOB)
    proc = subprocess.run([sys.executable, str(job), str(tmp_path / "rings")], capture_output=True, text=True,
                          env=ENV, timeout=120)  # fmt: skip
    # THEN the job exits as it would unarmed: its status, and its exception printed where Python prints one
    # raised in an exit handler; blackbox warns of nothing
    assert proc.returncode == 3, proc.stderr
    assert "RuntimeError: DataLoader worker (pid 4242) is killed by signal: Killed." in proc.stderr
    assert not blackbox_warned(proc.stderr) and "dropped an event" not in proc.stderr, proc.stderr
    # AND its ring ends cleanly with the exit status: the verdict is an exit with status 3, not a SIGKILL
    meta = recover_rings([tmp_path / "rings"]).meta
    death = meta["death"]
    assert meta["clean"] is True, meta["recovery"]
    assert death["cause"] == "nonzero_exit" and death["exit_status"] == 3, death


def test_a_wait_for_the_sampler_outlasts_the_jobs_handler_and_then_gives_its_exception(raising_handler: None) -> None:
    # GIVEN a sampler that takes 0.5 s to end its loop, and the job's signal 0.05 s into the wait for it
    ended = threading.Event()

    def sampler() -> None:
        time.sleep(0.5)
        ended.set()

    threading.Thread(target=sampler).start()
    threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1)).start()
    errors: list[BaseException] = []
    held = HeldForTheJob(errors.append)
    # WHEN the disarm waits for it
    t0 = time.monotonic()
    held.wait(ended, 5.0)
    # THEN the wait went on to the loop's end, the handler's exception held, then given to the job
    assert ended.is_set() and time.monotonic() - t0 >= 0.4
    assert not errors
    with pytest.raises(WorkerDied):
        held.raise_held()


def test_a_process_killed_as_it_exits_after_an_uncaught_exception_is_said_so(tmp_path: Path) -> None:
    # GIVEN a job whose uncaught exception is recorded, then SIGKILLed by an exit handler that runs before
    # blackbox's (registered after arm)
    proc = run_py(
        """
        import atexit, os, signal, sys, blackbox
        blackbox.arm(sys.argv[1] + "/", sample_interval=3600)
        atexit.register(lambda: os.kill(os.getpid(), signal.SIGKILL))
        raise ValueError("bad batch")
        """,
        str(tmp_path / "rings"),
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL
    # WHEN its ring is recovered
    death = recover_rings([tmp_path / "rings"]).meta["death"]
    # THEN it was killed, and the evidence names the exception it was exiting on, not "no exception"
    assert death["cause"] == "killed", death
    assert any("after its uncaught ValueError: bad batch, no handler ran" in e for e in death["evidence"]), death


SWEPT_JOB = """
import atexit, os, signal, sys
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=3600)
kind, at = sys.argv[2], int(sys.argv[3])

def handler(signum, frame):
    if kind == "exit":
        sys.exit(3)  # a graceful-shutdown handler
    if kind == "interrupt":
        raise KeyboardInterrupt
    raise RuntimeError("from the job's handler")

signal.signal(signal.SIGTERM, handler)
calls = [0]

def tracer(frame, event, arg):  # the job's signal lands as the disarm makes its at-th Python call
    if event == "call":
        calls[0] += 1
        if calls[0] == at:
            sys.settrace(None)
            os.kill(os.getpid(), signal.SIGTERM)
    return None

atexit.register(lambda: sys.settrace(tracer))  # registered after arm(): it runs just before blackbox's disarm
print("main ends")
"""


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["error", "exit", "interrupt"])
def test_wherever_in_the_disarm_at_exit_the_jobs_handler_raises_the_ring_ends_clean(tmp_path: Path, kind: str) -> None:
    # GIVEN a job whose SIGTERM handler raises (an error, sys.exit(3), a KeyboardInterrupt) as blackbox ends
    # its ring at exit, at the 1st, 2nd, ... 89th Python call of the disarm (the entry of a step, inside
    # one, between two: where the exception escaped the disarm, cut a step short or was not held, the ring
    # read as SIGKILLed though the job exited 0)
    job = tmp_path / "job.py"
    job.write_text(SWEPT_JOB)
    for at in (1, 2, 3, 4, 5, 6, 8, 10, 13, 17, 21, 27, 34, 44, 55, 70, 89):
        rings = tmp_path / f"rings-{at}"
        proc = subprocess.run([sys.executable, str(job), str(rings), kind, str(at)], capture_output=True,
                              text=True, env=ENV, timeout=120)  # fmt: skip
        # THEN the job ends as Python ends one whose exit handler raised (status 0), its exception printed
        assert proc.returncode == 0 and proc.stdout == "main ends\n", (at, proc.returncode, proc.stderr[-1500:])
        assert not blackbox_warned(proc.stderr) and "dropped an event" not in proc.stderr, (at, proc.stderr)
        # AND the ring has its clean end, and the verdict is that the job ended by itself, not a kill
        meta = recover_rings([rings]).meta
        assert meta["clean"] is True and meta["death"]["cause"] == "clean_exit", (at, meta["death"]["headline"])


ONE_SHOT = """
import os, signal, sys
import blackbox

def handler(signum, frame):
    signal.signal(signum, signal.SIG_DFL)  # one-shot: the next one ends the process
    raise RuntimeError("worker died")

if sys.argv[2] == "before":
    signal.signal(signal.SIGUSR1, handler)
blackbox.arm(sys.argv[1])
if sys.argv[2] == "after":
    signal.signal(signal.SIGUSR1, handler)

def tracer(frame, event, arg):  # the signal lands as blackbox interns the new label (Python code)
    if event == "call" and frame.f_code.co_name == "intern":
        sys.settrace(None)
        os.kill(os.getpid(), signal.SIGUSR1)

try:
    sys.settrace(tracer)
    blackbox.mark("a label never written before", 1)
    sys.settrace(None)
    print("no exception reached the job")
except RuntimeError as exc:
    print("the job caught:", exc)
"""


@pytest.mark.parametrize("installed", ["before", "after"])
def test_a_one_shot_handlers_exception_reaches_the_job(tmp_path: Path, installed: str) -> None:
    # GIVEN a handler, installed before or after arm(), that puts the default back and then raises (so it is no
    # longer in the signal table as its exception goes up), its signal landing inside blackbox's mark()
    job = tmp_path / "job.py"
    job.write_text(ONE_SHOT)
    proc = subprocess.run([sys.executable, str(job), str(tmp_path / "j.ring"), installed], capture_output=True,
                          text=True, env=ENV, timeout=60)  # fmt: skip
    # THEN its exception reaches the job, never taken for blackbox's own failure
    assert proc.stdout == "the job caught: worker died\n", proc.stdout + proc.stderr
    assert not blackbox_warned(proc.stderr), proc.stderr


WALK = """
import os, signal, sys
import blackbox
from blackbox import _jobsignal

class WorkerDied(Exception):
    pass

def on_usr1(signum, frame):
    raise WorkerDied("worker died")

fire = False

class Odd:  # a handler object of another library's, whose attribute lookup is where SIGUSR1 lands
    def __getattr__(self, name):
        if fire:
            os.kill(os.getpid(), signal.SIGUSR1)
            for _ in range(1000):  # the handler runs at the next bytecode boundary: within these
                pass
        raise AttributeError(name)
    def __call__(self, signum, frame):
        pass

blackbox.arm(sys.argv[1])
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGUSR2, Odd())
fire = True
try:
    try:
        raise ValueError("blackbox's own")
    except ValueError as exc:
        print("answered:", _jobsignal.raised_by_signal_handler(exc))
except WorkerDied as exc:
    print("the job caught:", exc)
"""


def test_the_jobs_exception_raised_while_blackbox_reads_the_signal_table_reaches_the_job(tmp_path: Path) -> None:
    # GIVEN the job's handler raising while blackbox walks the signal table to ask whether an exception is the
    # job's (inside the lookup of another handler object's attributes, which blackbox's walk guards)
    job = tmp_path / "job.py"
    job.write_text(WALK)
    proc = subprocess.run([sys.executable, str(job), str(tmp_path / "j.ring")], capture_output=True, text=True,
                          env=ENV, timeout=60)  # fmt: skip
    # THEN that exception reaches the job, never swallowed as an attribute lookup that failed
    assert proc.stdout == "the job caught: worker died\n", proc.stdout + proc.stderr
    assert not blackbox_warned(proc.stderr), proc.stderr


def test_the_backward_phase_keeps_every_exception_of_the_jobs_handler_in_the_chain() -> None:
    # (PhaseCall, the C wrapper around torch.autograd.backward, writes the phase's end after the call raised;
    # the job's timer handler raised in that write, and again while blackbox handled the first: the chain the job
    # catches held the second and the call's, the first lost. CI's test_job_signal_handlers[arm-python], 1 in
    # about 1,850 under load)
    from blackbox.ring.writer import built_module

    cmod = built_module()
    if cmod is None:
        pytest.skip("PhaseCall is the C extension's")

    class Tick(Exception):
        pass

    def backward() -> None:
        raise Tick("the call's")

    def event(kind: int, name: str, value: object = None) -> int:
        if kind == 2:  # the phase's end
            try:
                raise Tick("the first, in the end's write")
            except Tick:
                raise Tick("the second, while blackbox handled the first")  # noqa: B904 (its context: the first)
        return 1

    with pytest.raises(Tick) as info:
        cmod.PhaseCall(backward, event, 1, 2, "backward")()
    chain, exc = [], info.value
    while exc is not None and len(chain) < 8:
        chain.append(exc.args[0])
        exc = exc.__context__
    assert chain == ["the second, while blackbox handled the first", "the first, in the end's write", "the call's"]
