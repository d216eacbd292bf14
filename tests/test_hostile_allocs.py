"""A version-4 ring's allocation sampling as a hostile writer leaves it, recovered as root would.

Every heap slot here is valid (its check word right): what the writer lies about is inside it. Weights
summing past 2**64, a step of 2**62, a million slots of distinct stacks, alloc_sample records of
distinct stacks the table never held; ``tools/fuzz_recover.py --mode allocs`` makes such rings at random.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO
from test_allocations import _fields
from test_bounded import FIXED, MiB, recover_in_child

from blackbox._postmortem import write_postmortem
from blackbox.cli import main
from blackbox.recovery.timeline import ring_table
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring

sys.path.insert(0, str(REPO / "tools"))
from craft_ring import craft_v4, records_of  # noqa: E402
from hostile_allocs import alloc_payload, heap_slots  # noqa: E402

FRAMES = {(1, 1): "main (/job/train.py:1)", (1, 2): "leak (/job/train.py:9)"}
STACK = 0xF00D  # the fingerprint of the one allocation stack the table holds


def steps(values: list[int]) -> np.ndarray:
    return records_of("step", len(values), value=values, step=values, flags=fmt.FLAG_VALUE, thread=7)


def allocations(ring: Path, out: Path) -> dict:
    write_postmortem([ring], out, plot=False)
    report: dict = json.loads((out / "metadata.json").read_text())["allocations"]
    return report


def test_weights_summing_past_two_to_the_64_give_the_exact_total(tmp_path: Path) -> None:
    # GIVEN four live blocks of weight 2**63 each (a u64 sum wraps to 0), one stack, one thread
    heap = heap_slots(4, weight=1 << 63, size=64, stack=STACK, thread=7).tobytes()
    allocs = {(1, 100): alloc_payload(STACK, 2, [1, 2], b"MainThread", b"x.append(y)")}
    ring = craft_v4(tmp_path / "r.ring", {2: "MainThread"}, FRAMES, allocs, heap, steps([0, 1, 2]))
    # WHEN it is recovered; THEN the totals are the weights' sum, not what is left of it past 2**64
    report = allocations(ring, tmp_path / "bundle")
    assert report["live_bytes"] == 1 << 65
    assert report["sites"][0]["live_bytes"] == 1 << 65 and report["sites"][0]["site"] == "leak (/job/train.py:9)"
    assert report["error_bytes"] >= 0


def test_a_pprof_of_weights_past_int64_holds_no_wrapped_sample(tmp_path: Path) -> None:
    # GIVEN a bundle whose one stack holds 2**65 live bytes (four blocks of weight 2**63)
    heap = heap_slots(4, weight=1 << 63, size=64, stack=STACK, thread=7).tobytes()
    allocs = {(1, 100): alloc_payload(STACK, 2, [1, 2], b"MainThread", b"")}
    ring = craft_v4(tmp_path / "r.ring", {2: "MainThread"}, FRAMES, allocs, heap, steps([0, 1, 2]))
    write_postmortem([ring], tmp_path / "bundle", plot=False)
    # WHEN it is exported as a pprof profile
    assert main(["export", "--pprof", str(tmp_path / "bundle"), "-o", str(tmp_path / "live.pb.gz")]) == 0
    # THEN its sample holds the most an int64 holds, not what is left of 2**65 modulo 2**64 (0)
    profile = _fields(gzip.decompress((tmp_path / "live.pb.gz").read_bytes()))
    (sample,) = [dict(_fields(v)) for k, v in profile if k == 2 and isinstance(v, bytes)]
    assert _fields(b"\x08" + sample[2]) == [(1, (1 << 63) - 1)]  # its one value (packed), read as a varint


def test_a_thread_name_holding_a_pipe_opens_no_column_in_summary_md(tmp_path: Path) -> None:
    # GIVEN an allocation stack whose thread name holds "|" (a hostile writer names its threads)
    heap = heap_slots(2, weight=1 << 20, stack=STACK, thread=7).tobytes()
    allocs = {(1, 100): alloc_payload(STACK, 2, [1, 2], b"loader|forged cell", b"x.append(y)")}
    ring = craft_v4(tmp_path / "r.ring", {2: "MainThread"}, FRAMES, allocs, heap, steps([0, 1, 2]))
    # WHEN it is recovered; THEN the site's row of "Who holds the memory" has its seven cells, no more
    write_postmortem([ring], tmp_path / "bundle", plot=False)
    summary = (tmp_path / "bundle" / "summary.md").read_text()
    (row,) = [line for line in summary.splitlines() if line.startswith("| `leak (")]
    assert row.endswith("| loader\\|forged cell |") and len(row.replace("\\|", "").split("|")) == 9


def test_a_step_of_two_to_the_62_does_not_ask_for_an_array_of_every_step(tmp_path: Path) -> None:
    # GIVEN blocks allocated in steps 0, 1 and 2 of a ring whose last step record says 2**62
    heap = heap_slots(3, weight=1 << 20, stack=STACK, thread=7, step=np.arange(3)).tobytes()
    allocs = {(1, 100): alloc_payload(STACK, 2, [1, 2], b"MainThread", b"")}
    ring = craft_v4(tmp_path / "r.ring", {2: "MainThread"}, FRAMES, allocs, heap, steps([0, 1, 2, 1 << 62]))
    # WHEN it is recovered; THEN the growth per step is measured over a bounded grid, not 2**62 steps
    site = allocations(ring, tmp_path / "bundle")["sites"][0]
    assert site["live_bytes"] == 3 << 20 and site["first_step"] == 0
    assert isinstance(site["growth_per_step"], int)


def test_samples_of_distinct_stacks_the_table_never_held_share_one_detail_text(tmp_path: Path) -> None:
    # GIVEN 50,000 alloc_sample records, each naming a stack of its own that the stack table does not hold
    n = 50_000
    rec = records_of("alloc_sample", n, p0=np.arange(n) * 64 + 4096, p1=1 << 19, p2=np.arange(n) * 7919 + 3, p3=1,
                     p4=-1, thread=7)  # fmt: skip
    ring = craft_v4(tmp_path / "r.ring", {2: "MainThread"}, FRAMES, {}, b"", rec)
    # WHEN the timeline is built; THEN every row reads the one placeholder, held once (not 50,000 times)
    detail = ring_table(read_ring(ring))["detail"].combine_chunks()
    assert set(detail.to_pylist()) == {fmt.STACK_UNWRITTEN_TEXT}
    assert len(detail.dictionary) == 1


@pytest.mark.slow
def test_a_million_heap_slots_of_distinct_stacks_recover_in_bounded_memory_and_time(tmp_path: Path) -> None:
    # GIVEN a full-size hostile heap table: 1 M valid slots (64 MiB), each its own stack, none in the table
    n = 1 << 20
    stacks = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(2)
    threads = np.array([12345, 1 << 63, 0, (1 << 64) - 1], np.uint64)[np.arange(n) % 4]
    heap = heap_slots(n, stack=stacks, thread=threads).tobytes()
    ring = craft_v4(tmp_path / "r.ring", {2: "MainThread"}, FRAMES, {}, heap, steps(list(range(20))))
    # WHEN it is recovered in a fresh process, as an epilogue would
    result = recover_in_child(ring, tmp_path / "bundle")
    # THEN it takes no more than the ring's size + the fixed allowance, and seconds
    allowance = ring.stat().st_blocks * 512 + FIXED
    assert result["peak"] <= allowance, f"peak RSS {result['peak'] / MiB:.0f} MiB, allowed {allowance / MiB:.0f}"
    assert result["seconds"] < 60
    report = json.loads((tmp_path / "bundle" / "metadata.json").read_text())["allocations"]
    assert report["sampled_blocks"] == n and report["live_bytes"] == n << 19
    assert report["site_count"] == 4  # the one unwritten site, in each of the four threads
