"""A ring's valid records held column-major: one array of 64-bit words per word of a slot.

The reader writes each chunk of slots into this layout as it reads them, so the timeline takes every
field as a contiguous array without a second copy of the ring: a full 128 MiB ring is held once, not as
records and then as columns. Each word is an array of its own, so the words no column keeps (the
clock, once turned into times; the label, kind, flags and device word, once split) are freed as soon
as the timeline is built. The commit word is not kept: the reader only keeps a slot whose commit word
equals its seq.
"""

from __future__ import annotations

import contextlib
import functools
import mmap
from typing import Any

import numpy as np

from . import format as fmt

_MAPPED = 1 << 20  # a row of at least this many bytes gets a mapping of its own
_PRIVATE = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux: the row's pages made at once, not one fault each
# (a full ring's 15 rows of 8 MB on the 2-vCPU VM: 81 ms as shared pages faulted one by one, 57 ms private,
# 42 ms private and made at once; read_slots of a full ring 190 ms to 150 ms)
_HUGE = getattr(mmap, "MADV_HUGEPAGE", None)  # Linux: a row every record writes is made of 2 MiB pages where the
# kernel has them (transparent huge pages, "madvise" or "always"): six rows of 8 MB made and written, medians of 9
# on the 2-vCPU VM (kernel 6.18): 32 ms in 4 KiB pages made at once, 9.5-11 ms in huge pages (a 512th of the faults)
_POPULATE_WRITE = 23  # MADV_POPULATE_WRITE (Linux 5.14; not in the mmap module): the row's pages made at once, huge
# or not (a kernel that gives no huge pages: 38 ms for those six rows, as MAP_POPULATE; EINVAL before 5.14)
WIDTH = fmt.RECORD_SIZE // 8 - 1  # the words of a slot kept: all but the last, the commit word
_FIELDS: dict[str, Any] = {name: spec for name, spec in (fmt.RECORD_DTYPE.fields or {}).items() if name != "commit"}

Words = list[np.ndarray]  # WIDTH arrays of uint64: words[w][i] is word w of record i
_PAYLOAD = int(_FIELDS["p0"][1]) // 8  # the first payload word
_KIND_WORD, _KIND_SHIFT = int(_FIELDS["kind"][1]) // 8, int(_FIELDS["kind"][1]) % 8 * 8  # where a record's kind lies
assert _KIND_WORD < _PAYLOAD  # (``keep`` reads the kinds of the records it has kept before any payload word)


Plan = list["np.ndarray | bool | None"]  # per word: None (every record's word kept), False (none), or which
# kinds' are (a table by code)
_PLANS: dict[tuple[int, bytes], Plan] = {}  # (version, the kinds present) -> its plan: rings of a job share a few


def plan(version: int, kinds: np.ndarray) -> Plan:
    """Which records' words are kept, for a ring of ``version`` holding records of ``kinds`` (codes): every
    record's fixed words, and each payload word only where the record's kind has that word in its layout
    (``format.payload_columns``), which is all the timeline reads of it. A training ring's marks, steps
    and phases use no payload word: its nine payload rows (72 MB of a full ring) were copied and their
    pages made for the few samples that use them."""
    present = np.zeros(256, bool)
    present[kinds] = True
    key = (version, present.tobytes())
    held = _PLANS.get(key)
    if held is not None:
        return held
    layouts = fmt.payload_columns(version)
    out: Plan = [None] * WIDTH
    tables: dict[bytes, np.ndarray] = {}  # one object per distinct table: ``put`` finds its records once
    for i in range(fmt.PAYLOAD_WORDS):
        uses = np.zeros(256, bool)
        for code, words in layouts.items():
            uses[code] = len(words) > i
        if not (present & ~uses).any():
            continue  # every record present uses it: kept whole
        out[_PAYLOAD + i] = tables.setdefault(uses.tobytes(), uses) if (present & uses).any() else False
    if len(_PLANS) < 1024:
        _PLANS[key] = out
    return out


def empty(n: int, plan: Plan | None = None) -> Words:
    """Room for ``n`` records' words. A word ``plan`` keeps for some records only is left as zero pages
    to be faulted in where written (the rest never are), not made at once."""
    return [_row(n, plan is None or plan[w] is None) for w in range(WIDTH)]


def _row(n: int, populate: bool = True) -> np.ndarray:
    """``n`` uint64 words; a large row in an anonymous mapping of its own, unmapped once no array uses it.
    From malloc, rows of a few MiB each were kept by the allocator once freed (its mmap threshold rises
    to the size of the last block it unmapped), and recovery's later peak rose by the rows it had
    freed (77 MiB more after a full ring's timeline was written)."""
    if n * 8 < _MAPPED:
        return np.empty(n, np.uint64) if populate else np.zeros(n, np.uint64)  # (zero: not every record written)
    mapped = _huge(n * 8) if populate else None
    if mapped is None:
        try:  # private, not shared (shared anonymous pages are tmpfs pages: dearer to fault in), faulted in at once
            mapped = mmap.mmap(-1, n * 8, flags=_PRIVATE | (_POPULATE if populate else 0))
        except OSError:  # a kernel that refuses the flags: the plain mapping, its pages faulted in as they are written
            mapped = mmap.mmap(-1, n * 8)
    return np.frombuffer(mapped, np.uint64)


