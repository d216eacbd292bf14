"""The reader's passes over a ring's slots (``slots.read_slots``): a wrapped ring of several chunks read
as block copies gives exactly what the slot-by-slot copy gives, and a slot a live writer changes between
the two passes is dropped and counted torn, in a chunk otherwise copied whole. Reading ahead and reading
in one pass give what reading in turn and in two passes give. The one pass's own cases (where the probes
find the window and where they do not) are in tests/test_one_pass.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO

import blackbox
from blackbox.recovery.timeline import ring_table
from blackbox.ring import chunks, columns
from blackbox.ring import format as fmt
from blackbox.ring import slots as ring_slots
from blackbox.ring.reader import read_header, read_ring
from blackbox.ring.slots import Slots, read_slots

CAPACITY = 2 * chunks.CHUNK_SLOTS  # two chunks of slots


@pytest.fixture(scope="module")
def wrapped(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ring of two chunks' capacity, written once and a half round: its seqs wrap mid-file."""
    path = tmp_path_factory.mktemp("slots") / "wrapped.ring"
    rec = blackbox.Recorder.arm(path, capacity=CAPACITY, sample_interval=3600)
    for i in range(CAPACITY * 3 // 2):
        rec.mark("m", i)
    rec.disarm()
    return path


def _read(path: Path) -> Slots:
    fd = os.open(path, os.O_RDONLY)
    try:
        return read_slots(fd, read_header(path), os.fstat(fd).st_size)
    finally:
        os.close(fd)


def test_a_wrapped_ring_reads_its_last_window_in_seq_order(wrapped: Path) -> None:
    slots = _read(wrapped)
    seqs = columns.field(slots.words, "seq")
    head = int(seqs[-1])
    assert head > CAPACITY  # it did wrap
    assert seqs.tolist() == list(range(head - CAPACITY + 1, head + 1))
    assert slots.torn == slots.empty == 0


def test_block_copies_give_what_the_slot_by_slot_copy_gives(wrapped: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ring_slots, "ONE_PASS", False)
    fast = _read(wrapped)
    monkeypatch.setattr(ring_slots, "ONE_PASS", False)  # the block copies are the second pass's
    monkeypatch.setattr(ring_slots, "_copied_in_place", lambda *args: False)
    slow = _read(wrapped)
    assert [w.tobytes() for w in fast.words] == [w.tobytes() for w in slow.words]
    assert (fast.read, fast.empty, fast.torn, fast.stale) == (slow.read, slow.empty, slow.torn, slow.stale)


def test_a_slot_changed_between_the_passes_is_dropped_and_counted_torn(
    wrapped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a copy of the ring, and a writer that rewrites one slot (in the chunk whose slots are one run of
    # neighbours: the seqs wrap in the other) after the first pass classified it intact
    ring = tmp_path / "live.ring"
    ring.write_bytes(wrapped.read_bytes())
    header = read_header(ring)
    oldest = int(columns.field(_read(ring).words, "seq")[0]) % CAPACITY  # where the seqs wrap
    slot = 123 if oldest >= chunks.CHUNK_SLOTS else chunks.CHUNK_SLOTS + 123  # in the chunk they do not
    at = header.records_offset + slot * fmt.RECORD_SIZE
    words = np.frombuffer(ring.read_bytes()[at : at + fmt.RECORD_SIZE], "<u8")
    victim = int(words[ring_slots._SEQ])
    seq_positions = ring_slots._seq_positions

    def writer_meanwhile(seq: np.ndarray) -> np.ndarray:
        with open(ring, "r+b") as f:  # a new seq, its commit word not yet written
            f.seek(at)
            f.write((victim + CAPACITY).to_bytes(8, "little"))
        return seq_positions(seq)

    monkeypatch.setattr(ring_slots, "_seq_positions", writer_meanwhile)
    monkeypatch.setattr(ring_slots, "ONE_PASS", False)
    # WHEN its slots are read in two passes
    slots = _read(ring)
    # THEN that one slot is dropped and counted torn; every other record is there, in seq order
    seqs = columns.field(slots.words, "seq").tolist()
    assert slots.torn == 1 and victim not in seqs
    assert len(seqs) == CAPACITY - 1 and seqs == sorted(seqs)
    assert set(seqs) | {victim} == set(range(seqs[0], seqs[-1] + 1))


def test_a_ring_of_one_chunk_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ring read in one chunk has its slots copied from that read (one snapshot), not read a second time;
    a ring of several chunks still reads its slots twice (what changed between the passes is dropped)."""
    path = tmp_path / "small.ring"
    rec = blackbox.Recorder.arm(path, capacity=256, sample_interval=3600)
    for i in range(300):
        rec.mark("m", i)
    rec.disarm()
    reads: list[int] = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: reads.append(offset) or real(fd, buffers, offset))
    slots = _read(path)
    assert len(reads) == 1
    seq = columns.field(slots.words, "seq")
    assert len(seq) == slots.read - slots.empty - slots.torn - slots.stale > 0
    assert (np.diff(seq.astype(np.int64)) == 1).all()
    marks = columns.field(slots.words, "value")[columns.field(slots.words, "kind") == fmt.KIND_CODES["mark"]]
    assert marks[-1] == 299 and (np.diff(marks) == 1).all()


def test_a_wrapped_ring_of_two_chunks_is_read_once_where_two_passes_read_it_twice(
    wrapped: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads: list[int] = []
    real = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: reads.append(offset) or real(fd, buffers, offset))
    once = _read(wrapped)
    assert len(reads) == 2
    monkeypatch.setattr(ring_slots, "ONE_PASS", False)
    twice = _read(wrapped)
    assert len(reads) == 6
    assert [w.tobytes() for w in once.words] == [w.tobytes() for w in twice.words]


def test_payload_words_read_only_where_a_kind_uses_them_give_the_whole_read_s_timeline(
    tmp_path: Path, wrapped: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A payload word is kept only for the records whose kind's layout has it (``columns.plan``): the
    timeline is the one every word kept gives, for a ring of marks among a few of every kind with any
    payload, the golden rings of each version and a real wrapped ring."""
    sys.path.insert(0, str(REPO / "tools"))
    from craft_ring import craft_v3, mixed_records

    mixed = craft_v3(tmp_path / "mixed.ring", {2: "m"}, {}, {}, mixed_records(70_000, 1))
    rings = [mixed, wrapped, *sorted((REPO / "tests" / "data").glob("ring-v*.ring"))]
    planned = [ring_table(read_ring(p)) for p in rings]
    monkeypatch.setattr(columns, "plan", lambda version, kinds: [None] * columns.WIDTH)
    whole = [ring_table(read_ring(p)) for p in rings]
    for path, mine, theirs in zip(rings, planned, whole, strict=True):
        assert mine.equals(theirs), path.name
    assert len(planned[0]["kind"].unique()) == len(fmt.KIND_CODES)


def _holed(wrapped: Path, tmp_path: Path) -> Path:
    """A copy of ``wrapped`` with a hole where half a chunk of slots was never written (sparse)."""
    ring = tmp_path / "holed.ring"
    data = bytearray(wrapped.read_bytes())
    header = read_header(wrapped)
    lo = header.records_offset + (chunks.CHUNK_SLOTS // 2) * fmt.RECORD_SIZE
    hi = lo + chunks.CHUNK_SLOTS // 2 * fmt.RECORD_SIZE
    with open(ring, "wb") as f:
        f.write(data[:lo])
        f.seek(hi)
        f.write(data[hi:])
    return ring


def test_reading_ahead_gives_what_reading_in_turn_gives(
    wrapped: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read but the first of a ring of several chunks is made on the read-ahead thread, and the
    records and counts are those of reading each chunk in turn: a wrapped ring, and one with a hole."""
    threads: list[str] = []
    real = os.preadv

    def noted(fd: int, buffers: list[np.ndarray], offset: int) -> int:
        threads.append(threading.current_thread().name)
        return real(fd, buffers, offset)

    for ring in (wrapped, _holed(wrapped, tmp_path)):
        threads.clear()
        monkeypatch.setattr(ring_slots, "ONE_PASS", False)  # two passes: each begins with a read of its own
        monkeypatch.setattr(os, "preadv", noted)
        ahead = _read(ring)
        main = threading.current_thread().name
        assert threads.count(main) == 2 and threads[0] == main  # each pass's first read
        assert len(threads) == 4 and all(name == main or name.startswith("blackbox-read") for name in threads)
        monkeypatch.setattr(chunks, "READ_AHEAD", False)
        threads.clear()
        in_turn = _read(ring)
        assert set(threads) == {threading.current_thread().name}
        monkeypatch.undo()
        assert [w.tobytes() for w in ahead.words] == [w.tobytes() for w in in_turn.words]
        assert (ahead.read, ahead.empty, ahead.torn, ahead.stale) == (in_turn.read, in_turn.empty, in_turn.torn,
                                                                      in_turn.stale)  # fmt: skip
    assert ahead.empty == chunks.CHUNK_SLOTS // 2 and len(ahead.words[0]) == CAPACITY * 3 // 4  # the hole


def test_no_read_ahead_outlives_read_slots_even_when_it_raises(wrapped: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller closes the ring's descriptor once read_slots returns: a read still in flight then would
    read another file that took the number. Here the second pass fails while the next chunk is being read
    ahead slowly; by the time the error reaches the caller, that read has ended."""
    ended: list[float] = []
    real = os.preadv

    def slow(fd: int, buffers: list[np.ndarray], offset: int) -> int:
        if threading.current_thread().name.startswith("blackbox-read"):
            time.sleep(0.2)
        n = real(fd, buffers, offset)
        ended.append(time.monotonic())
        return n

    def failing(*args: object) -> bool:
        raise RuntimeError("planted")

    monkeypatch.setattr(os, "preadv", slow)
    monkeypatch.setattr(ring_slots, "ONE_PASS", False)
    monkeypatch.setattr(ring_slots, "_copied_in_place", failing)
    with pytest.raises(RuntimeError, match="planted"):
        _read(wrapped)
    raised = time.monotonic()
    assert len(ended) == 4 and max(ended) <= raised  # both passes' reads ahead had ended
    # and the one pass, failing in its first chunk's copy while the second is read ahead
    ended.clear()
    monkeypatch.setattr(ring_slots, "ONE_PASS", True)
    monkeypatch.setattr(columns, "put", failing)
    with pytest.raises(RuntimeError, match="planted"):
        _read(wrapped)
    raised = time.monotonic()
    assert len(ended) == 2 and max(ended) <= raised


def test_a_ring_read_at_interpreter_exit_is_read_in_turn(wrapped: Path) -> None:
    """At interpreter exit (an atexit hook: a job's own "recover my ring as I end") a pool takes no more work:
    the read ahead and the payload's thread fall back to the caller's thread, the same records and timeline."""
    script = f"""
import atexit, sys
sys.path.insert(0, {str(REPO)!r})
from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import read_ring

def recover():
    ring = read_ring({str(wrapped)!r})
    print("rows", ring_table(ring).num_rows, ring.recovery.valid, ring.recovery.torn)

atexit.register(recover)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.split() == ["rows", str(CAPACITY), str(CAPACITY), "0"]
