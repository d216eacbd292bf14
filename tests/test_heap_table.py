"""The heap table read back as untrusted input: valid slots kept, torn and random ones counted, sizes bounded."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from blackbox.ring import format as fmt
from blackbox.ring.heap import HeapScan, alloc_stack, decode_heap
from blackbox.ring.reader import read_ring
from blackbox.ring.scan import StackScan

META = {"format_version": 4, "clock": {"wall_ns": 1, "monotonic_ns": 1}}


def ring_with_heap(path: Path, heap: bytes, heap_size: int) -> Path:
    header = fmt.encode_header(64, 4096, META, stacks_size=8192, crash_size=4096, heap_size=heap_size)
    h = fmt.decode_header(header, len(header))
    buf = bytearray(min(h.file_size, h.heap_offset + len(heap) + 4096))
    buf[: len(header)] = header
    buf[h.heap_offset : h.heap_offset + len(heap)] = heap
    path.write_bytes(bytes(buf))
    return path


def test_a_valid_slot_reads_back_and_a_cut_one_is_counted_torn() -> None:
    good = fmt.heap_slot_bytes(0x7F00_1000, 4096, 1 << 20, 0xABCDEF, 5, 7, 3, 2)
    cut = bytearray(fmt.heap_slot_bytes(0x7F00_2000, 4096, 1 << 20, 0xABCDEF, 5, 7, 3, 2))
    cut[8] ^= 1  # the size changed after the check word was written: a kill mid-fill
    scan = decode_heap(good + bytes(64) + bytes(cut))
    assert (len(scan.slots), scan.torn) == (1, 1)
    assert scan.slots[0]["address"] == 0x7F00_1000 and scan.slots[0]["step"] == 3


def test_random_bytes_give_no_slot(tmp_path: Path) -> None:
    noise = np.random.default_rng(24).integers(0, 256, 64 * 4096, dtype=np.uint8).tobytes()
    ring = read_ring(ring_with_heap(tmp_path / "r.ring", noise, len(noise)))
    assert isinstance(ring.heap, HeapScan) and len(ring.heap.slots) == 0 and ring.recovery.heap_torn == 4096


def test_a_huge_declared_heap_on_a_small_file_reads_what_is_there(tmp_path: Path) -> None:
    slot = fmt.heap_slot_bytes(0x7F00_1000, 64, 1 << 20, 9, 5, 7, -1, 1)
    path = ring_with_heap(tmp_path / "r.ring", slot, 1 << 30)  # a header that declares 1 GiB
    assert os.path.getsize(path) < 1 << 20
    ring = read_ring(path)
    assert ring.heap is not None and len(ring.heap.slots) == 1 and ring.recovery.heap_live == 1


def test_a_fingerprint_resolves_only_through_an_entry_whose_frames_are_all_there() -> None:
    table = StackScan({(1, 1): "main (t.py:1)", (1, 2): "leak (t.py:9)"}, {}, 0)
    table.allocs[5] = [(1, (1, 2), 2, "MainThread", "x.append(y)")]
    table.allocs[6] = [(2, (1,), 1, "", "")]  # its generation's frame is gone
    assert alloc_stack(table, 5).folded == "main (t.py:1);leak (t.py:9)" and alloc_stack(table, 5).line == "x.append(y)"
    assert alloc_stack(table, 6).folded == fmt.STACK_UNWRITTEN_TEXT
    assert alloc_stack(table, fmt.NO_PYTHON_STACK).folded == fmt.NO_PYTHON_TEXT


def test_slots_past_what_a_writer_makes_are_not_read(tmp_path: Path) -> None:
    slot = fmt.heap_slot_bytes(0x7F00_1000, 64, 1 << 20, 9, 5, 7, -1, 1)
    path = ring_with_heap(tmp_path / "r.ring", slot, 256 << 20)  # a header that declares 4 M slots
    h = fmt.decode_header(path.read_bytes()[:4096], os.path.getsize(path))
    with path.open("r+b") as f:  # a second valid slot 80 MiB in: past the 1 M slots a reader takes
        f.seek(h.heap_offset + (80 << 20))
        f.write(fmt.heap_slot_bytes(0x7F00_2000, 64, 1 << 20, 9, 5, 7, -1, 1))
    ring = read_ring(path)
    assert ring.heap is not None and ring.heap.slots["address"].tolist() == [0x7F00_1000]
