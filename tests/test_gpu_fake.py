"""GPU code paths driven by a fake CUDA backend (tests/fake_torch.py), in a child process."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from conftest import REPO, run_py

from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import find_rings, read_ring

GiB = 1 << 30
JOB = """
import json, sys, time
sys.path.insert(0, sys.argv[2])
import fake_torch
fake_torch.install()
import blackbox
rec = blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.02, allocator_history=True)
time.sleep(0.2)
before_init = list(fake_torch.calls)              # the job has not initialised CUDA yet
fake_torch.state["initialised"] = True            # ...now it has
for i in range(5):
    fake_torch.add_trace("alloc", 0x1000 + i, 512 << i, 1000 + i)
time.sleep(0.2)
rec._torch.drain()                                # due every second or so; forced here
for i in range(5, 12):                            # more than the fake's 8-entry history holds
    fake_torch.add_trace("free_completed" if i % 2 else "segment_alloc", 0x1000 + i, 512 << i, 1000 + i)
fake_torch.state["observers"][0](0, 2 << 30, 80 << 30, 1 << 30)   # the allocator runs out
fake_torch.state["observers"][0](0, 2 << 30, 80 << 30, 1 << 30)   # and retries (observers may fire twice)
blackbox.disarm()
print(json.dumps({"before_init": before_init, "calls": [c[0] for c in fake_torch.calls],
                  "history": [c[1] for c in fake_torch.calls if c[0] == "record_memory_history"],
                  "notes": rec.notes}))
"""


def test_fake_cuda_backend_samples_observer_and_history(tmp_path: Path) -> None:
    proc = run_py(JOB, str(tmp_path), str(REPO / "tests"))
    out = json.loads(proc.stdout)
    assert out["before_init"] == [], "nothing touched CUDA before the job initialised it"
    assert out["notes"] == [], out["notes"]
    assert "mem_get_info" in out["calls"] and "attach_observer" in out["calls"]
    assert out["history"][0]["max_entries"] == 10_000 and out["history"][-1] == {"enabled": None}

    (ring_path,) = find_rings([tmp_path])
    table = ring_table(read_ring(ring_path))
    kind = table["kind"].cast("string")
    gpu = table.filter(pc.equal(kind, "gpu_sample")).to_pylist()
    assert gpu and {g["device"] for g in gpu} == {0}, "device 1 holds no memory: never sampled, no context made"
    g = gpu[-1]
    assert (g["gpu_allocated"], g["gpu_reserved"], g["gpu_peak_allocated"]) == (3 * GiB, 5 * GiB, 4 * GiB)
    assert (g["gpu_inactive_split"], g["gpu_alloc_retries"], g["gpu_ooms"]) == (5 << 20, 2, 1)
    assert (g["device_free"], g["device_total"]) == (10 * GiB, 80 * GiB)

    ooms = table.filter(pc.equal(kind, "oom")).to_pylist()
    assert len(ooms) == 2
    assert {(o["value"], o["device"], o["device_total"], o["device_free"], o["detail"]) for o in ooms} == {
        (2 * GiB, 0, 80 * GiB, GiB, "observer")
    }
    history = table.filter(pc.is_in(kind, value_set=pa.array(["alloc", "free", "segment_alloc"])))
    rows = history.to_pylist()
    addresses = [r["address"] for r in rows]
    # 5 allocs drained, then 7 more entries, of which the 8-entry history still held all: each exactly once
    assert addresses == [0x1000 + i for i in range(12)]
    assert [r["kind"] for r in rows[5:]] == ["free", "segment_alloc"] * 3 + ["free"]
    assert rows[3]["value"] == 512 << 3 and rows[3]["allocator_time_us"] == 1003 and rows[3]["device"] == 0
    from blackbox.cli import main

    assert main(["plot", str(ring_path), "-o", str(tmp_path / "gpu.png")]) == 0
    assert (tmp_path / "gpu.png").read_bytes()[:4] == b"\x89PNG"
    if os.environ.get("BLACKBOX_KEEP_PLOT"):
        shutil.copyfile(tmp_path / "gpu.png", os.environ["BLACKBOX_KEEP_PLOT"])
    snapshot = Path(str(ring_path) + ".oom-snapshot.pickle")
    assert snapshot.exists() and snapshot.stat().st_size > 0, "PyTorch's snapshot for its memory viewer"


def test_slow_backend_is_polled_less_often(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import time

    from blackbox.collect import gpu as _gpu

    probe = _gpu.GpuProbe()
    calls = []

    def slow() -> list[tuple[int, tuple[int, ...]]]:
        calls.append(1)
        t0 = time.thread_time()
        while time.thread_time() - t0 < 0.01:  # 10 ms of this thread's CPU a poll: at 0.5%, the next waits 2 s
            pass
        return [(0, (1,) * 9)]

    monkeypatch.setattr(probe, "_poll", slow)
    assert probe.poll() == [(0, (1,) * 9)]
    assert probe.poll() == [] and probe.poll() == []
    assert len(calls) == 1 and probe.last_cost_s >= 0.01


def test_a_poll_waiting_but_not_working_is_not_throttled(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A poll that waits (for the GIL behind a training loop, for a driver) costs the job nothing: it is
    not taken for a slow backend. On a GPU host, counting the wait kept a GPU unpolled for the job's life."""
    import time

    from blackbox.collect import gpu as _gpu

    probe = _gpu.GpuProbe()
    calls = []

    def waits() -> list[tuple[int, tuple[int, ...]]]:  # 1 s of waiting: the next poll is due unless the poll's
        calls.append(1)  # own CPU reached 5 ms (x 200 for MAX_DUTY; at 0.2 s, a loaded VM's 1 ms did, ci47's 3.10
        time.sleep(1.0)  # lane); counted as cost, the wait put the next poll MAX_WAIT_S (5 s) away
        return [(0, (1,) * 9)]

    monkeypatch.setattr(probe, "_poll", waits)
    assert probe.poll() and probe.poll() and len(calls) == 2


def test_one_slow_poll_waits_at_most_max_wait(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import time

    from blackbox.collect import gpu as _gpu

    probe = _gpu.GpuProbe()
    monkeypatch.setattr(_gpu.time, "thread_time", iter([0.0, 60.0]).__next__)  # a poll of a whole CPU minute
    monkeypatch.setattr(probe, "_poll", lambda: [])
    before = time.monotonic()
    probe.poll()
    assert probe._next - before <= _gpu.MAX_WAIT_S + 1.0
