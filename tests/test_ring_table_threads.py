"""A timeline's columns made on two threads (``timeline.ring_table``: a large ring's payload columns on a
thread of their own) are those made on one."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.recovery import timeline
from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import read_ring


def test_a_timeline_made_with_its_payload_beside_is_the_one_made_in_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A large ring's payload columns are made on a thread of their own (``timeline._BESIDE_ROWS``): the
    same timeline, and the same counts of lost labels and clamped times, as made all on one thread, for a
    ring of every kind and the golden rings of each version."""
    sys.path.insert(0, str(REPO / "tools"))
    from craft_ring import craft_v3, mixed_records

    mixed = craft_v3(tmp_path / "mixed.ring", {2: "m"}, {}, {}, mixed_records(5_000, 1))
    rings = [mixed, *sorted((REPO / "tests" / "data").glob("ring-v*.ring"))]
    threads: list[str] = []
    payload = timeline._payload

    def noted(*args: object) -> dict[str, object]:
        threads.append(threading.current_thread().name)
        return payload(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(timeline, "_payload", noted)
    monkeypatch.setattr(timeline, "_BESIDE_ROWS", 0)
    beside = [(ring_table(r), r.recovery) for r in map(read_ring, rings)]
    assert all(name.startswith("blackbox-table") for name in threads) and len(threads) == len(rings)
    monkeypatch.setattr(timeline, "_BESIDE_ROWS", 1 << 62)
    in_turn = [(ring_table(r), r.recovery) for r in map(read_ring, rings)]
    assert threads[len(rings):] == [threading.current_thread().name] * len(rings)
    for path, (mine, mine_counts), (theirs, their_counts) in zip(rings, beside, in_turn, strict=True):
        assert mine.equals(theirs), path.name
        assert mine_counts == their_counts, path.name
    assert beside[0][0].num_rows == 5_000
