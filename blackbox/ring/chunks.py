"""A ring file's slots read in chunks of CHUNK_SLOTS, holes skipped, the next chunk read ahead on a thread of
its own while the caller works on the last: the reads under ``slots``' passes."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numpy as np

from . import format as fmt
from .inputs import data_ranges

CHUNK_SLOTS = 1 << 15  # slots read at a time (4 MiB; two buffers of it, one being read ahead: see SlotFile)
READ_AHEAD = True  # a ring of several chunks is read a chunk ahead (off: every read in turn, for tests)


def bounds(at: int, count: int) -> np.ndarray:
    """[at, at + count] as slot indices (uint64): searched among uint64 indices, a list of Python ints
    would make numpy compare in float64, converting all the ring's indices at each call (0.6 ms a chunk)."""
    return np.array([at, at + count], np.uint64)


class SlotFile(contextlib.AbstractContextManager["SlotFile"]):
    """The slots of a ring file, read CHUNK_SLOTS at a time into one buffer, holes skipped. A ring of more
    than one chunk is read a chunk ahead, on a thread of its own and into a second buffer, while the caller
    works on the last one (``preadv`` and numpy's loops both let go of the GIL): copying the file's pages is
    most of a pass (a full ring's read_ring on the 2-vCPU VM, medians: 143-150 ms read in turn in chunks of
    8 MiB, 108-131 ms read ahead in chunks of 4 MiB). Used as a context: on leaving it no read is still in
    flight, so the caller may close ``fd``."""

    def __init__(self, fd: int, base: int, present: int) -> None:
        self.fd, self.base, self.present = fd, base, present
        self.scanned = 0
        self.pool = ThreadPoolExecutor(1, "blackbox-read") if READ_AHEAD and present > CHUNK_SLOTS else None
        self.ahead = self.pool  # None once it refuses a read
        self.bufs = [np.empty(min(CHUNK_SLOTS, present), fmt.RECORD_DTYPE) for _ in range(1 + bool(self.ahead))]

    def __exit__(self, *exc: object) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)

    def chunks(self, wanted: np.ndarray | None = None) -> Iterator[tuple[int, np.ndarray]]:
        """(first slot, the slots read) for every chunk holding data; with ``wanted`` (sorted slot
        indices), only the chunks holding one of them. The buffers are reused: copy what you keep."""
        self.scanned = 0
        spans = self._spans(wanted)
        span = next(spans, None)
        turn, ahead = 0, None  # ahead: the read of ``span`` into bufs[turn], begun while the last chunk was used
        try:
            while span is not None:
                at, count = span
                buf = self.bufs[turn]
                n = ahead.result() if ahead is not None else self._read(buf, at, count)
                ahead = None
                self.scanned += n
                if n < count:  # the file shrank while being read
                    self.present = at + n
                span = next(spans, None) if n == count else None
                if span is not None and self.ahead is not None:
                    try:
                        ahead = self.ahead.submit(self._read, self.bufs[turn ^ 1], *span)
                        turn ^= 1
                    except RuntimeError:  # the interpreter is shutting down (an atexit hook): read in turn
                        self.ahead = None
                if n:
                    yield at, buf[:n]
        finally:
            if ahead is not None:  # left early: the read must not outlive the generator (nor land later)
                wait([ahead])

    def runs(self) -> list[tuple[int, int]]:
        """(first slot, end) of each run of slots holding data, in file order (holes: never written)."""
        done, size, out = 0, fmt.RECORD_SIZE, []
        for lo, hi in data_ranges(self.fd, self.base, self.base + self.present * size):
            first, end = max(done, (lo - self.base) // size), min(self.present, -(-(hi - self.base) // size))
            if first < end:
                out.append((first, end))
            done = max(done, end)
        return out

    def _spans(self, wanted: np.ndarray | None) -> Iterator[tuple[int, int]]:
        """(first slot, count) of each chunk to read, in file order."""
        for first, end in self.runs():
            for at in range(first, end, CHUNK_SLOTS):
                count = min(CHUNK_SLOTS, end - at)
                if wanted is not None:
                    lo_i, hi_i = np.searchsorted(wanted, bounds(at, count))
                    if lo_i == hi_i:
                        continue
                yield at, count

    def _read(self, buf: np.ndarray, at: int, count: int) -> int:
        """Read ``count`` slots from slot ``at`` into ``buf``; how many whole slots the file held."""
        view: Any = buf[:count].view(np.uint8)  # numpy arrays are buffers; the stubs disagree
        return os.preadv(self.fd, [view], self.base + at * fmt.RECORD_SIZE) // fmt.RECORD_SIZE

