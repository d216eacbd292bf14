"""A ring's slots read as untrusted input: the commit rule applied to each (``format.classify``), the valid
records kept in seq order, column-major (``columns``), and every other slot counted.

A full ring's slots are most of what recovering it reads and holds. They are read in chunks of CHUNK_SLOTS,
holes skipped, a chunk ahead on a thread of its own (``SlotFile``). A ring whose window starts where a few
probes say (``_oldest``: a binary search for where its seqs wrap) is read once, each valid slot copied to its
place as its chunk is read (``_one_pass``); any other is read twice (``_two_passes``): once to classify every
slot, once to copy the valid ones to their places. Both give the same records and counts (tests/test_one_pass.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from . import columns
from . import format as fmt
from .chunks import CHUNK_SLOTS, SlotFile, bounds

ONE_PASS = True  # a ring whose window the probes find is read once (off: every ring read in two passes, for tests)


@dataclass
class Slots:
    """The valid records of a ring in seq order (column-major, ``columns``), and the census of every slot."""

    words: columns.Words
    read: int  # slots present in the file (fewer than the capacity if it was truncated)
    empty: int
    torn: int
    stale: int


def read_slots(fd: int, header: fmt.Header, size: int) -> Slots:
    """Apply the commit rule (see ``format.classify``) to every slot, CHUNK_SLOTS at a time, skipping holes.

    A ring read in one chunk, or in several whose window ``_oldest`` finds, is read once (``_one_pass``);
    any other in two passes over the file (``_two_passes``): the first classifies every slot and keeps only
    the seq of the intact ones (8 bytes each); the second copies the valid slots straight to their place in
    seq order, column-major (``columns``). So memory is the valid records (at most the slots holding data)
    plus two chunks, whatever the capacity a header declares. A slot that changed between the passes (a live
    writer) is dropped and counted as torn.
    """
    cap, base = header.capacity, header.records_offset
    with SlotFile(fd, base, min(cap, max(0, size - base) // fmt.RECORD_SIZE)) as slots:
        once = _one_pass(slots, header) if ONE_PASS and slots.present > CHUNK_SLOTS else None
        return once if once is not None else _two_passes(slots, header)


def _two_passes(slots: SlotFile, header: fmt.Header) -> Slots:
    """``read_slots`` over the slots of an open file, in two passes: any ring."""
    cap = header.capacity
    indices, seqs, kinds = [], [], []
    empty = torn = 0
    read: list[tuple[int, np.ndarray]] = []  # the chunks of the first pass (views of reused buffers)
    for at, chunk in slots.chunks():
        read.append((at, chunk))
        index = np.arange(at, at + len(chunk), dtype=np.uint64)
        intact, blank, cut = _census(chunk, index, cap)
        indices.append(index[intact])
        seqs.append(chunk["seq"][intact])
        kinds.append(chunk["kind"][intact])
        empty, torn = empty + blank, torn + cut
    empty += slots.present - slots.scanned  # holes: never written
    index = np.concatenate(indices) if indices else np.zeros(0, np.uint64)
    seq = np.concatenate(seqs) if seqs else np.zeros(0, np.uint64)
    head = int(seq.max()) if len(seq) else 0
    inside = seq > np.uint64(head - min(head, cap))
    stale = int((~inside).sum())
    index, seq = index[inside], seq[inside]
    dest = _seq_positions(seq)
    plan = columns.plan(header.version, np.concatenate(kinds)[inside] if kinds else np.zeros(0, np.uint8))
    words = columns.empty(len(seq), plan)
    copied = np.zeros(len(seq), bool)
    # a ring read in one chunk is copied from that read (the buffer still holds it): one snapshot, so nothing
    # can change between the passes (a tiny ring's second read cost as much as the rest of its decode)
    second = read if len(read) == 1 and len(index) else slots.chunks(index)
    for at, chunk in second:
        lo, hi = np.searchsorted(index, bounds(at, len(chunk)))
        if _copied_in_place(chunk, at, index[lo:hi], seq[lo:hi], dest[lo:hi], words, plan):
            copied[lo:hi] = True
            continue
        rows = _words(chunk)[(index[lo:hi] - np.uint64(at)).astype(np.intp)]  # whole slots, not field by field
        same = (rows[:, _SEQ] == seq[lo:hi]) & (rows[:, _COMMIT] == rows[:, _SEQ])
        columns.put(words, dest[lo:hi][same], rows[same], plan)
        copied[lo:hi] = same
    if not copied.all():  # changed since the first pass: drop them
        torn += int((~copied).sum())
        words = columns.take(words, np.sort(dest[copied]))
    return Slots(words, slots.present, empty, torn, stale)


_EVERY_KIND = np.arange(256, dtype=np.uint8)


def _one_pass(slots: SlotFile, header: fmt.Header) -> Slots | None:
    """``read_slots`` in one pass: each valid slot copied to its place (its seq less the window's first,
    which ``_oldest`` found) as its chunk is read, then the places no record took closed up. None (nothing
    kept) where a slot's place falls outside the room made: the window is not where the probes said (a slot
    of an older round, a slot changed meanwhile, a ring torn where a probe looked), and the caller reads
    the ring in two passes, which sorts out any ring. A full ring on the 2-vCPU VM: the second read of
    every slot saved (128 MiB copied from the page cache, and its checks)."""
    runs = slots.runs()
    # the slots holding data, as the file says where its holes are and as its blocks say (a filesystem that cannot
    # tell holes, NFS or FUSE, calls all of a sparse file data): no more valid records than these, and the rows
    # made for them at once bounded by the bytes the file really holds, whatever capacity a header declares
    room = min(sum(end - first for first, end in runs), os.fstat(slots.fd).st_blocks * 512 // fmt.RECORD_SIZE)
    oldest = _oldest(slots, header.capacity, runs)
    if oldest is None or room == 0:
        return None
    low = np.uint64(oldest)
    plan = columns.plan(header.version, _EVERY_KIND)  # the kinds are not known before the pass: any kind's words
    words = columns.empty(room, plan)
    taken = np.zeros(room, bool)
    seen = np.zeros(256, bool)  # the kinds of the valid records
    empty = torn = count = 0
    top = -1  # the last place taken
    for at, chunk in slots.chunks():
        intact, blank, cut = _census(chunk, np.arange(at, at + len(chunk), dtype=np.uint64), header.capacity)
        rows, seq = _words(chunk), chunk["seq"]
        if blank or cut:
            empty, torn = empty + blank, torn + cut
            rows, seq = rows[intact], seq[intact]
            if not len(seq):
                continue
        place = seq - low  # uint64: a seq below the window's first wraps to far beyond the room
        n, first, last = len(place), int(place[0]), int(place[-1])
        if last - first == n - 1 and first <= last < room and (n == 1 or bool((np.diff(place) == 1).all())):
            where: slice | np.ndarray = slice(first, last + 1)  # a run of neighbours: a block copy
            top = max(top, last)
        else:
            highest = int(place.max())
            if highest >= room:
                return None
            where, top = place.astype(np.intp), max(top, highest)
        columns.put(words, where, rows, plan)
        taken[where] = True
        seen[chunk["kind"][intact]] = True
        count += n
    empty += slots.present - slots.scanned  # holes: never written
    if count != top + 1:  # places no valid slot took (torn slots, a seq never written): closed up, but the words
        # no kind present uses (zero pages never touched: a training ring's nine payload rows) made anew as such
        columns.keep(words, np.flatnonzero(taken[: top + 1]), columns.plan(header.version, np.flatnonzero(seen)))
    elif count < room:
        words = [row[:count] for row in words]
    return Slots(words, slots.present, empty, torn, 0)  # no stale record: every place lies within the room


def _oldest(slots: SlotFile, capacity: int, runs: list[tuple[int, int]]) -> int | None:
    """The seq the ring's window likely starts at, from a few slots read one by one: 1 where slot 0 holds
    no valid record (a ring not yet round), else the seq of the slot where the seqs drop back a round,
    found by a binary search (a ring written round and round: slots below it hold the last round). None
    where a probe finds no valid record, or the file holds no data where the search looks."""
    if not runs:
        return None
    if runs[0][0] != 0 or (head := _seq_at(slots, 0, capacity)) is None:
        return 1
    end = runs[-1][1]  # past the last slot holding data
    lo, hi = 0, end  # slot lo holds the last round; every slot from hi on an earlier one (or none: beyond the data)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        seq = _seq_at(slots, mid, capacity)
        if seq is None:
            return None
        lo, hi = (mid, hi) if seq > head else (lo, mid)
    return head if hi >= end else head - capacity + hi


def _seq_at(slots: SlotFile, i: int, capacity: int) -> int | None:
    """The seq of slot ``i`` where it holds an intact record (the commit rule), else None."""
    raw = os.pread(slots.fd, fmt.RECORD_SIZE, slots.base + i * fmt.RECORD_SIZE)
    if len(raw) < fmt.RECORD_SIZE:
        return None
    slot = np.frombuffer(raw, fmt.RECORD_DTYPE)
    intact, _, _ = _census(slot, np.array([i], np.uint64), capacity)
    return int(slot["seq"][0]) if intact[0] else None


def _census(chunk: np.ndarray, index: np.ndarray, capacity: int) -> tuple[np.ndarray, int, int]:
    """(which of ``chunk``'s slots, numbered ``index``, are intact; how many of the others are blank; how many
    torn): ``format.classify``'s commit rule, but for staleness, which only the whole ring can tell."""
    seq = chunk["seq"]
    intact = (seq != 0) & (chunk["commit"] == seq) & (seq % np.uint64(capacity) == index)
    if intact.all():
        return intact, 0, 0
    rest = _words(chunk[~intact])
    blank = int((~rest.any(axis=1)).sum())
    return intact, blank, len(rest) - blank


