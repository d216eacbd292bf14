"""SpilledRings: rings' metadata kept on disk while a recovery runs, read back as metadata.json holds it."""

from __future__ import annotations

import errno
import io
import json
import subprocess
import tempfile
from typing import Any

import pytest

from blackbox.recovery.bundle import _dump
from blackbox.recovery.spill import SpilledRings

METAS = [
    {"rank": 0, "host": "a", "death": {"cause": "killed", "victim": None}, "peaks": {"host_rss": {"bytes": 1 << 40}}},
    {"rank": 1, "host": "b\u00e9\n\x1b", "notes": ["x", 2.5, True, None], "nested": {"deep": [[{}]]}},
    {"rank": 2, "empty": {}},
]


def test_rings_read_back_as_json_holds_them_in_order() -> None:
    rings = SpilledRings(METAS)
    assert len(rings) == 3 and bool(rings)
    assert list(rings) == METAS and rings == METAS and rings != METAS[:2] and rings != "abc"
    assert rings[0] == METAS[0] and rings[-1] == METAS[2] and rings[1:] == METAS[1:]
    assert [m["rank"] for m in rings if m["rank"] > 0] == [1, 2]
    with pytest.raises(IndexError):
        rings[3]
    with pytest.raises(IndexError):
        rings[-4]
    # reading does not disturb appending, nor appending reading
    it = iter(rings)
    assert next(it) == METAS[0]
    rings.append({"rank": 3})
    assert [m["rank"] for m in it] == [1, 2, 3]
    assert not SpilledRings() and SpilledRings() == []


def test_rings_are_kept_in_an_unnamed_temporary_file() -> None:
    rings = SpilledRings(METAS)
    assert not isinstance(rings._file, io.BytesIO)
    assert rings._file.name is not None and not str(rings._file.name).startswith("/")  # no name left on disk


def test_without_a_temporary_folder_rings_are_kept_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(*args: Any, **kw: Any) -> Any:
        raise PermissionError(errno.EACCES, "Permission denied", "/tmp")

    monkeypatch.setattr(tempfile, "TemporaryFile", refused)
    rings = SpilledRings(METAS)
    assert isinstance(rings._file, io.BytesIO) and list(rings) == METAS


class FillsUp(io.BytesIO):
    """A temporary file on a disk that fills up after ``room`` bytes."""

    def __init__(self, room: int) -> None:
        super().__init__()
        self.room = room

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_a_full_disk_midway_keeps_every_ring_in_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    first = len(json.dumps(METAS[0], separators=(",", ":")))
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **kw: FillsUp(first + 10))
    rings = SpilledRings(METAS)
    assert type(rings._file) is io.BytesIO and list(rings) == METAS


def test_metadata_json_of_spilled_rings_is_json_dump_of_them(tmp_path: Any) -> None:
    odd_keys = {1: "int", None: "none", False: "bool", 2.5: "float", "s": float("nan")}
    for meta in (
        {},
        {"rings": SpilledRings()},
        {"cause": "killed", "rings": SpilledRings(METAS), "n": [1, {}]},
        odd_keys,
    ):
        sink = io.BytesIO()
        _dump(meta, sink)
        plain = {k: list(v) if isinstance(v, SpilledRings) else v for k, v in meta.items()}
        assert sink.getvalue().decode("utf-8") == json.dumps(plain, indent=2) + "\n"


@pytest.fixture
def small_tmpfs(tmp_path: Any) -> Any:
    """A 64 KiB tmpfs, as a full temporary folder: mounted here (we run as root) or the test is skipped."""
    where = tmp_path / "tmpfs"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def test_a_temporary_folder_that_really_fills_keeps_every_ring(
    small_tmpfs: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a temporary folder with 12 KiB left and rings' metadata of 1.7 KB each (below any write buffer)
    (small_tmpfs / "ballast").write_bytes(bytes(52 << 10))
    monkeypatch.setattr(tempfile, "tempdir", str(small_tmpfs))
    metas = [{"rank": i, "host": "node000", "notes": ["x" * 1700]} for i in range(30)]
    # WHEN they are spilled, the disk filling on the way
    rings = SpilledRings()
    for m in metas:
        rings.append(m)
    # THEN none is lost: the spilled ones and the rest are kept in memory, readable in order
    assert type(rings._file) is io.BytesIO
    assert list(rings) == metas and rings[7] == metas[7]


def test_a_pass_over_spilled_rings_is_made_once_until_a_ring_is_appended(monkeypatch: pytest.MonkeyPatch) -> None:
    """rank_rows and ring_sites (ranks.parquet and both summaries ask for them) parse each spilled ring once."""
    from blackbox.recovery.allocs import ring_sites
    from blackbox.recovery.ranks import rank_rows

    rings = SpilledRings([{"host": "h", "pid": i, "death": {"cause": "killed"}} for i in range(3)])
    reads: list[int] = []
    real = SpilledRings._read
    monkeypatch.setattr(SpilledRings, "_read", lambda self, i: reads.append(i) or real(self, i))
    meta: dict[str, Any] = {"rings": rings}
    first = rank_rows(meta)
    assert [r["pid"] for r in first] == [0, 1, 2] and reads == [0, 1, 2]
    assert rank_rows(meta) is first and reads == [0, 1, 2]
    assert ring_sites(rings) == [] and ring_sites(rings) == [] and reads == [0, 1, 2] * 2
    rings.append({"host": "h", "pid": 3, "death": {"cause": "clean_exit"}})
    assert [r["cause"] for r in rank_rows(meta)] == ["killed"] * 3 + ["clean_exit"]
    assert reads == [0, 1, 2] * 2 + [0, 1, 2, 3]
    as_list = {"rings": [rings[i] for i in range(4)]}  # rings held in memory are not cached: lists may change
    assert rank_rows(as_list) == rank_rows(meta) and rank_rows(as_list) is not rank_rows(as_list)
