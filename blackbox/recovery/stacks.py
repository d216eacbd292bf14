"""What the job was doing, and where its memory grew, from the stack samples of one ring's timeline.

Pure functions over the timeline table (no I/O). A stack is the ``detail`` of a
``stack_sample`` row (folded, outermost frame first) with the thread's name (its
``label``). The sampler writes a tick's stack samples just before the tick's
``sample`` and its ``gpu_sample`` records after it (FORMAT.md), so the stacks
between two consecutive memory samples are the ones seen while memory moved
from the first figure to the second.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from ..ring import format as fmt
from .timeline import of_kind

LAST_SECONDS = 5.0  # "what it was doing": the stacks of the last seconds before the last event
TOP = 5
_CODES = {k: fmt.KIND_CODES[k] for k in ("sample", "gpu_sample", "stack_sample")}


def _codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[Any]]:
    """(index of each row's value in the dictionary, -1 for null; the dictionary) of a one-chunk column."""
    if column.num_chunks == 0:
        return np.zeros(0, np.int64), []
    chunk = column.chunk(0)
    if not pa.types.is_dictionary(chunk.type):
        chunk = chunk.dictionary_encode()
    index = chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return index, chunk.dictionary.to_pylist()


def _table(table: pa.Table, *kinds: str) -> pa.Table:
    columns = ["time", "kind", "label", "thread", "device", "host_rss", "gpu_allocated", "detail"]
    return of_kind(table, *kinds, columns=columns).unify_dictionaries().combine_chunks()


def last_stacks(table: pa.Table, seconds: float = LAST_SECONDS, top: int = TOP) -> list[dict[str, Any]]:
    """The stacks sampled in the last ``seconds`` before the timeline's last event, most sampled first.

    Each entry: ``thread`` (name), ``stack`` (folded), ``samples`` and ``share`` (of that thread's
    samples in the window, 0..1).
    """
    rows = _table(table, "stack_sample")
    if not rows.num_rows or not table.num_rows:
        return []
    times = rows["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    end = int(table["time"].cast(pa.int64()).to_numpy(zero_copy_only=False).max())
    keep = times >= end - int(seconds * 1e9)
    stacks, stack_words = _codes(rows["detail"])
    names, name_words = _codes(rows["label"])
    threads = rows["thread"].to_numpy(zero_copy_only=False)[keep]
    pairs, counts = np.unique(np.stack([threads.astype(np.uint64), stacks[keep].astype(np.uint64),
                                        names[keep].astype(np.uint64)]), axis=1, return_counts=True)  # fmt: skip
    per_thread = {int(t): int(counts[pairs[0] == t].sum()) for t in np.unique(pairs[0])}
    out = [
        {
            "thread": name_words[int(n)] if int(n) < len(name_words) else None,
            "stack": stack_words[int(s)] if int(s) < len(stack_words) else None,
            "samples": int(c),
            "share": round(int(c) / per_thread[int(t)], 4),
        }
        for (t, s, n), c in zip(pairs.T, counts, strict=True)
    ]
    out.sort(key=lambda e: (-int(e["samples"] or 0), str(e["thread"] or ""), str(e["stack"] or "")))
    return out[:top]


def memory_growth(table: pa.Table, top: int = TOP) -> list[dict[str, Any]]:
    """Memory growth by stack: host RSS growth between consecutive ``sample`` rows, and GPU allocated
    growth between consecutive ``gpu_sample`` rows of each device, each split evenly among the stack
    samples seen in between; summed per stack (net: a stack seen while memory fell is charged the fall).

    Each entry: ``thread``, ``stack``, ``host_rss_growth`` and ``gpu_allocated_growth`` (bytes; the
    GPU one None where no GPU was sampled), ``intervals`` (stack samples attributed). Only stacks whose
    total growth is positive, largest first.
    """
    rows = _table(table, *_CODES)
    if not rows.num_rows:
        return []
    kinds, kind_words = _codes(rows["kind"])
    code = np.array([fmt.KIND_CODES.get(w, 0) for w in kind_words], np.int64)[kinds] if len(kinds) else kinds
    stack_rows = np.flatnonzero(code == _CODES["stack_sample"])
    if not len(stack_rows):
        return []
    host = _attribute(rows, np.flatnonzero(code == _CODES["sample"]), "host_rss", stack_rows)
    gpu, gpu_seen = np.zeros(len(stack_rows)), np.zeros(len(stack_rows), bool)
    gpu_rows = np.flatnonzero(code == _CODES["gpu_sample"])
    devices = rows["device"].fill_null(-1).to_numpy(zero_copy_only=False)
    for device in np.unique(devices[gpu_rows]).tolist():
        share = _attribute(rows, gpu_rows[devices[gpu_rows] == device], "gpu_allocated", stack_rows)
        gpu_seen |= ~np.isnan(share)
        gpu += np.nan_to_num(share)
    stacks, stack_words = _codes(rows["detail"])
    names, name_words = _codes(rows["label"])
    seen = ~np.isnan(host) | gpu_seen
    key = stacks[stack_rows] * (len(name_words) + 1) + names[stack_rows] + 1
    out = []
    for k in np.unique(key[seen]).tolist():
        mine = seen & (key == k)
        h, g = np.nansum(host[mine]), gpu[mine].sum()
        s, n = divmod(k, len(name_words) + 1)
        out.append({
            "thread": name_words[n - 1] if n else None,
            "stack": stack_words[s] if 0 <= s < len(stack_words) else None,
            "host_rss_growth": int(round(h)),
            "gpu_allocated_growth": int(round(g)) if len(gpu_rows) else None,
            "intervals": int(mine.sum()),
        })  # fmt: skip
    out = [e for e in out if _total(e) > 0]
    out.sort(key=lambda e: (-_total(e), str(e["stack"] or "")))
    return out[:top]


def _total(entry: dict[str, Any]) -> int:
    return int(entry["host_rss_growth"]) + int(entry["gpu_allocated_growth"] or 0)


def _attribute(rows: pa.Table, series: np.ndarray, gauge: str, stack_rows: np.ndarray) -> np.ndarray:
    """Per stack row: its share of the growth of ``gauge`` over the interval it lies in (NaN: in no
    interval of this series). ``series``: the rows of one gauge series, in order."""
    values = rows[gauge].to_numpy(zero_copy_only=False)
    series = series[~np.isnan(values[series].astype(float))] if len(series) else series
    out = np.full(len(stack_rows), np.nan)
    if len(series) < 2:
        return out
    growth = np.diff(values[series].astype(np.int64)).astype(float)  # interval j: series[j] .. series[j + 1]
    j = np.searchsorted(series, stack_rows) - 1  # the interval each stack row lies in
    inside = (j >= 0) & (j < len(growth))
    count = np.bincount(j[inside], minlength=len(growth))
    out[inside] = growth[j[inside]] / count[j[inside]]
    return out


def stack_report(table: pa.Table) -> dict[str, Any] | None:
    """``stacks`` in a ring's metadata: what it was doing at the end, and where memory grew."""
    if not len(of_kind(table, "stack_sample", columns=["kind"])):
        return None
    return {
        "window_s": LAST_SECONDS,
        "last": last_stacks(table),
        "memory_growth": memory_growth(table),
    }