def _huge(size: int) -> mmap.mmap | None:
    """A private mapping of ``size`` bytes made of huge pages where the kernel has them, made at once (a row
    of sparse words is not asked: a record's word would make 2 MiB of it); None where the kernel will not."""
    if _HUGE is None or not _huge_pages():
        return None
    try:
        mapped = mmap.mmap(-1, size, flags=_PRIVATE)
    except OSError:
        return None
    try:
        mapped.madvise(_HUGE)
    except OSError:  # refused: made at once in small pages instead
        mapped.close()
        return None
    with contextlib.suppress(OSError):  # an older kernel: faulted in as the row is written
        mapped.madvise(_POPULATE_WRITE)
    return mapped


@functools.cache
def _huge_pages() -> bool:
    """The kernel gives huge pages to a mapping that asks (transparent huge pages not "never")."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" not in f.read()
    except OSError:
        return False


def put(words: Words, places: slice | np.ndarray, slots: np.ndarray, plan: Plan | None = None) -> None:
    """Write ``slots`` (rows of a slot's 16 words) into ``words`` at the records ``places`` (a run, or
    indices): the words ``plan`` keeps for the kinds of these records only."""
    kinds: np.ndarray | None = None
    kept: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id of a plan's table -> (the records, their places)
    for w, row in enumerate(words):
        uses = None if plan is None else plan[w]
        if uses is None:
            row[places] = slots[:, w]
            continue
        if not isinstance(uses, np.ndarray):  # False: no record present uses it
            continue
        if id(uses) not in kept:  # the words of one layout share one table
            if kinds is None:
                kinds = _kinds(slots[:, _KIND_WORD])
            records = np.flatnonzero(uses[kinds])
            to = np.arange(places.start, places.stop)[records] if isinstance(places, slice) else places[records]
            kept[id(uses)] = records, to
        records, to = kept[id(uses)]
        if len(records):
            row[to] = slots[records, w]


def take(words: Words, records: np.ndarray) -> Words:
    """The words of the records at ``records`` (indices), in that order."""
    return [row[records] for row in words]


def _kinds(word: np.ndarray) -> np.ndarray:
    """The kind codes of records, from their kind word (as indices into a plan's table)."""
    return ((word >> np.uint64(_KIND_SHIFT)) & np.uint64(0xFF)).astype(np.intp)


def keep(words: Words, records: np.ndarray, plan: Plan | None = None) -> None:
    """Keep only the records at ``records`` (indices), in that order, a row at a time: each row's old
    array is let go as its new one is made, so memory peaks at one row more, not twice the records. A
    word ``plan`` keeps for no record is made anew as zero pages, and one it keeps for some kinds only is
    copied for those records only (the rest of its pages never touched), as ``empty`` and ``put`` make them."""
    kinds: np.ndarray | None = None
    for w, row in enumerate(words):
        uses = None if plan is None else plan[w]
        if uses is None:
            kept = _row(len(records))
            np.take(row, records, out=kept)
        else:
            kept = _row(len(records), populate=False)
            if isinstance(uses, np.ndarray):
                if kinds is None:  # the kind word comes before any payload word: already kept
                    kinds = _kinds(words[_KIND_WORD])
                mine = np.flatnonzero(uses[kinds])
                kept[mine] = row[records[mine]]
        words[w] = kept
        del row


def count(words: Words) -> int:
    return len(words[0])


def field(words: Words, name: str) -> np.ndarray:
    """One record field of every record, as a contiguous array of its dtype."""
    dt, offset, *_ = _FIELDS[name]
    row = words[offset // 8]
    if dt.itemsize == 8:
        out: np.ndarray = row.view(dt)
        return out
    word = np.dtype({"names": [name], "formats": [dt], "offsets": [offset % 8], "itemsize": 8})
    return np.ascontiguousarray(row.view(word)[name])


def fields(words: Words) -> dict[str, np.ndarray]:
    """Every record field (but commit) by name."""
    return {name: field(words, name) for name in _FIELDS}


def records(words: Words) -> np.ndarray:
    """The records as the ring's structured dtype (a copy; its commit words equal the seqs)."""
    n = count(words)
    out = np.empty(n, fmt.RECORD_DTYPE)
    rows = out.view("<u8").reshape(n, WIDTH + 1)
    for w, row in enumerate(words):
        rows[:, w] = row
    rows[:, WIDTH] = words[int(_FIELDS["seq"][1]) // 8]
    return out
