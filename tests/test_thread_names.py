"""Thread names for the allocation hooks (blackbox/collect/thread_names.py): told as threads start and are
renamed, never at the cost of the job's own exceptions, and put back at disarm."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from conftest import run_py

import blackbox
from blackbox.collect.allocs import sample_module

if sample_module() is None:
    pytest.skip("the C extension blackbox.collect._csample is not built", allow_module_level=True)

# The main thread renames a thread in a loop under a 1 ms timer whose handler raises (only inside the
# rename's window): each raise must reach the loop, as unarmed; the wrapped setter runs blackbox's code in
# the main thread, where CPython runs the handler at whatever bytecode comes next.
RENAMES = """
import json, signal, sys, threading, time
if sys.argv[2] == "arm":
    import blackbox
    blackbox.arm(sys.argv[1])

class Tick(Exception):
    pass

counts = {"raised": 0, "renames": 0}
reached = set()  # each raise that reached the loop: caught there, or in the context of what was caught
inside = False

def on_alarm(signum, frame):
    if inside:
        tick = Tick()
        # from here to the raise no call, so no nested handler can come between the count and the raise
        counts["raised"] += 1
        tick.args = (counts["raised"],)
        raise tick

other = threading.Thread(target=time.sleep, args=(4,), name="other", daemon=True)
other.start()
signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
end = time.monotonic() + 2.0
try:
    while time.monotonic() < end:
        try:
            inside = True
            other.name = "other-" + str(counts["renames"])
            inside = False
            counts["renames"] += 1
        except Tick as exc:
            inside = False
            seen = exc
            while seen is not None:
                if isinstance(seen, Tick):
                    reached.add(seen.args[0])
                seen = seen.__context__
finally:
    inside = False
    signal.setitimer(signal.ITIMER_REAL, 0)
counts["reached"] = len(reached)
print(json.dumps(counts))
"""


@pytest.mark.parametrize("mode", ["unarmed", "arm"])
def test_the_jobs_handler_raising_during_a_rename_always_reaches_the_job(tmp_path: Path, mode: str) -> None:
    counts = json.loads(run_py(RENAMES, f"{tmp_path / 'rings'}/", mode).stdout.strip().splitlines()[-1])
    assert counts["raised"] >= 50 and counts["renames"] > 1000, counts  # the timer landed in renames, often
    assert counts["reached"] == counts["raised"], counts


def test_disarm_puts_the_threads_start_and_rename_back(tmp_path: Path) -> None:
    before = threading.Thread.__dict__["_set_ident"], threading.Thread.__dict__["name"]
    blackbox.arm(f"{tmp_path / 'rings'}/", sample_interval=3600)
    try:
        armed = threading.Thread.__dict__["_set_ident"], threading.Thread.__dict__["name"]
        assert armed[0] is not before[0] and armed[1] is not before[1]
        t = threading.Thread(target=lambda: None, name="a")
        t.name = "b"  # before start: told at start, with this name
        t.start()
        t.join()
        assert t.name == "b"
    finally:
        blackbox.disarm()
    assert (threading.Thread.__dict__["_set_ident"], threading.Thread.__dict__["name"]) == before
