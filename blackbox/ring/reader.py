"""Reading a ring file as untrusted input: bounded reads, no pickle, no eval.

:func:`read_ring` salvages every record that passes the commit rule, even from
a truncated file, and counts what it had to drop. It raises a BlackboxError
subclass only when there is nothing trustworthy to read (no file, no magic, an
unknown version, a header whose checksum fails).
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import NotARingError, RingNotFoundError
from . import format as fmt

MAX_STRINGS_SIZE = 1 << 30
MAX_STACKS_SIZE = 1 << 30
MAX_CRASH_BYTES = 1 << 20  # faulthandler's output for up to 100 threads fits easily


@dataclass
class Recovery:
    """Counts that say how complete a recovered ring is."""

    slots: int  # capacity declared by the header
    slots_read: int  # slots present in the file (fewer if it was truncated)
    valid: int
    empty: int
    torn: int
    stale: int
    first_seq: int | None
    last_seq: int | None
    overwritten: int  # events older than the window, overwritten by wrap-around
    holes: int  # seqs inside the window with no valid record (torn, or a ticket never written)
    strings: int
    strings_damaged: int
    labels_lost: int = 0  # events whose label string was lost (region full or entry damaged)
    time_clamped: int = 0  # events whose stamp was raised to keep time non-decreasing

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Ring:
    """A ring read back: header, the valid records in seq order, and the strings."""

    path: Path
    header: fmt.Header
    records: np.ndarray
    strings: dict[int, str]
    recovery: Recovery
    file_size: int
    stacks: fmt.StackScan | None = None  # version 3: the stack table
    crash: str | None = None  # version 3: faulthandler's output in the crash region, if a native crash wrote any

    @property
    def meta(self) -> dict[str, Any]:
        """The header's metadata JSON (identity, clock, versions)."""
        return self.header.meta

    @property
    def clean(self) -> bool:
        """True when the writer recorded a clean end (disarm); a signal that landed while the job shut
        down may be recorded after it."""
        kinds = self.records["kind"]
        return bool((kinds[-8:] == fmt.KIND_CODES["disarm"]).any()) or self.header.state == fmt.STATE_CLEAN


