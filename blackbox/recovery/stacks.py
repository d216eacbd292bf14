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
import pyarrow.compute as pc

from .kinds import of_kind

LAST_SECONDS = 5.0  # "what it was doing": the stacks of the last seconds before the last event
TOP = 5


def codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[Any]]:
    """(index of each row's value in the dictionary, -1 for null; the dictionary) of a one-chunk column."""
    if column.num_chunks == 0:
        return np.zeros(0, np.int64), []
    chunk = column.chunk(0)
    if not pa.types.is_dictionary(chunk.type):
        chunk = chunk.dictionary_encode()
    index = chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    return index, chunk.dictionary.to_pylist()


def last_stacks(table: pa.Table, seconds: float = LAST_SECONDS, top: int = TOP) -> list[dict[str, Any]]:
    """The stacks sampled in the last ``seconds`` before the timeline's last event, most sampled first.

    Each entry: ``thread`` (name), ``stack`` (folded), ``samples`` and ``share`` (of that thread's
    samples in the window, 0..1). Ties go by thread name, stack, then thread id.

    Counted through integer codes (the thread, the stack's and the name's dictionary codes, nulls last),
    packed into one key a pair at a time: a ring of a million stack samples costs two sorts of int64
    keys and the window's three columns, where counting rows of three words (``np.unique(axis=1)``) took
    1.9 s and about 50 MiB of copies.
    """
    if not table.num_rows:
        return []
    last = pc.max(table["time"])
    if not last.is_valid:
        return []
    since = pa.scalar(last.value - int(seconds * 1e9), last.type)
    rows = of_kind(table, "stack_sample", columns=["time", "thread", "label", "detail"])
    rows = rows.filter(pc.greater_equal(rows["time"], since)).select(["thread", "label", "detail"])
    rows = rows.unify_dictionaries().combine_chunks()
    if not rows.num_rows:
        return []
    stacks, stack_words = codes(rows["detail"])
    names, name_words = codes(rows["label"])
    thread_ids, threads = np.unique(rows["thread"].to_numpy(zero_copy_only=False), return_inverse=True)
    threads_stacks, key = _packed(threads.ravel(), stacks, len(stack_words))
    keys, counts = np.unique(key * (len(name_words) + 1) + np.where(names < 0, len(name_words), names),
                             return_counts=True)  # fmt: skip
    pair, name_of = np.divmod(keys, len(name_words) + 1)
    thread_of, stack_of = np.divmod(threads_stacks[pair], len(stack_words) + 1)
    per_thread = np.bincount(thread_of, weights=counts, minlength=len(thread_ids))
    out = [
        {
            "thread": name_words[n] if n < len(name_words) else None,
            "stack": stack_words[s] if s < len(stack_words) else None,
            "samples": c,
            "share": round(c / int(per_thread[t]), 4),
        }
        for t, s, n, c in zip(thread_of.tolist(), stack_of.tolist(), name_of.tolist(), counts.tolist(), strict=True)
    ]
    out.sort(key=lambda e: (-int(e["samples"] or 0), str(e["thread"] or ""), str(e["stack"] or "")))
    return out[:top]


def _packed(threads: np.ndarray, stacks: np.ndarray, words: int) -> tuple[np.ndarray, np.ndarray]:
    """(the distinct (thread, stack) pairs, ascending, each packed as thread * (words + 1) + stack; each
    row's index among them). A null stack (-1) is ``words``: after every stack, as it was when the codes
    were compared as uint64. A dictionary code is below 2**31 (int32 indices), and so is a ring's count of
    threads (far below its rows), so the products stay within int64."""
    pairs = threads.astype(np.int64) * (words + 1) + np.where(stacks < 0, words, stacks)
    distinct, index = np.unique(pairs, return_inverse=True)
    return distinct, index.ravel()


def sampled_threads(table: pa.Table) -> list[str]:
    """The names of the threads whose stacks were sampled (the main thread first)."""
    names = [n for n in of_kind(table, "stack_sample", columns=["label"])["label"].unique().to_pylist() if n]
    return sorted(names, key=lambda n: (n != "MainThread", n))


def stack_report(table: pa.Table) -> dict[str, Any] | None:
    """``stacks`` in a ring's metadata: what it was doing at the end, and which threads were sampled."""
    if not len(of_kind(table, "stack_sample", columns=["kind"])):
        return None
    return {"window_s": LAST_SECONDS, "last": last_stacks(table), "threads": sampled_threads(table)}
