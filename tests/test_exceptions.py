"""Uncaught exceptions, capture_oom, signals and native crashes, each in a real child process."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import run_py

import blackbox
from blackbox.recovery.pipeline import recover_rings
from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import find_rings, read_ring

ARM = "import sys, blackbox\nblackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)\n"


def _events(ring_dir: Path, *kinds: str) -> list[dict]:
    (path,) = find_rings([ring_dir])
    table = ring_table(read_ring(path))
    table = table.filter(pc.is_in(table["kind"].cast("string"), value_set=pa.array(kinds)))
    return table.to_pylist()


def test_uncaught_cpu_allocator_oom_is_an_oom_event_and_exit_status_is_kept(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    proc = run_py(ARM + "import torch\ntorch.empty(1 << 62, dtype=torch.uint8)\n", str(tmp_path), check=False)
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr and "DefaultCPUAllocator" in proc.stderr, "the user's traceback still prints"
    (oom,) = _events(tmp_path, "oom")
    assert "DefaultCPUAllocator: can't allocate memory" in oom["label"] and oom["detail"] == "uncaught"
    assert oom["oom_requested"] == 1 << 62
    assert _events(tmp_path, "exception") == []


def test_look_alike_value_error_is_an_exception_event(tmp_path: Path) -> None:
    code = ARM + "raise ValueError('failed to allocate seat in queue')\n"
    proc = run_py(code, str(tmp_path), check=False)
    assert proc.returncode == 1 and "ValueError: failed to allocate seat in queue" in proc.stderr
    (exc,) = _events(tmp_path, "exception")
    assert exc["label"] == "ValueError: failed to allocate seat in queue" and exc["oom_requested"] is None
    assert _events(tmp_path, "oom") == []


def test_thread_exception_is_recorded_and_still_printed(tmp_path: Path) -> None:
    code = ARM + (
        "import threading\n"
        "def boom(): raise MemoryError('worker ran out')\n"
        "t = threading.Thread(target=boom, name='loader'); t.start(); t.join()\n"
        "print('main carried on')\n"
    )
    proc = run_py(code, str(tmp_path))
    assert "main carried on" in proc.stdout and "MemoryError: worker ran out" in proc.stderr
    (oom,) = _events(tmp_path, "oom")
    assert oom["label"] == "MemoryError: worker ran out" and oom["detail"] == "uncaught in thread loader"


def test_capture_oom_records_with_context_reraises_and_one_left_uncaught_is_the_death(tmp_path: Path) -> None:
    code = ARM + (
        "import errno\n"
        "try:\n"
        "    with blackbox.capture_oom('eval', batch=64, split='val'):\n"
        "        raise RuntimeError('retrying smaller') from OSError(errno.ENOMEM, 'Cannot allocate memory')\n"
        "except RuntimeError as e:\n"
        "    print('caught', e)\n"
        "with blackbox.capture_oom('train'):\n"
        "    raise KeyError('plain')\n"
    )
    proc = run_py(code, str(tmp_path), check=False)
    assert "caught retrying smaller" in proc.stdout and proc.returncode == 1 and "KeyError: 'plain'" in proc.stderr
    (oom,) = _events(tmp_path, "oom")
    assert oom["label"] == "OSError: [Errno 12] Cannot allocate memory"
    assert oom["detail"] == "capture_oom: eval batch=64 split='val'; raised as RuntimeError: retrying smaller"
    # the caught one recorded once; the one that went uncaught again by sys.excepthook, which says so
    captured, uncaught = _events(tmp_path, "exception")
    assert captured["label"] == uncaught["label"] == "KeyError: 'plain'"
    assert (captured["detail"], uncaught["detail"]) == ("capture_oom: train", "uncaught; capture_oom: train")
    # AND the death is that exception (it read "exited cleanly": the uncaught one was not recorded)
    death = recover_rings([tmp_path]).meta["death"]
    assert death["cause"] == "exception" and death["headline"].startswith("The job died of an uncaught KeyError at ")


def test_sigterm_is_recorded_and_still_kills(tmp_path: Path) -> None:
    code = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\n" + ARM
    code += "import os, time\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)\nprint('survived')\n"
    proc = run_py(code, str(tmp_path), check=False)
    assert proc.returncode == -signal.SIGTERM and "survived" not in proc.stdout
    (sig,) = _events(tmp_path, "signal")
    assert (sig["label"], sig["value"], sig["detail"]) == ("SIGTERM", signal.SIGTERM, "default action")


def test_job_signal_handler_is_chained_and_ignored_stays_ignored(tmp_path: Path) -> None:
    code = (
        "import os, signal, sys\n"
        "signal.signal(signal.SIGUSR1, lambda s, f: print('job handler ran', flush=True))\n"
        "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" + ARM + "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "os.kill(os.getpid(), signal.SIGHUP)\n"
        "ign = [l for l in open('/proc/self/status') if l.startswith('SigIgn:')][0].split()[1]\n"
        "print('alive', int(ign, 16) >> (signal.SIGHUP - 1) & 1)\n"
    )
    proc = run_py(code, str(tmp_path))
    assert "job handler ran" in proc.stdout and "alive 1" in proc.stdout  # SIGHUP still ignored by the kernel
    sigs = [(s["label"], s["detail"]) for s in _events(tmp_path, "signal")]
    assert sigs == [("SIGUSR1", "handled by the job's handler")]  # nothing is put over an ignored signal


def test_sigint_still_raises_keyboard_interrupt(tmp_path: Path) -> None:
    # Python's own SIGINT handler, as in an interactive run (a background job inherits SIGINT ignored)
    code = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n" + ARM
    code += "import os, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(5)\n"
    proc = run_py(code, str(tmp_path), check=False)
    assert "KeyboardInterrupt" in proc.stderr and proc.returncode != 0
    (sig,) = _events(tmp_path, "signal")
    assert sig["label"] == "SIGINT" and sig["detail"] == "raised KeyboardInterrupt"
    (exc,) = _events(tmp_path, "exception")  # recorded: it tells an interrupt from a clean exit
    assert (exc["label"], exc["detail"]) == ("KeyboardInterrupt", "uncaught")
    assert recover_rings([tmp_path]).meta["death"]["cause"] == "interrupted"


def test_native_crash_tracebacks_are_folded_into_the_bundle(tmp_path: Path) -> None:
    code = ARM + "import faulthandler\ndef deep(): faulthandler._sigsegv()\ndeep()\n"
    proc = run_py(code, str(tmp_path / "rings"), check=False)
    assert proc.returncode == -signal.SIGSEGV
    (ring,) = find_rings([tmp_path / "rings"])
    out = tmp_path / "bundle"
    blackbox.recover(ring, out)
    meta = json.loads((out / "metadata.json").read_text())
    crash = meta["native_crash"]
    assert crash["first_line"] == "Fatal Python error: Segmentation fault"
    text = (out / crash["file"]).read_text()
    assert "in deep" in text and crash["file"] == f"crash-{meta['pid']}.txt"


def test_clean_run_leaves_no_crash_file_and_restores_hooks(tmp_path: Path) -> None:
    code = (
        "import sys, signal, threading, blackbox\n"
        "before = (sys.excepthook, threading.excepthook, signal.getsignal(signal.SIGTERM))\n"
        "blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600)\n"
        "assert sys.excepthook is not before[0]\n"
        "blackbox.disarm()\n"
        "assert (sys.excepthook, threading.excepthook, signal.getsignal(signal.SIGTERM)) == before\n"
        "print('ok')\n"
    )
    assert run_py(code, str(tmp_path)).stdout.strip() == "ok"
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".crash"] == []


# The job's uncaught exception, and its own signal handler raising while blackbox's excepthook records it
# (the field's HF Trainer with spawn workers: torch's SIGCHLD handler raised "DataLoader worker ... is killed
# by signal" inside the hook, once in a dozen runs). The job's intern call is wrapped to send the signal
# right there, so the handler runs inside the hook every time.
LATE_HANDLER = """
import os, signal, sys
if sys.argv[2] == "arm":
    import blackbox, blackbox._api
    blackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)
    rec = blackbox._api._active._exceptions
    real, sent = rec._intern, []
    def intern(label):
        if not sent:  # one signal, as the worker dies once
            sent.append(True)
            os.kill(os.getpid(), signal.SIGUSR1)
        return real(label)
    rec._intern = intern