def read_header(path: str | os.PathLike[str]) -> fmt.Header:
    """Only the header of a ring (two bounded reads): cheap enough to scan a folder of big rings."""
    name = str(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            prefix = f.read(fmt.PREFIX_SIZE)
            if len(prefix) < fmt.PREFIX_SIZE or prefix[:8] != fmt.MAGIC:
                return fmt.decode_header(prefix, size, name)  # raises, naming what it found
            meta_len = int.from_bytes(prefix[56:64], "little")
            f.seek(0)
            head = f.read(fmt.PREFIX_SIZE + min(meta_len, fmt.MAX_HEADER_SIZE))
    except FileNotFoundError:
        raise RingNotFoundError(f"{name}: expected a ring file, found nothing at that path") from None
    except OSError as exc:
        raise RingNotFoundError(f"{name}: expected a readable ring file, found {exc.strerror}") from None
    return fmt.decode_header(head, size, name)


def read_ring(path: str | os.PathLike[str]) -> Ring:
    """Read and validate one ring file."""
    p = Path(path)
    name = str(p)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RingNotFoundError(f"{name}: expected a ring file, found nothing at that path") from None
    except IsADirectoryError:
        raise RingNotFoundError(f"{name}: expected a ring file, found a directory") from None
    except OSError as exc:
        raise RingNotFoundError(f"{name}: expected a readable ring file, found {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotARingError(f"{name}: expected a regular ring file, found a special file")
        size = st.st_size
        prefix = os.pread(fd, fmt.PREFIX_SIZE, 0)
        if prefix[:8] != fmt.MAGIC:
            fmt.decode_header(prefix, size, name)  # raises NotARingError naming what it found
        if len(prefix) < fmt.PREFIX_SIZE:
            raise NotARingError(f"{name}: expected a ring header of {fmt.PREFIX_SIZE} bytes, found a {size}-byte file")
        meta_len = int.from_bytes(prefix[56:64], "little")
        head = os.pread(fd, fmt.PREFIX_SIZE + min(meta_len, fmt.MAX_HEADER_SIZE), 0)
        header = fmt.decode_header(head, size, name)
        strings_size = max(0, min(header.strings_size, size - header.strings_offset, MAX_STRINGS_SIZE))
        region = os.pread(fd, strings_size, header.strings_offset) if strings_size else b""
        scan = fmt.scan_strings(region)
        stacks = crash = None
        if header.version >= 3:
            n = max(0, min(header.stacks_size, size - header.stacks_offset, MAX_STACKS_SIZE))
            stacks = fmt.scan_stacks(os.pread(fd, n, header.stacks_offset) if n else b"")
            n = max(0, min(size - header.crash_offset, MAX_CRASH_BYTES))
            text = os.pread(fd, n, header.crash_offset).rstrip(b"\0") if n else b""
            crash = text.decode("utf-8", "replace") if text.strip() else None
        avail = max(0, size - header.records_offset) // fmt.RECORD_SIZE
        n_slots = min(header.capacity, avail)
        slots = np.empty(n_slots, dtype=fmt.RECORD_DTYPE)
        if n_slots:
            with os.fdopen(os.dup(fd), "rb", buffering=0) as f:
                f.seek(header.records_offset)
                target: Any = slots.view(np.uint8)  # numpy arrays are buffers; stubs disagree
                got = f.readinto(target)
            n_slots = (got or 0) // fmt.RECORD_SIZE
            slots = slots[:n_slots]
    finally:
        os.close(fd)
    census = fmt.classify(slots, header.capacity)
    records = take(slots, seq_order(slots["seq"], np.flatnonzero(census.valid)))
    seqs = records["seq"]
    first = int(seqs[0]) if len(seqs) else None
    last = int(seqs[-1]) if len(seqs) else None
    holes = (last - first + 1 - len(seqs)) if first is not None and last is not None else 0
    recovery = Recovery(
        slots=header.capacity,
        slots_read=n_slots,
        valid=len(records),
        empty=census.empty,
        torn=census.torn,
        stale=census.stale,
        first_seq=first,
        last_seq=last,
        overwritten=(first - 1) if first is not None else 0,
        holes=holes,
        strings=scan.entries,
        strings_damaged=scan.damaged,
    )
    return Ring(p, header, records, scan.strings, recovery, size, stacks, crash)


def take(slots: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``slots[order]``, as a view or two block copies when ``order`` is one or two contiguous runs
    (the usual case: a ring that wrapped, or one not yet full), else a gather."""
    n = len(order)
    if n == 0:
        return slots[:0]
    breaks = np.flatnonzero(np.diff(order) != 1)
    if len(breaks) == 0:
        return slots[order[0] : order[0] + n]
    if len(breaks) == 1:
        k = int(breaks[0]) + 1
        a, b = int(order[0]), int(order[k])
        return np.concatenate([slots[a : a + k], slots[b : b + n - k]])
    gathered: np.ndarray = slots[order]
    return gathered


def seq_order(seq: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """Slot indices ``idx`` reordered by seq. Valid slots hold seq % capacity, so in slot
    order their seqs form at most two ascending runs: a rotation, found in linear time."""
    s = seq[idx]
    drops = np.flatnonzero(s[1:] < s[:-1])
    if len(drops) == 0:
        return idx
    if len(drops) == 1:
        k = int(drops[0]) + 1
        rotated = np.concatenate([idx[k:], idx[:k]])
        if s[-1] < s[0]:
            return rotated
    return idx[np.argsort(s, kind="stable")]


def find_rings(paths: list[Path]) -> list[Path]:
    """Expand folders to the ``*.ring`` files inside them (sorted); keep files as given."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith(".ring") and q.is_file())
            if not found:
                raise RingNotFoundError(f"{p}: expected a folder holding *.ring files, found none")
            out.extend(found)
        elif p.exists():
            out.append(p)
        else:
            raise RingNotFoundError(f"{p}: expected a ring file or a folder of rings, found nothing")
    return out
