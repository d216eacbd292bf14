"""A lone ring's row groups are begun on the writer's pool as soon as its timeline is made (``bundle._Ahead``),
while the ring is diagnosed and the verdict put out, and written after the verdict as before: the same
timeline, byte for byte, as when they wait; and where beginning them fails, the bundle is still whole."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import blackbox
from blackbox._postmortem import write_postmortem
from blackbox.recovery import bundle, pipeline
from blackbox.recovery.row_groups import RowGroupWriter

ROWS = 4_096  # a row group, here: the ring below makes six of them and a rest


@pytest.fixture(scope="module")
def ring(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ahead") / "lone.ring"
    rec = blackbox.Recorder.arm(path, capacity=1 << 15, sample_interval=3600)
    for i in range(6 * ROWS + 1_000):
        rec.mark("loss", i)
    rec.disarm()
    return path


def _noted(monkeypatch: pytest.MonkeyPatch, events: list[tuple[str, str]]) -> None:
    """Note, in order, with the thread: row groups begun, the diagnosis, the verdict put out, rows written."""

    def wrap(owner: Any, name: str, event: str) -> None:
        real = getattr(owner, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            events.append((event, threading.current_thread().name))
            return real(*args, **kwargs)

        monkeypatch.setattr(owner, name, call)

    wrap(RowGroupWriter, "begin", "begun")
    wrap(pipeline, "diagnose", "diagnosed")
    wrap(bundle, "_put_verdict", "verdict")
    wrap(RowGroupWriter, "_append", "written")


def test_a_lone_ring_s_row_groups_are_encoded_while_it_is_diagnosed_and_written_after_the_verdict(
    ring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundle, "ROW_GROUP", ROWS)
    events: list[tuple[str, str]] = []
    _noted(monkeypatch, events)
    write_postmortem([ring], tmp_path / "ahead", plot=False, raw=False)
    names = [event for event, _ in events]
    assert names[:3] == ["begun", "diagnosed", "verdict"]
    assert names[3:] == ["written"] * 7  # six begun ahead, then the rest
    assert events[0][1] == events[1][1] != threading.current_thread().name  # on the thread decoding the ring
    # the same file as when nothing is begun ahead
    monkeypatch.setattr(bundle._Ahead, "offer", lambda self, table: None)
    write_postmortem([ring], tmp_path / "waited", plot=False, raw=False)
    ahead, waited = ((tmp_path / out / bundle.TIMELINE).read_bytes() for out in ("ahead", "waited"))
    assert ahead == waited


def test_a_failure_to_begin_them_leaves_the_bundle_whole(
    ring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bundle, "ROW_GROUP", ROWS)
    write_postmortem([ring], tmp_path / "ahead", plot=False, raw=False)

    def failing(self: RowGroupWriter, table: object, size: int) -> list[object]:
        raise MemoryError("planted")

    monkeypatch.setattr(RowGroupWriter, "begin", failing)
    meta = write_postmortem([ring], tmp_path / "failed", plot=False, raw=False)
    assert meta["complete"] and "unread_rings" not in meta
    ahead, failed = ((tmp_path / out / bundle.TIMELINE).read_bytes() for out in ("ahead", "failed"))
    assert ahead == failed


def test_rings_of_a_folder_are_not_begun_ahead(ring: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several rings, another ring's rows may be held or written meanwhile: nothing is begun ahead."""
    monkeypatch.setattr(bundle, "ROW_GROUP", ROWS)
    folder = tmp_path / "rings"
    folder.mkdir()
    for name in ("a.ring", "b.ring"):
        (folder / name).write_bytes(ring.read_bytes())
    events: list[tuple[str, str]] = []
    _noted(monkeypatch, events)
    meta = write_postmortem([folder], tmp_path / "out", plot=False, raw=False)
    assert len(meta["rings"]) == 2 and "begun" not in [event for event, _ in events]