def worker_died(signum, frame):
    raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed.")
signal.signal(signal.SIGUSR1, worker_died)
def train():
    raise ConnectionResetError("peer went away")
train()
"""


def test_a_signal_handler_raising_inside_the_excepthook_leaves_the_jobs_own_report_whole(tmp_path: Path) -> None:
    unarmed = run_py(LATE_HANDLER, str(tmp_path / "r"), "unarmed", check=False)
    armed = run_py(LATE_HANDLER, f"{tmp_path}/", "arm", check=False)
    assert unarmed.returncode == armed.returncode == 1
    # the job's own report prints once, whole, first, as unarmed: never "Error in sys.excepthook"
    assert "Error in sys.excepthook" not in armed.stderr and "Original exception" not in armed.stderr
    job_report = unarmed.stderr[unarmed.stderr.index("Traceback") :]
    assert armed.stderr.count("ConnectionResetError: peer went away") == 1
    assert armed.stderr.index("in train") < armed.stderr.index("ConnectionResetError")
    assert job_report.splitlines()[-1] in armed.stderr.splitlines()
    # the handler's exception follows, as one Python could not propagate, its traceback the handler's own
    late = armed.stderr[armed.stderr.index("ConnectionResetError: peer went away") :]
    assert "Exception ignored in a signal handler" in late and "is killed by signal" in late
    assert "in worker_died" in late and "blackbox" not in late
    # and the ring still holds the job's exception: the hook tried again once the handler had run
    (event,) = _events(tmp_path, "exception")
    assert (event["label"], event["detail"]) == ("ConnectionResetError: peer went away", "uncaught")


# The same handler pending as the exception reaches the hook: a thread trips it (no real signal, so the socket's
# wait goes on) while the main thread waits in C, which then raises with no bytecode between: the handler runs
# at the first instruction of a Python excepthook, outside any try. Unarmed, Python's own C hook meets it as it
# writes the report and prints a dump ending "lost sys.stderr"; armed with a Python hook it printed "Error in
# sys.excepthook" and the job's report as "Original exception".
PENDING_AT_ENTRY = """
import signal, socket, sys, threading, _thread
if sys.argv[2] == "arm":
    import blackbox
    blackbox.arm(sys.argv[1], capacity=4096, sample_interval=3600)
