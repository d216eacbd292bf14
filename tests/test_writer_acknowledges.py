"""A write call that returned has its record in the ring: the record's clock, read as it is written, is never
later than the moment its own call returned, whichever threads write at once.

What a SIGKILL test meets only by chance (CI: ``test_sigkill_loses_no_acknowledged_event[python-no-wrap]``
once in many runs), forced here: a garbage collection at every allocation whose callback lets the other
threads run, so threads switch inside the write calls (a collection runs Python code wherever an object is
allocated: the job's finalizers do the same). The Python write path once wrote the oldest queued record,
whoever queued it, so a thread could return while its own record waited for another thread's write, and a
SIGKILL then lost an acknowledged event.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import labels_of

import blackbox
from blackbox.ring.reader import read_ring

THREADS, MARKS = 4, 3000


@pytest.mark.parametrize("writer_backend", ["c", "python"], indirect=True)
def test_a_mark_is_in_the_ring_when_its_call_returns(tmp_path: Path, writer_backend: str) -> None:
    rec = blackbox.Recorder.arm(tmp_path / "t.ring", capacity=1 << 16, sample_interval=3600, allocations=False)
    assert rec.writer_backend == writer_backend
    acked: dict[int, list[int]] = {k: [] for k in range(THREADS)}
    start = threading.Barrier(THREADS)

    def writer(k: int) -> None:
        mark, now, out = rec.mark, time.monotonic_ns, acked[k]
        start.wait()
        for i in range(MARKS):
            mark(f"t{k}", i)
            out.append(now())

    def let_others_run(phase: str, info: dict[str, int]) -> None:
        time.sleep(0)

    interval, threshold = sys.getswitchinterval(), gc.get_threshold()
    sys.setswitchinterval(1e-6)
    gc.set_threshold(1)
    gc.callbacks.append(let_others_run)
    try:
        threads = [threading.Thread(target=writer, args=(k,)) for k in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.callbacks.remove(let_others_run)
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)
        rec.disarm()
    ring = read_ring(tmp_path / "t.ring")
    labels = labels_of(ring)
    late = []
    for k in range(THREADS):
        mine = [(int(v), int(t)) for v, t, lab in zip(ring.records["value"], ring.records["time"], labels,
                                                      strict=True) if lab == f"t{k}"]  # fmt: skip
        assert [v for v, _ in mine] == list(range(MARKS)), f"thread {k}: every mark once, in order"
        late += [(k, v, t - acked[k][v]) for v, t in mine if t > acked[k][v]]
    assert not late, f"{len(late)} records written after their call returned (thread, value, ns late): {late[:5]}"
