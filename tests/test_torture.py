"""The quick version of tools/torture.py: randomised SIGKILLs of a multi-threaded writer with a forked child."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import torture  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("capacity", [1 << 12, 1 << 20], ids=["wraps", "no-wrap"])
def test_randomised_sigkill_loses_nothing_acknowledged(tmp_path: Path, capacity: int, writer_backend: str) -> None:
    rng = random.Random(capacity)
    for n in range(3):
        # the C path writes about 3 M events/s: kill the 1 M-slot ring early, so it usually has not wrapped yet
        kill_after = rng.uniform(0.05, 0.4 if capacity == 1 << 12 else 0.12)
        res = torture.trial(tmp_path / f"t{n}.ring", capacity, 3, kill_after, rng.choice([1e-5, 5e-3]), writer_backend)
        assert res["lost"] == 0 and res["acked"] > 0, res
        if capacity == 1 << 12:
            assert res["wrapped"], res


@pytest.mark.slow
def test_randomised_sigkill_with_allocation_sampling_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """The marking threads also allocate, sampled one per 16 KiB: hooks write alloc_sample and free_sample
    records and heap slots from the same threads, and the kill still tears at most one of each per thread."""
    rng = random.Random(24)
    for n in range(4):
        capacity = rng.choice([1 << 12, 1 << 16])
        res = torture.trial(tmp_path / f"a{n}.ring", capacity, 3, rng.uniform(0.3, 1.0), 1e-5, "", 16 << 10)
        assert res["lost"] == 0 and res["acked"] > 0, res


@pytest.mark.slow
def test_randomised_sigkill_under_ulimit_v_own_heap_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """The same under an address-space limit of 3 GB, where the sampler thread allocates from its own heap and
    hands the job's threads the glibc blocks it frees (collect/_own_heap.h)."""
    rng = random.Random(42)
    for n in range(3):
        capacity = rng.choice([1 << 12, 1 << 16])
        res = torture.trial(tmp_path / f"v{n}.ring", capacity, 3, rng.uniform(0.3, 1.0), 1e-5, "", 16 << 10, 3 << 30)
        assert res["lost"] == 0 and res["acked"] > 0, res