def worker_died(signum, frame):
    raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed.")
signal.signal(signal.SIGUSR1, worker_died)
a, b = socket.socketpair()
a.settimeout(1.0)
threading.Timer(0.3, _thread.interrupt_main, (signal.SIGUSR1,)).start()
a.recv(1)
"""


def test_a_signal_handler_pending_as_the_exception_reaches_the_hook_leaves_the_report_whole(tmp_path: Path) -> None:
    pytest.importorskip("blackbox.ring._cwriter", reason="the hook's entry is covered in C")
    armed = run_py(PENDING_AT_ENTRY, f"{tmp_path}/", "arm", check=False)
    assert armed.returncode == 1
    assert "Error in sys.excepthook" not in armed.stderr and "Original exception" not in armed.stderr, armed.stderr
    assert armed.stderr.startswith("Traceback") and armed.stderr.count("TimeoutError: timed out") == 1
    late = armed.stderr[armed.stderr.index("TimeoutError: timed out") :]
    assert "Exception ignored in a signal handler" in late and "in worker_died" in late and "blackbox" not in late
    (event,) = _events(tmp_path, "exception")
    assert (event["label"], event["detail"]) == ("TimeoutError: timed out", "uncaught")


# a job armed (its steps told) or not, by its second argument
ARMED_OR_NOT = """
import sys, time
if sys.argv[2] == "arm":
    import blackbox
    blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05)
    step = blackbox.step
