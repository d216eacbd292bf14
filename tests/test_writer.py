"""The hot path: what mark, step and phase write, threads, wrap-around, the string region."""

from __future__ import annotations

import threading
import warnings
from pathlib import Path

import numpy as np
from conftest import labels_of, reread, tick_kinds

import blackbox
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring


def kinds(ring) -> list[str]:
    return [fmt.kind_name(int(k)) for k in ring.records["kind"]]


def test_mark_records_label_value_and_null_value(recorder: blackbox.Recorder) -> None:
    recorder.mark("checkpoint", 42)
    recorder.mark("no-value")
    ring = reread(recorder)
    marks = ring.records[ring.records["kind"] == fmt.KIND_CODES["mark"]]
    assert [ring.strings[int(i)] for i in marks["label"]] == ["checkpoint", "no-value"]
    assert int(marks["value"][0]) == 42 and marks["flags"][0] & fmt.FLAG_VALUE
    assert not marks["flags"][1] & fmt.FLAG_VALUE


def test_arm_writes_arm_event_and_first_sample(recorder: blackbox.Recorder) -> None:
    ring = reread(recorder)
    assert kinds(ring)[:3] == ["arm", "stack_sample", "sample"]
    sample = ring.records[2]
    assert int(sample["p0"]) > 1 << 20  # host RSS of a Python process is over 1 MiB


def test_step_sets_the_step_in_force_for_later_events(recorder: blackbox.Recorder) -> None:
    recorder.mark("before")
    recorder.step()
    recorder.mark("in step 0")
    recorder.step(7)
    recorder.mark("in step 7")
    recorder.step()
    ring = reread(recorder)
    by_label = dict(zip(labels_of(ring), ring.records["step"].tolist(), strict=True))
    assert by_label["before"] == -1 and by_label["in step 0"] == 0 and by_label["in step 7"] == 7
    steps = ring.records[ring.records["kind"] == fmt.KIND_CODES["step"]]
    assert steps["value"].tolist() == [0, 7, 8]
    assert recorder.current_step() == 8


def test_phase_writes_begin_and_end_with_duration(recorder: blackbox.Recorder) -> None:
    with recorder.phase("forward"):
        recorder.mark("inside")
    ring = reread(recorder)
    assert kinds(ring)[-3:] == ["phase_begin", "mark", "phase_end"]
    begin, end = ring.records[-3], ring.records[-1]
    assert ring.strings[int(begin["label"])] == "forward" == ring.strings[int(end["label"])]
    assert 0 < int(end["value"]) <= int(end["time"]) - int(begin["time"])


def test_seq_and_time_agree_across_threads(recorder: blackbox.Recorder) -> None:
    n, threads = 2000, 4
    start, done = threading.Barrier(threads), threading.Barrier(threads)

    def work(k: int) -> None:
        start.wait()  # all alive at once, so no two share a thread ident
        for i in range(n):
            recorder.mark(f"t{k}", i)
        done.wait()

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    # allocation sampling off: its hooks' records may land between a writer's seq and its clock (FORMAT.md, "Time")
    big = blackbox.Recorder.arm(recorder.path.parent / "big.ring", capacity=1 << 14, sample_interval=0.001,
                                allocations=False)  # fmt: skip
    recorder.mark = big.mark  # type: ignore[method-assign]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    big.disarm()
    ring = read_ring(big.path)
    r = ring.records
    assert np.all(np.diff(r["seq"].astype(np.int64)) == 1)  # every seq exactly once
    assert np.all(np.diff(r["time"]) >= 0)  # time never goes backwards in seq order
    labels = labels_of(ring)
    for k in range(threads):
        values = [int(v) for v, lab in zip(r["value"], labels, strict=True) if lab == f"t{k}"]
        assert values == list(range(n))
    marks = [int(t) for t, lab in zip(r["thread"], labels, strict=True) if lab and lab.startswith("t")]
    assert len(set(marks)) == threads


def test_wrap_around_keeps_newest_capacity_events(tmp_path: Path, writer_backend: str) -> None:
    rec = blackbox.Recorder.arm(tmp_path / "w.ring", capacity=64, sample_interval=3600, allocations=False)
    for i in range(1000):
        rec.mark("m", i)
    ring = read_ring(rec.path)  # read while armed: a live snapshot
    rec.disarm()
    assert ring.recovery.valid == 64 and ring.recovery.empty == 0
    head = 1 + len(tick_kinds()) + 1000  # arm, the first sample tick, the marks
    assert ring.recovery.last_seq == head and ring.recovery.first_seq == head - 63
    assert ring.recovery.overwritten == head - 64
    assert ring.records["value"].tolist() == list(range(1000 - 64, 1000))


def test_string_region_full_gives_placeholder_label(tmp_path: Path, writer_backend: str) -> None:
    rec = blackbox.Recorder.arm(tmp_path / "s.ring", capacity=4096, sample_interval=3600, strings_size=4096)
    for i in range(400):
        rec.mark(f"label number {i}")
    rec.mark("label number 3")  # interned before the region filled: still resolves
    rec.disarm()
    ring = read_ring(rec.path)
    labels = [lab for lab in labels_of(ring) if lab and lab.startswith(("label", "<blackbox"))]
    stored = sum(1 for lab in labels[:400] if lab.startswith("label number"))
    assert 100 < stored < 400  # 4 KiB holds some of them, not all
    assert labels[:stored] == [f"label number {i}" for i in range(stored)]
    assert labels[stored:400] == [fmt.STRING_FULL_TEXT] * (400 - stored)
    assert labels[-1] == "label number 3"


def test_long_label_is_truncated_not_lost(recorder: blackbox.Recorder) -> None:
    recorder.mark("x" * 10_000)
    ring = reread(recorder)
    text = labels_of(ring)[-1]
    assert text is not None and text.startswith("xxx") and text.endswith("\u2026")
    assert len(text.encode()) <= fmt.MAX_STRING_BYTES


def test_bad_arguments_warn_once_and_never_raise(recorder: blackbox.Recorder) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        recorder.mark("too big", 1 << 70)
        recorder.mark("unhashable label", [1])  # type: ignore[arg-type]
        recorder.step(-3)
        recorder.step("seven")  # type: ignore[arg-type]
    assert len([w for w in caught if issubclass(w.category, blackbox.BlackboxWarning)]) == 1
    recorder.mark("still works", 1)
    assert labels_of(reread(recorder))[-1] == "still works"


def test_writes_after_disarm_are_ignored(tmp_path: Path, writer_backend: str) -> None:
    rec = blackbox.Recorder.arm(tmp_path / "d.ring", capacity=64, sample_interval=3600)
    mark = rec.mark
    rec.disarm()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mark("late", 1)
        rec.mark("late", 2)
        rec.step()
        with rec.phase("late"):
            pass
    ring = read_ring(rec.path)
    assert ring.clean and "late" not in labels_of(ring)
