"""ranks.parquet: one row per recovered ring, the per-rank detail the summary leaves out.

Pure functions: rows from a bundle's metadata, the Arrow table of those rows, and
rows back from a table (a job-wide view reads only these tables, never timelines).
Types agree with timeline.parquet's: ``rank``, ``local_rank`` and ``world_size`` int32 (as the ring's
header holds them), ``pid`` int64, times UTC timestamps in nanoseconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa

from .._times import epoch_ns
from .pandas_meta import with_nullable_ints
from .spill import derived

TIME_COLUMNS = ("started_at", "last_event_at", "death_time")
SCHEMA = with_nullable_ints(pa.schema(
    [
        ("host", pa.string()),
        ("rank", pa.int32()),
        ("local_rank", pa.int32()),
        ("world_size", pa.int32()),
        ("pid", pa.int64()),
        ("role", pa.string()),
        ("attempt", pa.int64()),
        ("cause", pa.string()),
        ("confidence", pa.string()),
        ("started_at", pa.timestamp("ns", tz="UTC")),
        ("last_event_at", pa.timestamp("ns", tz="UTC")),
        ("death_time", pa.timestamp("ns", tz="UTC")),
        ("last_step", pa.int64()),
        ("last_step_s", pa.float64()),
        ("peak_host_rss", pa.int64()),
        ("peak_cgroup_usage", pa.int64()),
        ("peak_gpu_allocated", pa.int64()),
        ("peak_gpu_reserved", pa.int64()),
        ("clock_error_s", pa.float64()),
        ("ring", pa.string()),
        ("job", pa.string()),
        ("collateral_of", pa.int64()),
        ("stopped_by", pa.string()),
        ("lost_peer", pa.bool_()),
        ("reported", pa.bool_()),
        ("same_signal", pa.string()),
        ("death_time_error_s", pa.float64()),
        ("starved_late_s", pa.float64()),
    ]
))  # fmt: skip
COLUMNS = tuple(SCHEMA.names)


def _peak(m: dict[str, Any], gauge: str) -> int | None:
    p = (m.get("peaks") or {}).get(gauge)
    return int(p["bytes"]) if p else None


def rank_rows(meta: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per ring of a bundle's metadata (times as ISO-8601 strings, like metadata.json); rings spilled
    to disk are read once for every caller (the rows are shared: not to be changed)."""
    rings = meta.get("rings") or [meta]
    return derived(rings, "rank_rows", lambda: _rows(rings))


def _rows(rings: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for m in rings:
        d = m.get("death") or {}
        after = d.get("collateral_of") if isinstance(d.get("collateral_of"), dict) else None
        rows.append({
            "host": m.get("host"), "rank": m.get("rank"), "local_rank": m.get("local_rank"),
            "world_size": m.get("world_size"), "pid": m.get("pid"), "role": m.get("role"),
            "attempt": m.get("attempt"), "cause": d.get("cause"), "confidence": d.get("confidence"),
            "started_at": m.get("started_at"), "last_event_at": m.get("last_event_at"),
            "death_time": None if d.get("alive") else d.get("time"), "last_step": m.get("last_step"),
            "last_step_s": m.get("last_step_s"), "peak_host_rss": _peak(m, "host_rss"),
            "peak_cgroup_usage": _peak(m, "cgroup_usage"), "peak_gpu_allocated": _peak(m, "gpu_allocated"),
            "peak_gpu_reserved": _peak(m, "gpu_reserved"), "clock_error_s": m.get("clock_error_s"),
            "ring": m.get("ring"), "job": m.get("job"), **collateral_columns(after),
            "death_time_error_s": _number(d.get("time_error_s")),
            "starved_late_s": _number((d.get("starved") or {}).get("late_s") if isinstance(d.get("starved"), dict)
                                      else None),
        })  # fmt: skip
    return rows


def _number(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def collateral_columns(after: dict[str, Any] | None) -> dict[str, Any]:
    """``collateral_of`` (the pid of the death it followed), ``stopped_by`` (its launcher), ``lost_peer`` (it
    died of that death: a peer gone away), ``reported`` (a launcher's end as it reported that death) and
    ``same_signal`` (the signal that ended it with that death, sent to both at once), for a
    ring collateral of another's death (``death.collateral_of``); nulls for any other."""
    if not isinstance(after, dict):
        return {"collateral_of": None, "stopped_by": None, "lost_peer": None, "reported": None, "same_signal": None}
    pid, by = after.get("pid"), after.get("by")
    return {"collateral_of": pid if isinstance(pid, int) else None, "stopped_by": by if isinstance(by, str) else None,
            "lost_peer": after.get("lost_peer") is True or None,
            "reported": after.get("reported") is True or None,
            "same_signal": after["same_signal"] if isinstance(after.get("same_signal"), str) else None}  # fmt: skip


def _nanos(iso: Any) -> int | None:
    """Nanoseconds since the epoch, where a timestamp[ns] holds them (years 1677 to 2262), else None."""
    ns = epoch_ns(iso)
    return ns if ns is not None and -(1 << 63) <= ns < 1 << 63 else None


def iso_micros(us: int | None) -> str | None:
    if us is None:
        return None
    try:
        whole = datetime.fromtimestamp(us // 1_000_000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    except (ValueError, OverflowError, OSError):
        return None  # outside what a datetime holds (years 1 to 9999): only a damaged or planted table
    return f"{whole}.{us % 1_000_000:06d}Z"


def ranks_table(rows: list[dict[str, Any]]) -> pa.Table:
    """The rows as a table with the ranks.parquet schema."""
    columns = {c: [r.get(c) for r in rows] for c in COLUMNS}
    for c in TIME_COLUMNS:
        columns[c] = [_nanos(v) for v in columns[c]]
    arrays = [
        pa.array(columns[f.name], type=pa.int64()).cast(f.type)
        if f.name in TIME_COLUMNS
        else pa.array(columns[f.name], type=f.type)
        for f in SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def table_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows of a ranks table (any subset of its columns), times back as ISO strings to the microsecond
    (as metadata.json writes ``started_at``); no pandas needed."""
    columns: dict[str, list[Any]] = {}
    for name in table.column_names:
        col = table[name]
        if pa.types.is_timestamp(col.type):
            ns = col.cast(pa.timestamp("ns", tz="UTC")).cast(pa.int64()).to_pylist()
            columns[name] = [None if t is None else iso_micros(t // 1000) for t in ns]
        else:
            columns[name] = col.to_pylist()
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
