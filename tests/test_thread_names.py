"""Thread names for the allocation hooks (blackbox/collect/thread_names.py, and the tick's once-a-second look in
collect/allocs.py): told as threads start and are renamed, kept for a thread that ended with its stack not yet
written, never at the cost of the job's own exceptions, and put back at disarm."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_py

import blackbox
from blackbox._api import active
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
    global inside
    if inside:
        inside = False  # one raise a rename: a second, in the loop's own except before it says so, escaped the loop
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


# A thread allocates, is named, and ends; the tick that writes its new stack is the once-a-second one, which
# forgets threads that ended (before: it forgot them first, and the stack was written with no name).
ENDED = """
import os, signal, sys, threading
import numpy as np
import blackbox
from blackbox._api import active

blackbox.arm(sys.argv[1], sample_interval=3600)  # no tick but the one below
kept = []
t = threading.Thread(target=lambda: kept.append(np.ones(64 << 20, np.uint8)), name="prefetch-loader")
t.start()
t.join()
allocs = active()._allocs
allocs._due = 0.0  # this tick is the once-a-second one
allocs.tick(0)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_thread_that_allocated_and_ended_before_the_once_a_second_tick_keeps_its_name(tmp_path: Path) -> None:
    job = tmp_path / "job.py"  # (a file: its stack's frames have a source to read)
    job.write_text(ENDED)
    proc = subprocess.run([sys.executable, str(job), f"{tmp_path / 'rings'}/"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)  # fmt: skip
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    blackbox.recover(tmp_path / "rings", tmp_path / "bundle")
    top = json.loads((tmp_path / "bundle" / "metadata.json").read_text())["allocations"]["sites"][0]
    assert top["thread"] == "prefetch-loader" and top["live_bytes"] == 64 << 20, top


def look(allocs: Any, done: Callable[[], bool]) -> None:
    """Run the tick as its once-a-second look until ``done`` (the sampler thread's own tick, in the drain at
    that moment, makes ours pass by)."""
    for _ in range(100):
        allocs._due = 0.0
        allocs.tick(0)
        if done():
            return
        time.sleep(0.01)


def test_the_once_a_second_look_forgets_ended_threads_and_tells_only_a_change(tmp_path: Path) -> None:
    blackbox.arm(f"{tmp_path / 'rings'}/", sample_interval=3600)
    stop = threading.Event()
    try:
        allocs = active()._allocs
        assert allocs is not None
        told: list[Any] = []

        class Spy:  # the hooks' module, counting what the look tells it
            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

            def name_threads(self, names: Any) -> None:
                told.append(list(names))
                real.name_threads(names)

        real, allocs._c = allocs._c, Spy()  # type: ignore[assignment]
        alive = threading.Thread(target=stop.wait, name="alive")
        alive.start()
        ended = threading.Thread(target=lambda: None, name="short")  # (after: an ended thread's ident is reused)
        ended.start()
        ended.join()
        assert allocs._named[ended.ident] == "short" and allocs._named[alive.ident] == "alive"  # told at start
        look(allocs, lambda: ended.ident not in allocs._named)
        assert ended.ident not in allocs._named and told == [], told  # forgotten; nothing changed, nothing told
        alive._name = "renamed-around-the-setter"  # type: ignore[attr-defined]
        look(allocs, lambda: bool(told))
        assert told and (alive.ident, b"renamed-around-the-setter") in told[-1], told
        assert allocs._named[alive.ident] == "renamed-around-the-setter"
        allocs._c = real
    finally:
        stop.set()
        blackbox.disarm()
