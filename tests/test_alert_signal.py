"""The alert signal and the on_alert callbacks in a real process, its alert made critical at once (levels of
0.01% and 0.02% of the host's memory, which any process passes): the signal reaches the job's handler and
the ring says when that handler was entered and when it returned; no handler, no signal; a handler that
raises gives the job its exception as a real signal would; the job's handler is back in place after (it was
wrapped for that one delivery, to know when it ran); a job that profiles itself keeps its profiler;
a callback that raises is dropped with one warning, and one that blocks never holds up the job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_py

import blackbox

pytestmark = pytest.mark.slow

JOB = """
import json, os, signal, sys, threading, time
import blackbox
mode, told, ran = sys.argv[2], [], []
def on_usr1(signum, frame):
    ran.append(time.monotonic())
    time.sleep(0.3)
    if mode == "raises":
        raise SystemExit(3)
if mode != "no handler":
    signal.signal(signal.SIGUSR1, on_usr1)
if mode == "profiled":
    sys.setprofile(lambda frame, event, arg: None)
held = threading.Lock()
held.acquire()  # the job holds it for good: a callback that waits on it never returns
def bad(alert):
    raise ValueError("boom")
def blocks(alert):
    with held:
        pass
blackbox.on_alert(bad)
blackbox.on_alert(lambda alert: told.append((alert.kind, alert.level, alert.limit_kind)))
blackbox.on_alert(blocks)
blackbox.arm(sys.argv[1], sample_interval=0.05, alert_signal="USR1", alert_levels=(0.0001, 0.0002))
end = time.monotonic() + 1.0
while time.monotonic() < end:
    sum(range(1000))
print(json.dumps({"told": told, "ran": len(ran), "profile": sys.getprofile() is not None,
                  "back": signal.getsignal(signal.SIGUSR1) is (signal.SIG_DFL if mode == "no handler" else on_usr1)}))
"""


def _run(tmp_path: Path, mode: str) -> tuple[Any, list[dict[str, Any]]]:
    ring = tmp_path / mode.replace(" ", "-")
    ring.mkdir()
    proc = run_py(JOB, str(ring), mode, check=False)
    blackbox.recover(ring, ring / "b", raw=False)
    meta = json.loads((ring / "b" / "metadata.json").read_text())
    return proc, meta


def test_the_alert_signal_reaches_the_handler_and_the_ring_says_when_it_ran(tmp_path: Path) -> None:
    proc, meta = _run(tmp_path, "handler")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["ran"] == 1 and out["back"]  # sent once; the job's handler back in place, as it set it
    sent = meta["alerts"]["signal"]
    assert (sent["sent"], sent["signal"], sent["alert"]) == (True, "SIGUSR1", "memory critical"), sent
    handler = sent["handler"]
    assert handler["ran"] == "returned" and "on_usr1" in handler["name"] and handler["seconds"] >= 0.29, handler
    # the callbacks: the one that raised dropped with one warning, the next called; the one that blocks (on a
    # lock the job holds) holds up the later alerts' callbacks, never the job, which ended on time
    assert out["told"] == [["memory", "warning", "host"]]
    assert proc.stderr.count("dropped the on_alert callback") == 1, proc.stderr
    assert "bad: ValueError: boom" in meta["alerts"]["callbacks_dropped"][0]


def test_no_handler_no_signal(tmp_path: Path) -> None:
    proc, meta = _run(tmp_path, "no handler")
    assert proc.returncode == 0 and json.loads(proc.stdout)["ran"] == 0, proc.stderr  # alive: not sent
    sent = meta["alerts"]["signal"]
    assert not sent["sent"] and "default action would end the job" in sent["why"], sent


def test_a_handler_that_raises_ends_the_job_as_a_real_signal_would(tmp_path: Path) -> None:
    proc, meta = _run(tmp_path, "raises")
    assert proc.returncode == 3, proc.stderr
    assert meta["alerts"]["signal"]["handler"]["ran"] == "returned"  # by its exception


def test_a_job_that_profiles_itself_keeps_its_profiler(tmp_path: Path) -> None:
    proc, meta = _run(tmp_path, "profiled")
    out = json.loads(proc.stdout)
    assert proc.returncode == 0 and out["ran"] == 1 and out["profile"] and out["back"], proc.stderr
    assert meta["alerts"]["signal"]["handler"]["ran"] == "returned"


SITE_JOB = f"""
import json, sys, time
sys.path.insert(0, {str(REPO / "tools" / "gpucheck")!r})
from device import Device
dev = Device(True)  # the fake CUDA device (tools/gpucheck/fake_cuda.py): its memory is ours to fill
import blackbox
told = []
blackbox.on_alert(lambda alert: told.append((alert.limit_kind, alert.top_site)))
blackbox.arm(sys.argv[1], sample_interval=0.05, allocations=True)
def load_table():
    return [bytearray(1 << 20) for _ in range(96)]  # 96 MiB held: where the most sampled bytes live
table = load_table()
time.sleep(0.3)
dev.init()
weights = dev.empty(7 << 30)  # the device 94% full: its memory alerts
time.sleep(1.0)
print(json.dumps([site for kind, site in told if kind == "gpu"]))
"""


def test_the_callback_is_told_where_the_memory_was_allocated_when_allocations_are_sampled(tmp_path: Path) -> None:
    proc = run_py(SITE_JOB, str(tmp_path))
    told = json.loads(proc.stdout)
    assert told and told[0] is not None, proc.stderr  # the GPU's warning (7.5 of 8 GiB)
    # the innermost frame of the job's own code (3.11's list comprehension has a frame of its own)
    assert told[0]["site"].startswith("load_table") and told[0]["live_bytes"] > 64 << 20, told[0]


MASK_JOB = """
import json, signal, subprocess, sys, time
import blackbox
seen = []
def start_a_child(alert):  # the job's own code, on blackbox's alerts thread: what it starts has the job's mask
    if not seen:
        child = subprocess.run(["grep", "SigBlk", "/proc/self/status"], capture_output=True, text=True)
        seen.append((sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), child.stdout.split()[1]))
blackbox.on_alert(start_a_child)
blackbox.arm(sys.argv[1], sample_interval=0.05, alert_levels=(0.0001, 0.0002))
deadline = time.monotonic() + 10
while not seen and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps(seen))
"""


def test_a_callback_and_what_it_starts_have_the_jobs_signal_mask(tmp_path: Path) -> None:
    # GIVEN a job whose on_alert callback starts a process (blackbox's alerts thread blocks the signals it records)
    # WHEN the alert comes
    proc = run_py(MASK_JOB, str(tmp_path))
    # THEN the callback runs, and its process starts, with the mask the job has: nothing blocked (they had the
    # signals blocked that arming holds, which the thread inherited: a process with SIGTERM blocked outlived its
    # terminate())
    assert json.loads(proc.stdout) == [[[], "0000000000000000"]], proc.stderr[-2000:]
