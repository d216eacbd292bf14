"""A ring read in one pass (``slots._one_pass``) gives exactly the records and counts that two passes give,
whatever was done to it: the probes (``slots._oldest``) find the window of a ring written round and round,
of one not yet round and of one just full, and where they are misled (a stale slot, slot 0 torn, a probe
on a torn slot) the ring is read in two passes instead, never read wrong."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

import blackbox
from blackbox.ring import chunks, columns
from blackbox.ring import format as fmt
from blackbox.ring import slots as ring_slots
from blackbox.ring.reader import read_header
from blackbox.ring.slots import Slots, read_slots

CHUNK = chunks.CHUNK_SLOTS
CAPACITY = 4 * CHUNK  # four chunks: the binary search for where the seqs wrap probes a few slots


def _ring(path: Path, records: int) -> Path:
    rec = blackbox.Recorder.arm(path, capacity=CAPACITY, sample_interval=3600, allocations=False)
    for i in range(records):
        rec.mark("m", i)
    rec.disarm()
    return path


@pytest.fixture(scope="module")
def rings(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Rings written round and a half, not yet round (two and a half chunks), and just full (slot 0 holds
    the last seq, every other slot its first round)."""
    folder = tmp_path_factory.mktemp("one-pass")
    return {
        "round and a half": _ring(folder / "wrapped.ring", CAPACITY * 3 // 2),
        "not yet round": _ring(folder / "young.ring", CHUNK * 5 // 2),
        "just full": _ring(folder / "full.ring", CAPACITY - 2),  # with arm's and disarm's records: the capacity
    }


def _read(path: Path, one_pass: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[Slots, bool]:
    """(the slots read, whether they were read in one pass)."""
    twice: list[bool] = []
    real = ring_slots._two_passes

    def noted(*args: object) -> Slots:
        twice.append(True)
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(ring_slots, "ONE_PASS", one_pass)
    monkeypatch.setattr(ring_slots, "_two_passes", noted)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = read_slots(fd, read_header(path), os.fstat(fd).st_size)
    finally:
        os.close(fd)
        monkeypatch.undo()
    return got, not twice


def _same(path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Slots, bool]:
    """Read ``path`` both ways; assert they agree; (the slots, whether the first was read in one pass)."""
    once, used = _read(path, True, monkeypatch)
    twice, _ = _read(path, False, monkeypatch)
    assert [w.tobytes() for w in once.words] == [w.tobytes() for w in twice.words], path.name
    counts = (once.read, once.empty, once.torn, once.stale)
    assert counts == (twice.read, twice.empty, twice.torn, twice.stale), path.name
    return once, used


@pytest.mark.parametrize("shape", ["round and a half", "not yet round", "just full"])
def test_the_probes_find_the_window_and_one_pass_reads_what_two_read(
    rings: dict[str, Path], shape: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    slots, used = _same(rings[shape], monkeypatch)
    assert used  # read in one pass
    seqs = columns.field(slots.words, "seq").astype(np.int64)
    assert len(seqs) > CHUNK and (np.diff(seqs) == 1).all()
    assert slots.torn == slots.stale == 0


def _slot(path: Path, i: int) -> int:
    return read_header(path).records_offset + i * fmt.RECORD_SIZE


def _copy(path: Path, tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    out.write_bytes(path.read_bytes())
    return out


def test_a_stale_slot_sends_the_ring_to_two_passes(
    rings: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot whose last round's write never came holds its record of the round before: intact, but older
    than the window. Its place would fall below the window's first: two passes read the ring, and count it."""
    ring = _copy(rings["round and a half"], tmp_path, "stale.ring")
    data = bytearray(ring.read_bytes())
    at = _slot(ring, 7)  # slot 7 holds the last round's seq
    words = np.frombuffer(data, "<u8", count=16, offset=at).copy()
    old = int(words[ring_slots._SEQ]) - CAPACITY
    words[ring_slots._SEQ] = words[ring_slots._COMMIT] = old
    data[at : at + fmt.RECORD_SIZE] = words.tobytes()
    ring.write_bytes(bytes(data))
    slots, used = _same(ring, monkeypatch)
    assert not used and slots.stale == 1
    assert old not in columns.field(slots.words, "seq").tolist()


@pytest.mark.parametrize("slot", [0, "probed"])
def test_a_torn_slot_where_the_probes_look_sends_the_ring_to_two_passes(
    rings: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slot: int | str
) -> None:
    ring = _copy(rings["round and a half"], tmp_path, "torn.ring")
    i = 0 if slot == 0 else CAPACITY // 2  # the binary search's first probe
    with open(ring, "r+b") as f:
        f.seek(_slot(ring, i) + 8 * ring_slots._COMMIT)
        f.write(b"\xff" * 8)  # its commit word no longer its seq
    slots, used = _same(ring, monkeypatch)
    assert not used and slots.torn == 1


def test_torn_slots_elsewhere_are_closed_up_in_one_pass(
    rings: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ring = _copy(rings["round and a half"], tmp_path, "holes.ring")
    with open(ring, "r+b") as f:
        for i in (5, CHUNK + 3, CHUNK + 4, 3 * CHUNK - 1):  # none that the probes read
            f.seek(_slot(ring, i))
            f.write(b"\x01" * fmt.RECORD_SIZE)
    slots, used = _same(ring, monkeypatch)
    assert used and slots.torn == 4 and len(slots.words[0]) == CAPACITY - 4


def _mutate(data: bytearray, base: int, rng: random.Random) -> bytearray:
    """One of the things a crash, a disk or an attacker does to a ring's slots."""
    size = fmt.RECORD_SIZE
    there = (len(data) - base) // size  # slots the file still holds whole
    if there < 2:
        return data
    at = base + rng.randrange(there) * size
    how = rng.randrange(6)
    if how == 0:  # a run of slots zeroed
        n = rng.randrange(1, 3 * CHUNK)
        data[at : at + n * size] = bytes(len(data[at : at + n * size]))
    elif how == 1:  # slots garbled
        for _ in range(rng.randrange(1, 50)):
            i = base + rng.randrange(there) * size + rng.randrange(size)
            data[i] = rng.randrange(256)
    elif how == 2:  # two slots swapped
        other = base + rng.randrange(there) * size
        data[at : at + size], data[other : other + size] = data[other : other + size], data[at : at + size]
    elif how == 3:  # the file cut short
        del data[at + rng.randrange(size) :]
    elif how == 4:  # a seq pushed a round on or back, its commit word with it
        words = np.frombuffer(data, "<u8", count=16, offset=at).copy()
        step = CAPACITY * rng.choice([-2, -1, 1, 2])
        words[ring_slots._SEQ] = words[ring_slots._COMMIT] = (int(words[ring_slots._SEQ]) + step) % (1 << 64)
        data[at : at + size] = words.tobytes()
    else:  # a slot copied over another
        other = base + rng.randrange(there) * size
        data[other : other + size] = data[at : at + size]
    return data


def test_one_pass_reads_what_two_passes_read_of_damaged_rings(
    rings: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """120 rings, each damaged one to three ways (seeded): the same records and counts, read in one pass
    or two; both ways were taken."""
    rng = random.Random(25)
    ways = set()
    for case in range(120):
        source = rings[rng.choice(sorted(rings))]
        base = read_header(source).records_offset
        data = bytearray(source.read_bytes())
        for _ in range(rng.randrange(1, 4)):
            data = _mutate(data, base, rng)
        ring = tmp_path / f"case-{case}.ring"
        ring.write_bytes(bytes(data))
        _, used = _same(ring, monkeypatch)
        ways.add(used)
        ring.unlink()
    assert ways == {True, False}


def test_a_filesystem_that_cannot_tell_holes_does_not_make_one_pass_hold_the_declared_capacity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS or FUSE answer SEEK_DATA with "all data": a sparse ring declaring 4 M slots (512 MiB) but holding
    ten records would have had rows made for every slot. The rows are bounded by the blocks the file holds."""
    sys.path.insert(0, str(REPO / "tools"))
    from craft_ring import craft

    ring = craft(tmp_path / "sparse.ring", 1 << 22, "mark", events=10, sparse=True)
    assert os.stat(ring).st_blocks * 512 < 1 << 20
    real = os.lseek

    def no_holes(fd: int, pos: int, how: int) -> int:
        if how == os.SEEK_DATA:
            return pos
        if how == os.SEEK_HOLE:
            return os.fstat(fd).st_size
        return real(fd, pos, how)

    made: list[int] = []
    empty = columns.empty
    monkeypatch.setattr(os, "lseek", no_holes)
    monkeypatch.setattr(columns, "empty", lambda n, plan=None: made.append(n) or empty(n, plan))
    slots, used = _same(ring, monkeypatch)
    assert used and len(slots.words[0]) == 10
    assert made and max(made) <= (1 << 20) // fmt.RECORD_SIZE


def _rss_of(row: np.ndarray) -> int:
    """Bytes of ``row``'s pages present in memory (/proc/self/pagemap: bit 63 of each page's entry)."""
    page = os.sysconf("SC_PAGE_SIZE")
    at = row.__array_interface__["data"][0]
    first, last = at // page, (at + row.nbytes - 1) // page
    with open("/proc/self/pagemap", "rb") as f:
        f.seek(first * 8)
        entries = np.frombuffer(f.read((last - first + 1) * 8), "<u8")
    return int(((entries >> np.uint64(63)) & np.uint64(1)).sum()) * page


def test_closing_up_keeps_a_payload_word_only_where_a_kind_uses_it() -> None:
    """``columns.keep``: a word no record uses is made anew untouched, one some kinds use is copied for
    those records only (the rest of its pages never touched), not remade whole (72 MB of a full ring)."""
    n = 1 << 20
    plan = columns.plan(4, np.array([fmt.KIND_CODES["mark"], fmt.KIND_CODES["cgroup_sample"]], np.uint8))
    used = [w for w, uses in enumerate(plan) if isinstance(uses, np.ndarray)]
    unused = [w for w, uses in enumerate(plan) if uses is False]
    assert used and unused
    words = columns.empty(n, plan)
    kinds = np.full(n, fmt.KIND_CODES["mark"], np.uint64)
    kinds[::100_000] = fmt.KIND_CODES["cgroup_sample"]  # eleven samples (p0..p5: p6..p8 unused)
    words[columns._KIND_WORD][:] = kinds << np.uint64(columns._KIND_SHIFT)
    for w in used:
        words[w][kinds == fmt.KIND_CODES["cgroup_sample"]] = w
    records = np.arange(1, n, dtype=np.intp)  # the first record dropped
    columns.keep(words, records, plan)
    # (pages first: reading an untouched page maps the zero page in)
    assert all(_rss_of(words[w]) < n * 8 // 4 for w in used)  # touched where the samples are
    assert all(_rss_of(words[w]) == 0 for w in unused)
    kept_kinds = kinds[1:]
    for w in used:
        assert (words[w] == np.where(kept_kinds == fmt.KIND_CODES["cgroup_sample"], w, 0)).all()
    assert all(len(words[w]) == n - 1 and not words[w].any() for w in unused)
