"""A writer really killed with SIGKILL: every acknowledged event comes back exactly once, in order."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import labels_of, spawn_py

from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring

WRITER = """
import sys, threading, blackbox
sys.setswitchinterval(1e-4)  # interleave the writers finely (the C path writes ~30k events per default slice)
rec = blackbox.arm(sys.argv[1], capacity=int(sys.argv[2]), sample_interval=0.002)
out, lock = sys.stdout, threading.Lock()
def work(k):
    mark, label = rec.mark, f"t{k}"
    i = 0
    while True:
        mark(label, i)
        if i % 256 == 0:
            with lock:
                out.write(f"{k} {i}\\n"); out.flush()   # "t{k} has written every value <= i"
        i += 1
threads = [threading.Thread(target=work, args=(k,), daemon=True) for k in range(3)]
for t in threads: t.start()
for t in threads: t.join()
"""


def _kill_after(ring: Path, capacity: int, seconds: float) -> dict[int, int]:
    child = spawn_py(WRITER, str(ring), str(capacity), stdout=subprocess.PIPE)  # BLACKBOX_WRITER is inherited
    assert child.stdout is not None
    fd = child.stdout.fileno()
    os.set_blocking(fd, False)
    acked: dict[int, int] = {}
    chunks: list[bytes] = []
    deadline = time.monotonic() + 30
    seen: set[bytes] = set()
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            chunk = b""
        if chunk:
            chunks.append(chunk)
            seen.update(line[:1] for line in chunk.splitlines())
            if len(seen) == 3 and deadline - time.monotonic() > seconds:
                deadline = time.monotonic() + seconds  # all threads running: kill at a random instant
        else:
            time.sleep(0.001)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL
    os.set_blocking(fd, True)
    while chunk := os.read(fd, 1 << 16):  # lines already in the pipe when it died
        chunks.append(chunk)
    child.stdout.close()
    buf = b"".join(chunks).decode()
    for line in buf.splitlines():
        if line.count(" ") == 1:
            k, i = map(int, line.split())
            acked[k] = max(acked.get(k, -1), i)
    return acked


@pytest.mark.slow
@pytest.mark.parametrize("capacity,seconds", [(1 << 20, 0.2), (4096, 0.2)], ids=["no-wrap", "wrapped"])
def test_sigkill_loses_no_acknowledged_event(
    tmp_path: Path, capacity: int, seconds: float, writer_backend: str
) -> None:
    for trial in range(3):
        ring_path = tmp_path / f"k{trial}.ring"
        acked = _kill_after(ring_path, capacity, seconds + random.uniform(0, 0.3))
        assert len(acked) == 3, "every writer thread acknowledged something"
        ring = read_ring(ring_path)
        r, rec = ring.records, ring.recovery
        assert not ring.clean
        assert ring.meta["writer"]["backend"] == writer_backend
        assert rec.torn <= 4  # at most one in-flight record per writing thread
        # the writers' own records in seq order never go back in time; the allocation hooks' samples (on by
        # default) may land between a writer's seq and its clock read, as signal records may (FORMAT.md, "Time")
        hooks = np.isin(r["kind"], [fmt.KIND_CODES["alloc_sample"], fmt.KIND_CODES["free_sample"]])
        assert np.all(np.diff(r["seq"].astype(np.int64)) > 0) and np.all(np.diff(r["time"][~hooks]) >= 0)
        labels = labels_of(ring)
        wrapped = rec.overwritten > 0
        for k, last_acked in acked.items():
            values = [int(v) for v, lab in zip(r["value"], labels, strict=True) if lab == f"t{k}"]
            if not values:  # all of this thread's events are older than the window
                assert wrapped
                continue
            assert values == list(range(values[0], values[0] + len(values))), "no gap, no duplicate"
            assert values[-1] >= last_acked
            if not wrapped:
                assert values[0] == 0
        samples = int((r["kind"] == fmt.KIND_CODES["sample"]).sum())
        assert samples > 0 or wrapped