def _copied_in_place(
    chunk: np.ndarray, at: int, index: np.ndarray, seq: np.ndarray, dest: np.ndarray, words: columns.Words,
    plan: columns.Plan,
) -> bool:
    """The common case of the second pass, done as one block copy: the chunk's valid slots are one run of
    neighbours that go to neighbouring places (a full ring's chunks, but for the one where its seqs wrap),
    and none changed since the first pass. False (nothing copied) otherwise: the caller copies row by row.
    A full 128 MiB ring: 0.10 s to 0.03 s."""
    n = len(index)
    if n == 0 or int(index[-1]) - int(index[0]) != n - 1 or int(dest[-1]) - int(dest[0]) != n - 1:
        return False  # ``index`` ascends without repeats: a span of n - 1 is a run; ``dest`` is checked below
    if n > 1 and not bool((np.diff(dest) == 1).all()):
        return False
    first = int(index[0]) - at
    rows = _words(chunk)[first : first + n]
    if not bool(((rows[:, _SEQ] == seq) & (rows[:, _COMMIT] == seq)).all()):
        return False
    columns.put(words, slice(int(dest[0]), int(dest[0]) + n), rows, plan)
    return True


def _word(field: str) -> int:
    """Which 64-bit word of a slot holds ``field``."""
    fields = fmt.RECORD_DTYPE.fields
    assert fields is not None
    return int(fields[field][1]) // 8


_SEQ, _COMMIT = _word("seq"), _word("commit")


def _words(slots: np.ndarray) -> np.ndarray:
    """Slots as rows of 64-bit words: numpy copies such rows whole, ten times faster than records of
    named fields (the second pass over a full 32 MiB ring: 0.3 s less)."""
    return slots.view("<u8").reshape(-1, fmt.RECORD_SIZE // 8)


def _seq_positions(seq: np.ndarray) -> np.ndarray:
    """Where each slot (in slot order) goes in seq order. Valid slots hold seq % capacity, so in slot
    order their seqs form at most two ascending runs: a rotation, found in linear time."""
    n = len(seq)
    drops = np.flatnonzero(seq[1:] < seq[:-1])
    if len(drops) == 0:
        return np.arange(n)
    if len(drops) == 1 and seq[-1] < seq[0]:
        return (np.arange(n) - (int(drops[0]) + 1)) % n
    dest = np.empty(n, np.intp)
    dest[np.argsort(seq, kind="stable")] = np.arange(n)
    return dest
