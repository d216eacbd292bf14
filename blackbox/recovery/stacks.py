"""What the job was doing, from the stack samples of one ring's timeline.

Pure functions over the timeline table (no I/O). A stack is the ``detail`` of a
``stack_sample`` row (folded, outermost frame first) with the thread's name (its
``label``). Time-sampled stacks say what ran, not what allocated: where the
memory went is ``allocs`` (allocations sampled by bytes), never growth charged
to whatever stack a tick happened to see.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from .timeline import of_kind

LAST_SECONDS = 5.0  # "what it was doing": the stacks of the last seconds before the last event
TOP = 5


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


def sampled_threads(table: pa.Table) -> list[str]:
    """The names of the threads whose stacks were sampled (the main thread first)."""
    names = [n for n in of_kind(table, "stack_sample", columns=["label"])["label"].unique().to_pylist() if n]
    return sorted(names, key=lambda n: (n != "MainThread", n))


def stack_report(table: pa.Table) -> dict[str, Any] | None:
    """``stacks`` in a ring's metadata: what it was doing at the end, and which threads were sampled."""
    if not len(of_kind(table, "stack_sample", columns=["kind"])):
        return None
    return {"window_s": LAST_SECONDS, "last": last_stacks(table), "threads": sampled_threads(table)}
