"""Arrow arrays made without a pass over the rows (recovery/arrays.py): equal to what pa.nulls and
pa.array(mask=) make, and null columns that cost no memory until read."""

from __future__ import annotations

import io
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO

from blackbox.recovery.arrays import masked, nulls

DICT_STR = pa.dictionary(pa.int32(), pa.string())


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 3 << 20])
@pytest.mark.parametrize("typ", [pa.int64(), pa.uint64(), pa.int32(), pa.int16(), DICT_STR])
def test_nulls_equal_pyarrow_s(n: int, typ: pa.DataType) -> None:
    made = nulls(n, typ)
    made.validate(full=True)
    assert made.equals(pa.nulls(n, typ)) and made.null_count == n and made.type == typ


@pytest.mark.parametrize("n", [0, 1, 9, 1001, 4096, 70_001])  # below and above the rows pyarrow makes itself
@pytest.mark.parametrize("share", ["none", "some", "all"])
@pytest.mark.parametrize("dtype,typ", [(np.int64, pa.int64()), (np.int32, pa.int32()), (np.int16, pa.int16()),
                                       (np.uint64, pa.uint64())])  # fmt: skip
def test_masked_equals_pa_array_with_its_mask(n: int, share: str, dtype: type, typ: pa.DataType) -> None:
    rng = np.random.default_rng(n)
    values = rng.integers(0, 1000, n).astype(dtype)
    valid = {"none": np.zeros(n, bool), "all": np.ones(n, bool), "some": rng.random(n) < 0.5}[share]
    made = masked(values, valid, typ)
    made.validate(full=True)
    expected = pa.array(values, typ, mask=~valid)
    assert made.equals(expected) and made.null_count == expected.null_count


def test_masked_shares_the_values_and_casts_where_pa_array_would() -> None:
    values = np.arange(10_000, dtype=np.int64)
    made = masked(values, np.ones(10_000, bool), pa.int64())
    values[3] = 99  # the same buffer: no copy was made
    assert made[3].as_py() == 99
    strided = np.arange(20_000, dtype=np.int64)[::2]  # not contiguous: pa.array's copy
    assert masked(strided, np.ones(10_000, bool), pa.int64()).to_pylist() == list(range(0, 20_000, 2))
    wide = np.arange(10_000, dtype=np.int64) % 7  # another width than the Arrow type's: pa.array's cast
    assert masked(wide, np.ones(10_000, bool), pa.int16()).to_pylist() == (wide).tolist()
    with pytest.raises(pa.ArrowInvalid):  # pa.array's checked cast, not a reinterpretation of the bits
        masked(np.full(10_000, 1 << 63, np.uint64), np.ones(10_000, bool), pa.int64())


def rss() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1]) << 10


def test_null_columns_cost_no_memory_until_read_and_write_as_pyarrow_s() -> None:
    n = 4 << 20  # 32 MiB of values a column, had they been written
    before = rss()
    columns = [nulls(n, pa.int64()) for _ in range(8)]
    grew = rss() - before
    assert grew < 16 << 20, f"{grew >> 20} MiB for 256 MiB of null values"
    mine, theirs = io.BytesIO(), io.BytesIO()
    pq.write_table(pa.table({"a": columns[0]}), mine)
    pq.write_table(pa.table({"a": pa.nulls(n, pa.int64())}), theirs)
    assert mine.getvalue() == theirs.getvalue()


def test_masked_imports_no_pandas() -> None:
    """A command's own process keeps pandas out (35 MiB): pyarrow 25's ``to_pandas_dtype`` imported it."""
    code = ("import sys, numpy as np, pyarrow as pa\n"
            "from blackbox.recovery.arrays import masked, nulls\n"
            "masked(np.arange(10_000), np.ones(10_000, bool), pa.int64())\n"
            "masked(np.arange(10_000, dtype=np.int16), np.ones(10_000, bool), pa.int16())\n"
            "nulls(1 << 20, pa.int64())\n"
            "print('pandas' in sys.modules)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert done.stdout.strip() == "False", done.stderr
