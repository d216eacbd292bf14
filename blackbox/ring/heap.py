"""Reading a version-4 ring's heap table back: the sampled blocks live at the last write.

Each 64-byte slot (``format.HEAP_DTYPE``) is one sampled allocation that had not
been freed: the allocating process wrote it after the allocation and emptied it
(address first) before the free, so at a kill the table holds what was live. A
slot is valid when its address is not 0 and its check word matches its other
words; one cut by the kill mid-write fails the check and is counted as torn.
Pure over bytes and a descriptor, like ``scan``; reads are bounded by the bytes
really in the file.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from . import format as fmt
from .inputs import data_ranges
from .scan import StackScan

MAX_ALLOC_TEXT = 8 << 20  # folded text of a ring's allocation stacks rendered, at most
ALLOC_NOT_RENDERED = (
    "<blackbox: allocation stack {:#018x} not rendered (the ring's allocation stacks pass 8 MiB of folded text)>"
)
MAX_HEAP_SIZE = 1 << 26  # 1 M slots read at most (a writer makes 64 K): a hostile header's size buys nothing more
HEAP_CHUNK = 1 << 20  # bytes of the table read and decoded at a time


@dataclass
class HeapScan:
    slots: np.ndarray  # HEAP_DTYPE: the valid slots, in slot order
    torn: int  # non-empty slots whose check failed (cut mid-write, or damaged)


def decode_heap(region: bytes | bytearray | memoryview) -> HeapScan:
    """The valid slots of a heap table (or of a part of it that starts on a slot)."""
    n = len(region) // fmt.HEAP_SLOT
    slots = np.frombuffer(region, fmt.HEAP_DTYPE, count=n)
    used = slots[slots["address"] != 0]
    ok = fmt.heap_check(used) == used["check"]
    return HeapScan(used[ok].copy(), int((~ok).sum()))


def read_heap(fd: int, header: fmt.Header, size: int) -> HeapScan | None:
    """The heap table of the ring open at ``fd`` (``size`` bytes); None before version 4 or without one."""
    if header.version < 4 or header.heap_size <= 0:
        return None
    n = max(0, min(header.heap_size, size - header.heap_offset, MAX_HEAP_SIZE))
    start, end = header.heap_offset, header.heap_offset + n - n % fmt.HEAP_SLOT
    # decoded a chunk at a time into one array, which only its valid slots touch: memory follows the
    # valid slots, not the table's bytes read (a whole table held, then copied, took four times it)
    slots = np.empty(n // fmt.HEAP_SLOT, fmt.HEAP_DTYPE)
    kept = torn = 0
    done = start
    for lo, hi in data_ranges(fd, start, end):
        lo = max(done, lo - (lo - start) % fmt.HEAP_SLOT)
        done = min(end, hi + (start - hi) % fmt.HEAP_SLOT)  # a slot cut by a hole: its zeros read too
        for at in range(lo, done, HEAP_CHUNK):
            part = decode_heap(os.pread(fd, min(HEAP_CHUNK, done - at), at))
            slots[kept : kept + len(part.slots)] = part.slots
            kept, torn = kept + len(part.slots), torn + part.torn
    return HeapScan(slots[:kept], torn)


@dataclass
class AllocStack:
    folded: str  # outermost frame first, ``;``-joined (as a stack_sample's ``detail``)
    thread: str  # the name of the thread that first allocated from it ("" unknown)
    line: str  # the source line of its innermost frame outside libraries ("" unknown)


def alloc_stack(table: StackScan | None, fingerprint: int) -> AllocStack:
    """The text of an allocation stack named by its fingerprint: from any generation of the stack table
    that still holds the entry and all its frames; else the unwritten placeholder."""
    found = _rendered(table, fingerprint, None)
    assert found is not None  # no budget: always rendered
    return found


def alloc_stacks(table: StackScan | None, fingerprints: Iterable[int]) -> dict[int, AllocStack]:
    """``alloc_stack`` of each fingerprint, given the most used first: rendered while their folded text
    stays within MAX_ALLOC_TEXT (64 frames of 1 KiB fold to 64 KiB, and a stack table of 8 MiB holds
    tens of thousands of entries); the rest read ``ALLOC_NOT_RENDERED``, naming their fingerprint."""
    out: dict[int, AllocStack] = {}
    budget = [MAX_ALLOC_TEXT]
    written = table.allocs if table is not None else {}
    unwritten = AllocStack(fmt.STACK_UNWRITTEN_TEXT, "", "")  # one for all (a million, in a hostile heap)
    for fingerprint in fingerprints:
        fingerprint &= (1 << 64) - 1
        if fingerprint not in written and fingerprint != fmt.NO_PYTHON_STACK:
            out[fingerprint] = unwritten
        elif fingerprint not in out:
            found = _rendered(table, fingerprint, budget)
            out[fingerprint] = found or AllocStack(ALLOC_NOT_RENDERED.format(fingerprint), "", "")
    return out


def _rendered(table: StackScan | None, fingerprint: int, budget: list[int] | None) -> AllocStack | None:
    """The AllocStack of ``fingerprint``; None where its folded text would pass what ``budget`` has left
    (which it is then charged, in UTF-8 bytes at most)."""
    fingerprint &= (1 << 64) - 1
    if fingerprint == fmt.NO_PYTHON_STACK:
        return AllocStack(fmt.NO_PYTHON_TEXT, "", "")
    entries = table.allocs.get(fingerprint, []) if table is not None else []
    # the tick's entry (with the source line and the thread's name) before the hooks' own (written at sample time)
    for gen, ids, depth, thread, line in sorted(entries, key=lambda e: (not e[4], not e[3])):
        names = [table.frames.get((gen, f)) for f in ids] if table is not None else []
        if names and None not in names:
            texts = [n for n in names if n is not None]
            if depth > len(texts):
                texts.insert(0, fmt.STACK_TRUNCATED_TEXT)
            if budget is not None:
                cost = sum(len(t) if t.isascii() else 4 * len(t) for t in texts) + len(texts)
                if cost > budget[0]:
                    return None
                budget[0] -= cost
            return AllocStack(";".join(texts), thread, line)
    return AllocStack(fmt.STACK_UNWRITTEN_TEXT, "", "")