else:
    step = lambda n: None
"""
OWN_HOOK = ARMED_OR_NOT + """
def log_and_quit(kind, value, tb):  # a logging setup's hook: it never calls the previous one
    print("LOGGED", kind.__name__, value, file=sys.stderr)

sys.excepthook = log_and_quit
for n in range(12):
    step(n)
    time.sleep(0.01)
    if n == 9 and sys.argv[3] == "raise":
        open("/nonexistent/checkpoint.pt")
    if n == 9 and sys.argv[3] == "stale":  # sets sys.last_exc too, as an uncaught one does (a code-eval tool)
        __import__("code").InteractiveInterpreter().runsource("1/0")
"""


@pytest.mark.parametrize("end", ["raise", "clean", "stale"])
def test_an_exception_the_jobs_own_excepthook_took_is_still_the_death(tmp_path: Path, end: str) -> None:
    # GIVEN a job whose own sys.excepthook, set after arm, logs and never calls blackbox's; it raises at step 9
    # (or ends cleanly), unarmed and armed
    unarmed = run_py(OWN_HOOK, str(tmp_path / "r"), "unarmed", end, check=False)
    armed = run_py(OWN_HOOK, f"{tmp_path}/", "arm", end, check=False)
    # THEN the job is the same: its status and its own hook's line, nothing more
    assert unarmed.returncode == armed.returncode == (1 if end == "raise" else 0)
    said = {"raise": "LOGGED FileNotFoundError [Errno 2] No such file or directory: '/nonexistent/checkpoint.pt'\n",
            "clean": "", "stale": "LOGGED ZeroDivisionError division by zero\n"}[end]
    assert unarmed.stderr == armed.stderr == said
    # AND the verdict names the exception at step 9 (it read "exited with status 1"), and none where none was raised
    death = recover_rings([tmp_path]).meta["death"]
    if end == "raise":
        assert (death["cause"], death["step"]) == ("exception", 9), death
        assert any("FileNotFoundError" in e for e in death["evidence"]), death["evidence"]
    else:  # and none where none ended it (an older sys.last_exc, where it exits 0, is not its death)
        assert death["cause"] == "clean_exit", death


CAUGHT_THEN_EXIT = ARMED_OR_NOT + """
def main():
    for n in range(10):
        step(n)
        time.sleep(0.01)
        if n == 6:
            raise ValueError("bad batch at step 6")

try:
    main()
except Exception as exc:  # the job's own top-level handler: log, then fail
    print("error:", exc, file=sys.stderr)
    sys.exit(int(sys.argv[3]))
