"""The heap table read back as untrusted input: valid slots kept, torn and random ones counted, sizes bounded."""

from __future__ import annotations

import os
from array import array
from pathlib import Path

import numpy as np

from blackbox.recovery.allocs import live_sites
from blackbox.ring import format as fmt
from blackbox.ring.heap import ALLOC_NOT_RENDERED, MAX_ALLOC_TEXT, HeapScan, alloc_stack, alloc_stacks, decode_heap
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


def deep_alloc_table(count: int) -> StackScan:
    """A stack table of ``count`` allocation stacks of 64 frames of 1,000 bytes each (64 KiB folded)."""
    frames = {(1, f): f"f{f}_".ljust(988, "x") + f" (m.py:{f})" for f in range(1, 129)}
    table = StackScan(frames, {}, 0)
    for fp in range(1, count + 1):
        ids = array("I", [1 + j + 64 * ((fp >> (j % 10)) & 1) for j in range(64)])
        table.allocs[fp] = [(1, ids, 64, "MainThread", "")]
    return table


def test_allocation_stacks_fold_to_bounded_text_the_most_used_first() -> None:
    # GIVEN 300 distinct deep allocation stacks (19 MiB once folded), the last one used most
    table = deep_alloc_table(300)
    # WHEN they are rendered, the most used first
    found = alloc_stacks(table, [300, *range(1, 300)])
    # THEN the text rendered stays within the bound, the most used one in full
    rendered = [s.folded for s in found.values() if not s.folded.startswith("<")]
    assert sum(len(t) for t in rendered) <= MAX_ALLOC_TEXT and len(rendered) < 300
    assert found[300].folded.count(";") == 63 and found[300].folded.startswith("f")
    # and each stack past it keeps its fingerprint, never merged with another
    assert found[299].folded == ALLOC_NOT_RENDERED.format(299)


def test_live_sites_render_the_heaviest_stacks(tmp_path: Path) -> None:
    # GIVEN heap slots naming 300 deep stacks, the last slot's weighing most
    table = deep_alloc_table(300)
    slots = b"".join(fmt.heap_slot_bytes(0x1000 * fp, 64, 1 << (30 if fp == 300 else 20), fp, 5, 7, -1, 1)
                     for fp in range(1, 301))  # fmt: skip
    report = live_sites(decode_heap(slots), table, META, None, None)
    # THEN the heaviest stack is rendered in full, and the largest site named by its own frame
    assert report is not None and report["stacks"][0]["live_bytes"] == 1 << 30
    assert report["stacks"][0]["stack"] == alloc_stack(table, 300).folded
    assert report["sites"][0]["site"] == alloc_stack(table, 300).folded.rpartition(";")[2]
