#!/usr/bin/env python3
"""Writing one full ring's timeline (issue 25): ``RowGroupWriter`` with its all-null columns copied from the
first row group of their size (as shipped), the same writer encoding every row group whole, and one
``pq.ParquetWriter`` on one thread, all from the same table in memory, run by run in alternation; wall
seconds and CPU seconds (every thread's), medians. The table is checked to come out byte for byte the same
from all three.

    python tools/bench_row_groups.py [--events 1000000] [--runs 7]

The table is the timeline of tools/bench_ring.py's typical training ring (``RecoveryPass``, as ``blackbox
recover`` builds it): 54 columns, about half of them null in every row (the payload columns of kinds a
training loop does not write).
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "tools"))

import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
from bench_ring import typical_ring  # noqa: E402

from blackbox.recovery import row_groups  # noqa: E402
from blackbox.recovery.bundle import _PARQUET, ROW_GROUP  # noqa: E402
from blackbox.recovery.pipeline import RecoveryPass  # noqa: E402


def written(table: pa.Table, how: str) -> tuple[bytes, float, float]:
    """(the file, wall seconds, CPU seconds) of ``table`` written as ``how`` says."""
    sink = io.BytesIO()
    saved = row_groups.SPLICE_ROWS
    wall, cpu = time.perf_counter(), time.process_time()
    if how == "one ParquetWriter":
        with pq.ParquetWriter(sink, table.schema, **_PARQUET) as writer:
            writer.write_table(table, row_group_size=ROW_GROUP)
    else:
        row_groups.SPLICE_ROWS = saved if how == "nulls copied" else 1 << 62
        try:
            with row_groups.RowGroupWriter(sink, table.schema, **_PARQUET) as rg:
                rg.write_table(table, ROW_GROUP)
        finally:
            row_groups.SPLICE_ROWS = saved
    return sink.getvalue(), time.perf_counter() - wall, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        ring = typical_ring(Path(tmp) / "full.ring", args.events)
        table = next(RecoveryPass([ring]).tables())
    null = sum(table.column(i).null_count == table.num_rows for i in range(table.num_columns))
    hows = ("nulls copied", "every row group whole", "one ParquetWriter")
    times: dict[str, list[tuple[float, float]]] = {how: [] for how in hows}
    files: set[bytes] = set()
    for _ in range(args.runs):
        for how in hows:
            data, wall, cpu = written(table, how)
            files.add(data)
            times[how].append((wall, cpu))
    med: Callable[[str, int], float] = lambda how, i: statistics.median(t[i] for t in times[how])  # noqa: E731
    print(f"{table.num_rows:,} rows, {table.num_columns} columns ({null} null in every row), row groups of "
          f"{ROW_GROUP:,}; {row_groups.threads()} encoding threads; {args.runs} runs each, medians")  # fmt: skip
    print("| writer | wall s | CPU s |\n|---|---:|---:|")
    for how in hows:
        print(f"| {how} | {med(how, 0):.3f} | {med(how, 1):.3f} |")
    base = hows[1]
    print(f"nulls copied: {med(base, 0) / med(hows[0], 0):.2f}x as fast as every row group whole, "
          f"{med(base, 1) / med(hows[0], 1):.2f}x less CPU")  # fmt: skip
    if len(files) != 1:
        print("the three files differ", file=sys.stderr)
        return 1
    print("the three files are byte for byte the same")
    return 0


if __name__ == "__main__":
    sys.exit(main())