"""


@pytest.mark.parametrize("status", [1, 0])
def test_an_exception_the_job_caught_before_exiting_with_a_failure_is_the_death(tmp_path: Path, status: int) -> None:
    # GIVEN `except Exception: log(...); sys.exit(1)` around the job (torch.multiprocessing.spawn's workers do
    # the same), its ValueError at step 6; and the same handler exiting 0
    unarmed = run_py(CAUGHT_THEN_EXIT, str(tmp_path / "r"), "unarmed", str(status), check=False)
    armed = run_py(CAUGHT_THEN_EXIT, f"{tmp_path}/", "arm", str(status), check=False)
    # THEN the job is unchanged: its status and its own line
    assert unarmed.returncode == armed.returncode == status
    assert unarmed.stderr == armed.stderr == "error: bad batch at step 6\n"
    death = recover_rings([tmp_path]).meta["death"]
    if status:  # AND the death is that exception, at its step, said caught (it read "exited with status 1")
        assert (death["cause"], death["step"]) == ("exception", 6), death
        lines = CAUGHT_THEN_EXIT.splitlines()  # (run as `python -c`: the file is <string>)
        raised = lines.index('            raise ValueError("bad batch at step 6")') + 1
        called = lines.index("    main()") + 1
        assert death["headline"] == (f"The job died of a ValueError at main (<string>:{raised}), which it caught and "
                                     "exited with status 1.")  # fmt: skip
        assert f"raised at main (<string>:{raised}) ← <module> (<string>:{called})" in death["evidence"]
        assert "exception at step 6: ValueError: bad batch at step 6; the job caught it and exited with status 1" \
            in death["evidence"]  # fmt: skip
    else:  # an exit with status 0 after catching it: the job's choice, no death
        assert death["cause"] == "clean_exit" and _events(tmp_path, "exception") == [], death


def test_a_thread_that_died_while_the_process_went_on_is_in_the_evidence(tmp_path: Path) -> None:
    # GIVEN a checkpoint uploader thread that dies of a ConnectionError while training goes on and ends cleanly
    code = ARMED_OR_NOT + (
        "import threading\n"
        "def upload(): raise ConnectionError('checkpoint upload failed: connection reset')\n"
        "threading.Thread(target=upload, name='uploader').start()\n"
        "for n in range(5): step(n); time.sleep(0.02)\n"
    )
    proc = run_py(code, f"{tmp_path}/", "arm")
    assert "ConnectionError: checkpoint upload failed" in proc.stderr
    death = recover_rings([tmp_path]).meta["death"]
    # THEN the job ended cleanly, and the evidence says the thread died (it was in metadata alone)
    assert death["cause"] == "clean_exit", death
    (said,) = [e for e in death["evidence"] if e.startswith("uncaught in thread uploader")]
    line = code.splitlines().index("def upload(): raise ConnectionError('checkpoint upload failed: connection reset')")
    assert said.endswith("(the process went on): ConnectionError: checkpoint upload failed: connection reset, "
                         f"raised at upload (<string>:{line + 1})"), said  # fmt: skip


NOT_THE_CAUSE = {
    # argparse's error() exits 2 from its own frame, inside parse_args's `except ArgumentError`
    "argparse": ("import argparse\nstep(0)\np = argparse.ArgumentParser()\np.add_argument('--mode', choices=['a'])\n"
                 "p.parse_args(['--mode', 'c'])\n", 2),
    # a SIGTERM handler's sys.exit(143) runs while the loop backs off in an `except ConnectionError:`
    "signal handler": ("import os, signal\nsignal.signal(signal.SIGTERM, lambda s, f: sys.exit(143))\n"
                       "for n in range(10):\n    step(n)\n    try:\n        raise ConnectionError('metrics down')\n"
                       "    except ConnectionError:\n        os.kill(os.getpid(), signal.SIGTERM)\n"
                       "        time.sleep(0.5)\n", 143),
}


@pytest.mark.parametrize("case", list(NOT_THE_CAUSE))
def test_an_exception_handled_elsewhere_than_the_exit_is_not_the_death(tmp_path: Path, case: str) -> None:
    # GIVEN sys.exit with a failing status called while an exception is handled, but not by the frame that
    # caught it
    code, status = NOT_THE_CAUSE[case]
    proc = run_py(ARMED_OR_NOT + code, f"{tmp_path}/", "arm", "-", check=False)
    assert proc.returncode == status, proc.stderr
    # THEN that exception is not the death (the review: "died of a ConnectionError, which it caught"; argparse's
    # invalid choice "died of an argparse.ArgumentError")
    death = recover_rings([tmp_path]).meta["death"]
    assert death["cause"] != "exception" and _events(tmp_path, "exception") == [], death
