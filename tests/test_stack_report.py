"""What the job was doing: ``recovery.stacks.last_stacks`` counts the stack samples of a ring's last
seconds per (thread, stack), against counts planted in a timeline."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa

from blackbox.recovery.stacks import last_stacks, stack_report
from blackbox.recovery.timeline import TIMELINE_SCHEMA

S = 10**9  # ns a second


def timeline(rows: list[dict[str, Any]]) -> pa.Table:
    """A ring's timeline of these rows (every other column null), with the dictionary columns a ring's
    timeline has."""
    table = pa.Table.from_pylist([{c: r.get(c) for c in TIMELINE_SCHEMA.names} for r in rows], schema=TIMELINE_SCHEMA)
    return table.combine_chunks()


def sample(t: float, thread: int, name: str | None, stack: str | None) -> dict[str, Any]:
    return {"time": int(t * S), "kind": "stack_sample", "thread": thread, "label": name, "detail": stack}


def test_the_last_seconds_are_counted_per_thread_and_stack_with_shares_of_the_thread() -> None:
    # GIVEN samples before the window (t < 95 s) that must not count, and in it: thread 1 (MainThread) in
    # train 6 times and in load 2 times, thread 2 (pin_memory) in pin 3 times, then a last event at 100 s
    planted = {(1, "MainThread", "main;train"): 6, (1, "MainThread", "main;load"): 2, (2, "pin_memory", "pin"): 3}
    rows = [sample(10 + i, 1, "MainThread", "main;old") for i in range(50)]  # outside the window
    t = 95.5
    for (thread, name, stack), n in planted.items():
        for _ in range(n):
            rows.append(sample(t, thread, name, stack))
            t += 0.1
    rows.append({"time": 100 * S, "kind": "mark", "label": "loss", "thread": 1})
    # WHEN the last five seconds are counted
    got = last_stacks(timeline(rows), seconds=5.0, top=10)
    # THEN each (thread, stack) has its planted count and its share of its own thread's samples
    assert got == [
        {"thread": "MainThread", "stack": "main;train", "samples": 6, "share": 0.75},
        {"thread": "pin_memory", "stack": "pin", "samples": 3, "share": 1.0},
        {"thread": "MainThread", "stack": "main;load", "samples": 2, "share": 0.25},
    ]


def test_ties_go_by_name_then_stack_then_thread_id_and_nulls_are_kept() -> None:
    # GIVEN two threads both named "w" (ids 9 and 3), a thread with no name and a sample with no stack,
    # two samples each
    rows = []
    for thread, name, stack in [(9, "w", "b"), (3, "w", "b"), (3, "w", "a"), (5, None, "a"), (4, "x", None)]:
        rows += [sample(1.0, thread, name, stack), sample(1.5, thread, name, stack)]
    # WHEN counted
    got = last_stacks(timeline(rows), top=10)
    # THEN ties are ordered by thread name ("" for none), stack ("" for none), then thread id
    assert [(e["thread"], e["stack"], e["share"]) for e in got] == [
        (None, "a", 1.0), ("w", "a", 0.5), ("w", "b", 0.5), ("w", "b", 1.0), ("x", None, 1.0),
    ]  # fmt: skip
    assert all(e["samples"] == 2 for e in got)


def test_only_the_top_entries_are_kept_and_a_ring_without_stack_samples_has_no_report() -> None:
    # GIVEN 12 stacks sampled 1 to 12 times each
    rows = [sample(1.0 + k / 100, 1, "MainThread", f"s{k}") for k in range(1, 13) for _ in range(k)]
    # THEN the top 5 are the 5 most sampled, in order
    assert [e["stack"] for e in last_stacks(timeline(rows))] == ["s12", "s11", "s10", "s9", "s8"]
    # AND a timeline with no stack sample has no stack report, and an empty one no stacks
    marks = timeline([{"time": S, "kind": "mark", "label": "loss", "thread": 1}])
    assert stack_report(marks) is None and last_stacks(timeline([])) == []


def test_a_million_stack_samples_are_counted_exactly() -> None:
    # GIVEN a million stack samples over 3 threads and 1,000 stacks, all inside the window (a ring of
    # nothing but stack samples: tools/bench_recover_memory.py times it, tests/test_bounded.py bounds its memory)
    n = 1 << 20
    ids = pa.array([(i * 7919) % 1000 for i in range(n)])
    table = pa.table(
        {
            "time": pa.array(range(n), pa.int64()).cast(pa.timestamp("ns", tz="UTC")),
            "kind": pa.DictionaryArray.from_arrays(pa.array([0] * n, pa.int32()), pa.array(["stack_sample"])),
            "thread": pa.array([i % 3 for i in range(n)], pa.uint64()),
            "label": pa.DictionaryArray.from_arrays(pa.array([i % 3 for i in range(n)], pa.int32()),
                                                    pa.array(["MainThread", "a", "b"])),  # fmt: skip
            "detail": pa.DictionaryArray.from_arrays(ids.cast(pa.int32()), pa.array([f"s{k}" for k in range(1000)])),
        }
    )
    # WHEN counted
    got = last_stacks(table, top=3)
    # THEN the counts are those of each (thread, stack) pair's rows counted one by one
    want = Counter(zip((i % 3 for i in range(n)), ((i * 7919) % 1000 for i in range(n)), strict=True))
    top = sorted(want.items(), key=lambda kv: (-kv[1], ["MainThread", "a", "b"][kv[0][0]], f"s{kv[0][1]}"))[:3]
    assert [(e["thread"], e["stack"], e["samples"]) for e in got] == [
        (["MainThread", "a", "b"][t], f"s{s}", c) for (t, s), c in top
    ]
