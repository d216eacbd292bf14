"""The free path's filter: a bit per hash of an address, read on every free, with the count of tracked blocks
beside it. Blocks that share a bit are each found when freed, and freeing one never hides another.

Tracked through ``track`` / ``untrack`` (the GPU blocks' entry to the same heap table, index and filter), so the
test chooses how many blocks share the filter: 20,000 live blocks in a filter of 2^17 bits, about 1,400 bits
shared, and a bit cleared where its count did not fall to 0 makes ``untrack`` of a
block still live answer False (it looks in the index only where the bit is set).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_py

from blackbox.collect.allocs import sample_module

if sample_module() is None:
    pytest.skip("the C extension blackbox.collect._csample is not built", allow_module_level=True)

JOB = """
import json, random, sys
import blackbox
from blackbox.collect.allocs import sample_module

blackbox.arm(sys.argv[1], capacity=1 << 18)
cmod = sample_module()
rng = random.Random(7)
addresses = rng.sample(range(1 << 12, 1 << 36), 20000)
keys = [a * 16 for a in addresses]  # 16-byte aligned, as blocks are
for k in keys:
    assert cmod.track(k, 4096, 4096, 12345, 0) >= 0
tracked_all = cmod.live_stacks().get(12345, 0)
order = keys[:]
rng.shuffle(order)
half, rest = order[:10000], order[10000:]
first = [cmod.untrack(k, 0) for k in half]
middle = cmod.live_stacks().get(12345, 0)
again = [cmod.track(k, 4096, 4096, 12345, 0) >= 0 for k in half[:4000]]
second = [cmod.untrack(k, 0) for k in rest + half[:4000]]
print(json.dumps({"tracked": tracked_all, "first": sum(first), "middle": middle, "again": sum(again),
                  "second": sum(second), "left": cmod.live_stacks().get(12345, 0),
                  "gone": cmod.untrack(keys[0], 0)}))
blackbox.disarm()
"""


def test_blocks_sharing_the_filters_bits_are_each_found_when_freed(tmp_path: Path) -> None:
    got = json.loads(run_py(JOB, f"{tmp_path}/").stdout.strip().splitlines()[-1])
    assert got["tracked"] == 20000, got
    assert got["first"] == 10000 and got["middle"] == 10000, got  # every freed block found, the others kept
    assert got["again"] == 4000, got
    assert got["second"] == 14000 and got["left"] == 0, got  # then every block left, each found
    assert got["gone"] is False, got  # a block freed twice is found once


LATE_LIBRARY = """
import json, sys
import blackbox
from blackbox.collect.allocs import sample_module

blackbox.arm(sys.argv[1], sample_interval=3600)  # no tick: the test calls rescan itself
cmod = sample_module()
quiet = [cmod.rescan() for _ in range(3)]
before = cmod.stats()["objects_patched"]
import sqlite3  # _sqlite3 and libsqlite3, loaded now, import malloc
late = cmod.rescan()
print(json.dumps({"quiet": quiet, "late": late, "after": cmod.stats()["objects_patched"] - before,
                  "again": cmod.rescan()}))
blackbox.disarm()
"""


def test_a_library_loaded_after_arming_is_patched_at_the_next_scan_and_a_quiet_scan_patches_nothing(
    tmp_path: Path,
) -> None:
    """A scan skips the walk of the loaded objects when the loader's counts of loads and unloads have not moved
    since the last one: the library that moved them is still found at the scan after its load."""
    got = json.loads(run_py(LATE_LIBRARY, f"{tmp_path}/").stdout.strip().splitlines()[-1])
    assert got["quiet"] == [0, 0, 0], got
    assert got["late"] >= 1 and got["after"] == got["late"], got
    assert got["again"] == 0, got
