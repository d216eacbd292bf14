"""Reading the string region and the stack table back: every intact entry, past damage.

Entries are appended from the start of a region (of each half, for the stack
table) and checked by their CRC; a damaged one is skipped and the scan
resynchronises on a later 8-byte boundary that holds an intact entry. The
candidates are found at once with numpy, zeroed runs are skipped at once, and
the checksums tried while resynchronising are capped (``RESYNC_WORK``), so
hostile input (a region of near-miss entries) costs time in proportion to its
size; the numpy work goes a window at a time, so memory stays that of the
region itself. What the entries kept cost once decoded is bounded too
(``MAX_STRING_TEXT``, ``MAX_STACK_TEXT``): a hostile region packed with long or
tiny entries would otherwise decode to several times its size. Past the bound the
rest of a region is not read, as a writer drops what does not fit. Pure
functions over bytes, like ``format``.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from .format import (
    MAX_FRAME_BYTES,
    MAX_STACK_DEPTH,
    MAX_STRING_BYTES,
    STACK_ENTRY,
    STACK_FRAME,
    STACK_STACK,
    STRING_ENTRY,
    STRING_ID_STRUCT,
    pad8,
    stack_crc,
)

Buffer = bytes | bytearray | memoryview


# What the entries kept from one region may cost once decoded: their bytes plus ENTRY_COST each (a Python
# object and a dict slot). The writer's regions are 1 MiB each (the string region by default), so a ring
# of its own stays far below; past the bound the rest of the region is not read (counted in ``cut``), as
# a writer drops a label once its region is full.
MAX_STRING_TEXT = 16 << 20
MAX_STACK_TEXT = 8 << 20  # the whole stack table: half of it per half
ENTRY_COST = 96


@dataclass
class Budget:
    """Memory the entries kept from a region may still take; ``cut``: bytes of the region left unread once
    it was spent."""

    left: int
    cut: int = 0

    def take(self, cost: int) -> bool:
        """Charge one entry; False (and nothing charged) once it would not fit."""
        if cost > self.left:
            self.left = -1
            return False
        self.left -= cost
        return True

    @property
    def spent(self) -> bool:
        return self.left < 0


@dataclass
class StringScan:
    strings: dict[int, str]
    entries: int
    damaged: int  # entries skipped because their CRC or bounds did not hold
    cut: int = 0  # bytes of the region not read: its entries would have passed MAX_STRING_TEXT


@dataclass
class StackScan:
    frames: dict[tuple[int, int], str]  # (generation, id) -> "function (file:line)", never holding ";" or a line break
    stacks: dict[tuple[int, int], array[int]]  # (generation, id) -> frame ids, outermost first (4 bytes each)
    damaged: int
    cut: int = 0  # bytes of the table not read: its entries would have passed MAX_STACK_TEXT


def frame_text(payload: bytes) -> str:
    """A frame's text as folded stacks need it: the writer writes a ``;`` in a name as ``,`` and line
    breaks as spaces (FORMAT.md), and so does the reader, whoever wrote the ring, so that a frame never
    splits in two nor a folded line in two."""
    return payload.decode("utf-8", "replace").replace(";", ",").replace("\n", " ").replace("\r", " ")


# Resynchronising past damage tries each later 8-byte position whose header could be an entry. Hostile
# input can make every position such a near miss; the checksums tried are capped at RESYNC_WORK bytes
# per byte scanned (each try costing at least RESYNC_TRY), after which the rest counts as damaged.
RESYNC_WORK = 4
RESYNC_TRY = 512
MAX_WINDOW = 1 << 16  # 8-byte blocks looked at by numpy at once; windows grow from 64 to this


def _windows(start: int, end: int) -> Iterator[tuple[int, int]]:
    """[lo, hi) byte windows of 8-byte blocks from ``start`` to ``end``, growing: a search that ends soon
    costs little, a long one goes at numpy's pace."""
    lo, blocks = start - start % 8, 64
    while lo < end:
        hi = min(end, lo + blocks * 8)
        yield lo, hi
        lo, blocks = hi, min(MAX_WINDOW, blocks * 2)


