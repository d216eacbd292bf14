"""Property tests: random event streams, a crash at a random point mid-record, and random damage."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from conftest import labels_of, tick_kinds
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import blackbox
from blackbox.recovery.timeline import ring_table
from blackbox.ring import format as fmt
from blackbox.ring.reader import read_ring

EVENT = st.one_of(
    st.tuples(
        st.just("mark"),
        st.sampled_from(["a", "bb", "ccc", "é", ""]),
        st.one_of(st.none(), st.integers(-(1 << 63), (1 << 63) - 1)),
    ),
    st.tuples(st.just("step"), st.none(), st.one_of(st.none(), st.integers(0, 1 << 40))),
    st.tuples(st.just("phase"), st.sampled_from(["forward", "backward"]), st.none()),
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events=st.lists(EVENT, max_size=120), capacity=st.integers(16, 64), cut=st.integers(1, 127))
def test_crash_mid_record_returns_exactly_the_committed_window(events, capacity, cut) -> None:
    with tempfile.TemporaryDirectory() as d:
        rec = blackbox.Recorder.arm(Path(d) / "p.ring", capacity=capacity, sample_interval=3600,
                                    allocations=False)  # the writer's own records alone: exact seqs below
        model: list[tuple[str, str | None, int | None, int]] = [("arm", None, capacity, -1)]
        model += [(k, None, None, -1) for k in tick_kinds()]
        step = -1
        for kind, label, value in events:
            if kind == "mark":
                rec.mark(label, value)
                model.append(("mark", label, value, step))
            elif kind == "step":
                step = step + 1 if value is None else value
                rec.step(value)
                model.append(("step", None, step, step))
            else:
                with rec.phase(label):
                    pass
                model += [("phase_begin", label, None, step), ("phase_end", label, -1, step)]
        crashed = Path(d) / "crashed.ring"
        shutil.copyfile(rec.path, crashed)  # the file as a SIGKILL would leave it...
        rec.disarm()
        head = len(model)
        ring0 = read_ring(crashed)
        # ...with the next record cut after `cut` bytes (pack_into zeroes the slot, then writes in order)
        nxt = head + 1
        raw = bytearray(fmt.EVENT_STRUCT.pack(nxt, 1, 1, step, 5, 0, 5, 1, -1, nxt))
        slot_at = ring0.header.records_offset + (nxt % capacity) * fmt.RECORD_SIZE
        with open(crashed, "r+b") as f:
            f.seek(slot_at)
            f.write(bytes(raw[:cut]) + bytes(fmt.RECORD_SIZE - cut))
        ring = read_ring(crashed)
        table = ring_table(ring)
        complete = not any(raw[cut:])  # the bytes not yet written were zeros anyway: it committed
        if complete:
            model.append(("mark", "", 5, step))
            head = nxt
        lost_to_tear = nxt - capacity  # the oldest record in the window was being overwritten
        expected_seqs = [s for s in range(max(1, head - capacity + 1), head + 1) if s != lost_to_tear]
        assert ring.records["seq"].tolist() == expected_seqs
        assert ring.recovery.torn == (0 if complete or not any(raw[:cut]) else 1)
        got_kinds = table["kind"].to_pylist()
        labels = labels_of(ring)
        for i, s in enumerate(expected_seqs):
            kind, label, value, step_in_force = model[s - 1]
            assert got_kinds[i] == kind
            if kind in ("mark", "phase_begin", "phase_end") and s != nxt:
                assert labels[i] == label
            if kind in ("mark", "step"):
                assert table["value"][i].as_py() == value
            if kind not in ("sample", "cgroup_sample"):
                assert table["step"][i].as_py() == (None if step_in_force < 0 else step_in_force)


@settings(max_examples=80, deadline=None)
@given(offsets=st.lists(st.integers(0, 10**9), min_size=1, max_size=40), data=st.data())
def test_random_damage_never_crashes_the_reader(offsets, data) -> None:
    with tempfile.TemporaryDirectory() as d:
        rec = blackbox.Recorder.arm(Path(d) / "g.ring", capacity=32, sample_interval=3600, strings_size=4096,
                                    allocations=False)
        for i in range(50):
            rec.mark(f"l{i % 7}", i)
        rec.disarm()
        raw = bytearray(Path(rec.path).read_bytes())
        for off in offsets:
            raw[off % len(raw)] = data.draw(st.integers(0, 255))
        cut = data.draw(st.integers(0, len(raw)))
        bad = Path(d) / "bad.ring"
        bad.write_bytes(bytes(raw[:cut]))
        try:
            ring = read_ring(bad)
        except blackbox.BlackboxError as exc:
            assert "\n" not in str(exc)
            return
        ring_table(ring)  # salvage must always turn into a timeline
        assert ring.recovery.valid + ring.recovery.torn + ring.recovery.empty + ring.recovery.stale == (
            ring.recovery.slots_read
        )
