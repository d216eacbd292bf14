"""pandas reads the bundle's integer columns as its nullable integers, a missing value as <NA>, with no
dtype_backend: the tables say so in their schema metadata (BUNDLE.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

import blackbox
from blackbox.recovery.bundle import RANKS, TIMELINE

pd = pytest.importorskip("pandas", reason="pandas is the reader under test (installed with .[dev])")


def test_pandas_reads_integer_columns_with_missing_values_as_nullable_integers(tmp_path: Path) -> None:
    # GIVEN a real ring: samples before the first step (step missing), no launcher (rank missing), then a
    # step whose number is past float64's exact integers
    rec = blackbox.Recorder.arm(tmp_path / "job.ring", capacity=1024, sample_interval=0.01, keep="off")
    rec.mark("before", 1)
    big = 2**53 + 1
    rec.step(big)
    rec.mark("loss", 7)
    rec.disarm()
    assert rec.path is not None
    bundle = blackbox.recover(rec.path, tmp_path / "bundle")
    # WHEN pandas reads both tables plainly
    timeline = pd.read_parquet(bundle / TIMELINE)
    ranks = pd.read_parquet(bundle / RANKS)
    # THEN every integer column is a nullable integer, missing values are <NA> and big values exact
    assert str(timeline["step"].dtype) == "Int64" and str(timeline["rank"].dtype) == "Int32"
    assert str(timeline["seq"].dtype) == "UInt64" and str(timeline["device"].dtype) == "Int16"
    assert timeline["step"].isna().any() and timeline["rank"].isna().all()
    assert (timeline["step"] == big).fillna(False).any(), "a step past 2**53 arrives exact"
    assert not [c for c in timeline.columns if str(timeline[c].dtype) == "float64"]
    assert str(ranks["rank"].dtype) == "Int32" and ranks["rank"].isna().all()
    assert int(ranks["last_step"].iloc[0]) == big