def _u4(buf: Buffer, lo: int, hi: int) -> np.ndarray:
    """The u4 words of buf[lo:hi] as (blocks, 2) (``hi - lo`` a multiple of 8)."""
    return np.frombuffer(buf, "<u4", count=(hi - lo) // 4, offset=lo).reshape(-1, 2)


def _tail(buf: Buffer) -> int:
    """The length of ``buf`` without its run of trailing zero bytes (nothing was written there)."""
    a = np.frombuffer(buf, np.uint8)
    for hi in range(len(a), 0, -MAX_WINDOW * 8):
        lo = max(0, hi - MAX_WINDOW * 8)
        used = np.flatnonzero(a[lo:hi])
        if len(used):
            return lo + int(used[-1]) + 1
    return 0


def _nonzero_after(buf: Buffer, pos: int) -> int:
    """The first 8-byte block at or after ``pos`` that is not all zero (the end if none): a zeroed run
    is skipped at once, not 8 bytes at a time."""
    end = len(buf) - len(buf) % 8
    for lo, hi in _windows(pos, end):
        used = np.flatnonzero(np.frombuffer(buf, "<u8", count=(hi - lo) // 8, offset=lo))
        if len(used):
            return max(pos, lo + int(used[0]) * 8)
    return len(buf)


class _Resync:
    """Later positions that could hold an entry (``candidates`` finds them in a window), and the checksum
    work left to try them."""

    def __init__(self, buf: Buffer, candidates: Callable[[Buffer, int, int], np.ndarray]) -> None:
        self.buf, self.candidates = buf, candidates
        self.budget = RESYNC_WORK * len(buf) + (1 << 20)

    def after(self, pos: int, tail: int) -> Iterator[int]:
        for lo, hi in _windows(pos, min(pad8(tail), len(self.buf) - len(self.buf) % 8)):
            for at in self.candidates(self.buf, lo, hi).tolist():
                if at >= tail:
                    return
                if at >= pos:
                    yield at

    def spend(self, n: int) -> bool:
        """Charge one try of ``n`` bytes; False once the work is spent."""
        self.budget -= max(n, RESYNC_TRY)
        return self.budget >= 0


def _string_candidates(buf: Buffer, lo: int, hi: int) -> np.ndarray:
    w = _u4(buf, lo, hi)
    pos = lo + np.arange(len(w), dtype=np.int64) * 8
    ok = (w[:, 0] != 0) & (w[:, 1] <= MAX_STRING_BYTES) & (pos + STRING_ENTRY.size + w[:, 1] <= len(buf))
    found: np.ndarray = pos[ok]
    return found


def scan_strings(region: Buffer, budget: Budget | None = None) -> StringScan:
    """Read every intact entry of a string region, resynchronising past damage (with bounded work), while
    the entries kept fit ``budget`` (MAX_STRING_TEXT when not given)."""
    buf = region
    size = len(buf)
    budget = budget if budget is not None else Budget(MAX_STRING_TEXT)
    tail = _tail(buf)  # from here on every byte is zero: nothing was ever written
    out: dict[int, str] = {}
    damaged = 0
    pos = 0
    resync = _Resync(buf, _string_candidates)
    while pos + STRING_ENTRY.size <= size and not budget.spent:
        sid, n, crc, _ = STRING_ENTRY.unpack_from(buf, pos)
        if sid == 0 and n == 0 and crc == 0:
            if pos >= tail:
                break
            pos = _nonzero_after(buf, pos + 8)
            continue
        end = pos + STRING_ENTRY.size + n
        if 0 < sid and n <= MAX_STRING_BYTES and end <= size:
            data = bytes(buf[pos + STRING_ENTRY.size : end])
            if zlib.crc32(data, zlib.crc32(STRING_ID_STRUCT.pack(sid, n))) == crc:
                if sid not in out:
                    if not budget.take(n + ENTRY_COST):
                        budget.cut += tail - pos
                        break
                    out[sid] = data.decode("utf-8", "replace")
                pos = pad8(end)
                continue
        damaged += 1
        pos = _next_string(buf, pos + 8, tail, resync)
    return StringScan(out, len(out), damaged, budget.cut)


def _next_string(buf: Buffer, start: int, tail: int, resync: _Resync) -> int:
    """The first position from ``start`` holding an intact string entry, else the zero tail (or the end,
    once the resynchronisation work is spent)."""
    for pos in resync.after(start, tail):
        sid, n, crc, _ = STRING_ENTRY.unpack_from(buf, pos)
        if not resync.spend(STRING_ENTRY.size + n):
            return len(buf)
        data = buf[pos + STRING_ENTRY.size : pos + STRING_ENTRY.size + n]
        if zlib.crc32(data, zlib.crc32(STRING_ID_STRUCT.pack(sid, n))) == crc:
            return pos
    return max(start, pad8(tail))


def scan_string_spans(spans: list[tuple[int, bytearray]]) -> StringScan:
    """``scan_strings`` over a region given as its non-zero spans (``inputs.nonzero_spans``), within one
    budget: a span met once it is spent is not read."""
    out: dict[int, str] = {}
    damaged = 0
    budget = Budget(MAX_STRING_TEXT)
    for _, span in spans:
        if budget.spent:
            budget.cut += _tail(span)
            continue
        part = scan_strings(span, budget)
        for sid, text in part.strings.items():
            out.setdefault(sid, text)
        damaged += part.damaged
    return StringScan(out, len(out), damaged, budget.cut)


def scan_stacks(region: Buffer) -> StackScan:
    """Every intact entry of a stack table (both halves), resynchronising past damage (bounded work)."""
    view = memoryview(region).cast("B")
    half = len(view) // 2
    out = StackScan({}, {}, 0)
    for lo in (0, half):
        budget = Budget(MAX_STACK_TEXT // 2)
        _scan_stack_part(view[lo : lo + half], out, budget)
        out.cut += budget.cut
    return out


def scan_stack_spans(spans: list[tuple[int, bytearray]], size: int) -> StackScan:
    """``scan_stacks`` over a table of ``size`` bytes given as its non-zero spans (``inputs.nonzero_spans``,
    which cuts at page boundaries, so no span's entry crosses the halves' boundary once split there)."""
    half = size // 2
    out = StackScan({}, {}, 0)
    budgets = (Budget(MAX_STACK_TEXT // 2), Budget(MAX_STACK_TEXT // 2))  # one per half
    for at, span in spans:
        view = memoryview(span)
        for which, (lo, hi) in enumerate(((at, min(at + len(span), half)),
                                          (max(at, half), min(at + len(span), 2 * half)))):  # fmt: skip
            if lo >= hi:
                continue
            if budgets[which].spent:
                budgets[which].cut += _tail(view[lo - at : hi - at])
                continue
            _scan_stack_part(view[lo - at : hi - at], out, budgets[which])
    out.cut = sum(b.cut for b in budgets)
    return out


def _stack_candidates(buf: Buffer, lo: int, hi: int) -> np.ndarray:
    hi = min(hi, len(buf) - len(buf) % 8 - 16)  # an entry's header is three blocks
    if hi <= lo:
        return np.zeros(0, np.int64)
    w, nxt = _u4(buf, lo, hi), _u4(buf, lo + 8, hi + 8)
    pos = lo + np.arange(len(w), dtype=np.int64) * 8
    gen, kind, n = w[:, 0], w[:, 1] & 0xFFFF, nxt[:, 1].astype(np.int64)
    limit = np.where(kind == STACK_FRAME, MAX_FRAME_BYTES, 4 * MAX_STACK_DEPTH)
    ok = (gen != 0) & ((kind == STACK_FRAME) | (kind == STACK_STACK)) & (n <= limit)
    found: np.ndarray = pos[ok & (pos + STACK_ENTRY.size + n <= len(buf))]
    return found


def _scan_stack_part(part: Buffer, out: StackScan, budget: Budget) -> None:
    tail = _tail(part)
    pos, damaged = 0, False
    resync = _Resync(part, _stack_candidates)
    while pos + STACK_ENTRY.size <= len(part) and not budget.spent:
        gen, kind, _, sid, n, crc, _ = STACK_ENTRY.unpack_from(part, pos)
        if gen == 0 and n == 0 and crc == 0:
            if pos >= tail:
                break
            pos = _nonzero_after(part, pos + 8)
            continue
        end = pos + STACK_ENTRY.size + n
        limit = MAX_FRAME_BYTES if kind == STACK_FRAME else 4 * MAX_STACK_DEPTH
        if gen and kind in (STACK_FRAME, STACK_STACK) and n <= limit and end <= len(part):
            payload = bytes(part[pos + STACK_ENTRY.size : end])
            if stack_crc(gen, kind, sid, payload) == crc and (kind == STACK_FRAME or n % 4 == 0):
                kept = out.frames if kind == STACK_FRAME else out.stacks
                if (gen, sid) not in kept:
                    if not budget.take(ENTRY_COST + n):
                        budget.cut += tail - pos
                        return
                    if kind == STACK_FRAME:
                        out.frames[(gen, sid)] = frame_text(payload)
                    else:
                        out.stacks[(gen, sid)] = _frame_ids(payload)
                pos, damaged = pad8(end), False
                continue
        out.damaged += not damaged  # one damaged run counts once, however far the resync walks
        damaged = True
        pos = _next_stack_entry(part, pos + 8, tail, resync)


_U4 = "I" if array("I").itemsize == 4 else "L"


def _frame_ids(payload: bytes) -> array[int]:
    """A stack's u4 frame ids, kept as 4 bytes each (a tuple of ints would take 9 times its bytes)."""
    ids = array(_U4, payload)
    if sys.byteorder == "big":
        ids.byteswap()
    return ids


def _next_stack_entry(buf: Buffer, start: int, tail: int, resync: _Resync) -> int:
    for pos in resync.after(start, tail):
        gen, kind, _, sid, n, crc, _ = STACK_ENTRY.unpack_from(buf, pos)
        if not resync.spend(STACK_ENTRY.size + n):
            return len(buf)
        if stack_crc(gen, kind, sid, bytes(buf[pos + STACK_ENTRY.size : pos + STACK_ENTRY.size + n])) == crc:
            return pos
    return max(start, pad8(tail))
