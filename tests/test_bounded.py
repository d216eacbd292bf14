"""Memory and time of recovery follow the bytes really in a ring, not what its header declares.

Peak RSS is measured in a fresh process (its ``VmHWM``), the way a clean-up job runs
``blackbox recover``; the figures for more shapes are in ``tools/bench_recover_memory.py``.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import time
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import REPO, run_py

from blackbox.ring import scan
from blackbox.ring.reader import read_header, read_ring

sys.path.insert(0, str(REPO / "tools"))
from craft_ring import craft  # noqa: E402

MiB = 1 << 20
FIXED = 300 * MiB  # what recovery may add to the ring's own size (interpreter, pyarrow, matplotlib, work)
# The peak is VmHWM, the child's own: ru_maxrss also counts the parent's memory the child had before exec.
_MEASURE = """
import json, sys, time
t0 = time.perf_counter()
from blackbox.cli import main
code = main(sys.argv[1:])
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
peak = int(status["VmHWM"].split()[0]) * 1024
print(json.dumps({"code": code, "peak": peak, "seconds": time.perf_counter() - t0}))
"""


def recover_in_child(ring: Path, out: Path) -> dict[str, float]:
    proc = run_py(_MEASURE, "recover", str(ring), "-o", str(out), env={"MPLBACKEND": "Agg"}, timeout=300)
    result: dict[str, float] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 0, proc.stderr
    return result


def sparse(path: Path) -> Path:
    if os.stat(path).st_blocks * 512 > 64 * MiB:
        pytest.skip(f"the filesystem of {path.parent} does not keep files sparse")
    return path


@pytest.mark.slow
@pytest.mark.parametrize("declared", [4 << 30, 100 * 10**9], ids=["4GiB", "100GB"])
def test_a_sparse_ring_declaring_gigabytes_costs_what_it_holds(tmp_path: Path, declared: int) -> None:
    # GIVEN a ring whose header declares 4 GiB or 100 GB of slots, 1000 of them written, the rest a hole
    ring = sparse(craft(tmp_path / "big.ring", declared // 128, "mark", events=1000, sparse=True))
    assert ring.stat().st_size >= declared
    # WHEN it is recovered; THEN the 1000 records come back, in far less memory than it declares
    result = recover_in_child(ring, tmp_path / "bundle")
    assert json.loads((tmp_path / "bundle" / "metadata.json").read_text())["events"] == 1000
    assert result["peak"] < FIXED, f"peak RSS {result['peak'] / MiB:.0f} MiB"
    assert result["seconds"] < 60


def test_a_sparse_string_region_of_a_gibibyte_is_not_read_into_memory(tmp_path: Path) -> None:
    ring = sparse(craft(tmp_path / "s.ring", 1024, "mark", events=100, strings_size=1 << 30, sparse=True))
    proc = run_py(_MEASURE, "info", str(ring), "--json", env={"MPLBACKEND": "Agg"})
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["code"] == 0 and result["peak"] < 200 * MiB, f"peak RSS {result['peak'] / MiB:.0f} MiB"
    assert '"strings": 2' in proc.stdout


@pytest.mark.parametrize("length", [0, 4096])
def test_a_region_of_near_miss_entries_costs_bounded_checksum_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, length: int
) -> None:
    # GIVEN a 64 MiB string region where every 8 bytes hold a plausible entry header whose checksum fails
    ring = craft(tmp_path / "near.ring", 1024, "mark", events=100, strings_size=64 * MiB)
    h = read_header(ring)
    with open(ring, "r+b") as f:
        f.seek(h.strings_offset + 4096)
        f.write(struct.pack("<II", 7, length) * ((h.strings_size - 4096) // 8))
    calls, checksummed = [0], [0]

    def crc32(data: bytes, value: int = 0) -> int:
        calls[0] += 1
        checksummed[0] += len(data)
        return zlib.crc32(data, value)

    monkeypatch.setattr(scan, "zlib", SimpleNamespace(crc32=crc32))
    # WHEN it is read
    t0 = time.perf_counter()
    ring_read = read_ring(ring)
    seconds = time.perf_counter() - t0
    # THEN the intact entries before it are kept, and the checksum work is capped by the region's size
    assert set(ring_read.strings.values()) >= {"crafted"}
    budget = scan.RESYNC_WORK * h.strings_size + (2 << 20)  # bytes, each try charged RESYNC_TRY at least
    assert checksummed[0] <= budget and calls[0] <= 2 * budget // scan.RESYNC_TRY  # two calls per try
    assert seconds < 30


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["training loop", "samples only", "stack samples only"])
def test_peak_memory_of_a_full_million_slot_ring_is_its_size_plus_a_fixed_amount(tmp_path: Path, shape: str) -> None:
    # GIVEN a full ring of 2**20 slots (128 MiB): a training loop's, or one holding nothing but samples, or
    # nothing but stack samples (over the bound in a venv just made until the reader kept a payload word only
    # where a kind uses it: 357 MiB, bound 428)
    if shape == "training loop":
        from bench_ring import typical_ring

        ring = typical_ring(tmp_path / "loop.ring", 1_300_000)
    else:
        kind = "sample" if shape == "samples only" else "stack_sample"
        ring = craft(tmp_path / "samples.ring", 1 << 20, kind, payload=1 << 30 if kind == "sample" else 1 << 20)
    assert read_header(ring).capacity == 1 << 20
    # WHEN it is recovered (with memory.png where matplotlib is installed)
    result = recover_in_child(ring, tmp_path / "bundle")
    # THEN the peak is at most the ring's size plus FIXED
    size = ring.stat().st_size
    assert result["peak"] <= size + FIXED, f"peak {result['peak'] / MiB:.0f} MiB for a {size / MiB:.0f} MiB ring"
    assert json.loads((tmp_path / "bundle" / "metadata.json").read_text())["events"] == 1 << 20
