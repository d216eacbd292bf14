"""Recovery of many rings in bounded memory: rings decoded a few at a time within a byte budget, their
rows written in shared row groups, their metadata kept on disk until metadata.json, and a read of one
rank's rows that skips the row groups of the others."""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import REPO
from users import local_users, shared_folder

import blackbox
from blackbox._postmortem import write_postmortem
from blackbox.recovery import bundle, live_stacks, pipeline
from blackbox.recovery.pipeline import RecoveryPass, recover_rings
from blackbox.recovery.spill import SpilledRings
from blackbox.recovery.timeline import TIMELINE_SCHEMA

RANKS, HOSTS = 24, 2


@pytest.fixture(scope="module")
def hosts(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """24 real ranks on two host names, each with a 1 MiB ring, all SIGKILLed (rank 7 first)."""
    rings = tmp_path_factory.mktemp("fleet")
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "fleet.py"), str(rings), "--ranks", str(RANKS), "--hosts", str(HOSTS),
         "--ring-mib", "1", "--victim", "7", "--per-host"],
        check=True, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    return sorted(p for p in rings.iterdir() if p.is_dir())


@pytest.fixture(scope="module")
def shared_groups(hosts: list[Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The fleet's bundle written with row groups of 10,000 rows (each ring holds about 8,000)."""
    out = tmp_path_factory.mktemp("bundle") / "b"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(bundle, "ROW_GROUP", 10_000)
        meta = write_postmortem(hosts, out, plot=False)
    return out, meta


def test_small_rings_share_row_groups_and_no_row_is_lost(hosts: list[Path], shared_groups: tuple[Path, Any]) -> None:
    out, meta = shared_groups
    file = pq.ParquetFile(out / "timeline.parquet")
    rows = file.metadata.num_rows
    # every row of every ring is there, as the in-memory recovery has them
    whole = recover_rings(hosts).table
    assert rows == whole.num_rows == sum(m["events"] for m in meta["rings"]) == meta["events"]
    written = file.read(columns=["host", "pid", "seq"])
    assert sorted(zip(*written.to_pydict().values(), strict=True)) == sorted(
        zip(*whole.select(["host", "pid", "seq"]).to_pydict().values(), strict=True)
    )
    # in row groups of 10,000 rows whatever the rings' sizes: fewer groups than rings, only the last short
    sizes = [file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups)]
    assert len(sizes) == math.ceil(rows / 10_000) < RANKS
    assert set(sizes[:-1]) == {10_000} and 0 < sizes[-1] <= 10_000


def test_a_read_of_one_rank_skips_the_row_groups_of_the_others(shared_groups: tuple[Path, Any]) -> None:
    out, meta = shared_groups
    first = meta["first_death"]
    assert first["rank"] == 7
    filters = [("pid", "=", first["pid"]), ("host", "=", first["host"])]
    file = pq.ParquetFile(out / "timeline.parquet")
    groups = bundle._row_groups(file.metadata, filters)
    assert 0 < len(groups) < file.metadata.num_row_groups / 2
    # the rows read are exactly that rank's, as a filter over the whole table finds them
    with open(out / "timeline.parquet", "rb") as source:
        read = bundle.read_thinned(source, filters, ["pid", "host", "seq"], max_rows=1 << 30)
    table = file.read(columns=["pid", "host", "seq"])
    mine = table.filter(pc.and_(pc.equal(table["pid"], first["pid"]), pc.equal(table["host"], first["host"])))
    assert read.num_rows == mine.num_rows > 1000
    assert read["seq"].to_pylist() == mine["seq"].to_pylist()
    # a filter statistics cannot decide (another operator, another column) skips nothing
    every = list(range(file.metadata.num_row_groups))
    assert bundle._row_groups(file.metadata, [("pid", "!=", first["pid"]), ("nothing", "=", 1)]) == every
    assert bundle._row_groups(file.metadata, [("pid", "=", "not a number")]) == every


def test_metadata_json_holds_every_rings_metadata_written_a_ring_at_a_time(shared_groups: tuple[Path, Any]) -> None:
    out, meta = shared_groups
    assert isinstance(meta["rings"], SpilledRings) and len(meta["rings"]) == RANKS
    text = (out / "metadata.json").read_text()
    # each ring as json.dumps writes it, less its allocations' stacks (in allocations.parquet)
    plain = {k: [live_stacks.strip(m)[0] for m in v] if isinstance(v, SpilledRings) else v for k, v in meta.items()}
    assert text == json.dumps(plain, indent=2) + "\n"
    stacks = sum(len(m["allocations"].get("stacks") or []) for m in meta["rings"])  # few ranks hold a sampled block
    sites = sum(len(m["allocations"].get("sites") or []) for m in meta["rings"])  # each with its stack
    table = pq.read_table(out / "allocations.parquet")
    assert table.num_rows == stacks + sites and table["site"].null_count == stacks
    assert sorted(m["rank"] for m in json.loads(text)["rings"]) == list(range(RANKS))


def _decoded_at_once(monkeypatch: pytest.MonkeyPatch) -> list[set[Path]]:
    """Each ring's decoding (made to last 50 ms) notes which rings were being decoded at that moment."""
    lock, active, seen = threading.Lock(), set(), []
    one = RecoveryPass._one

    def watched(self: RecoveryPass, path: Path) -> Any:
        with lock:
            active.add(path)
            seen.append(set(active))
        time.sleep(0.05)
        try:
            return one(self, path)
        finally:
            with lock:
                active.discard(path)

    monkeypatch.setattr(RecoveryPass, "_one", watched)
    return seen


def _there(ring: Path) -> int:
    """The bytes a ring holds on disk, as recovery counts them (from its listing's lstat)."""
    return pipeline._bytes_there(ring, os.lstat(ring))


def _big_ring(folder: Path) -> Path:
    """A ring of 2**17 slots holding one mark: over three of the fleet's 1 MiB rings on disk."""
    big = blackbox.Recorder.arm(folder / "big.ring", capacity=1 << 17, sample_interval=3600)
    big.mark("big", 1)
    big.disarm()
    return folder / "big.ring"


def test_rings_decoded_at_once_stay_within_the_byte_budget(
    hosts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN the fleet's 1 MiB rings and one ring larger than the whole budget, four workers, and a budget
    # of two and a half small rings
    _big_ring(tmp_path / "big")
    small = _there(next(hosts[0].glob("*.ring")))
    assert _there(tmp_path / "big" / "big.ring") > 3 * small
    monkeypatch.setattr(pipeline, "_workers", lambda: 4)
    monkeypatch.setattr(pipeline, "IN_FLIGHT_BYTES", int(2.5 * small))
    seen = _decoded_at_once(monkeypatch)
    # WHEN they are recovered together
    recovered = recover_rings([hosts[0], tmp_path / "big", hosts[1]])
    # THEN every ring is recovered, at most two small ones decoded at once, the large one alone
    assert len(recovered.meta["rings"]) == RANKS + 1
    assert max(len(s) for s in seen) == 2
    for at_once in seen:
        assert len(at_once) == 1 or sum(_there(p) for p in at_once) <= pipeline.IN_FLIGHT_BYTES
    assert any(s == {tmp_path / "big" / "big.ring"} for s in seen)


def test_a_compressed_ring_is_decoded_alone_whatever_its_size_on_disk(
    hosts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN a bundle's rings kept zstd-compressed (a quarter of a ring or less on disk),
    # four workers, and a budget of many compressed files but two and a half decompressed rings
    out = tmp_path / "b"
    write_postmortem([hosts[0]], out, plot=False)
    packed = sorted((out / "rings").glob("*.zst"))
    small = _there(next(hosts[0].glob("*.ring")))
    assert len(packed) > 4 and all(4 * p.stat().st_size < small for p in packed)  # by disk, four would fit
    monkeypatch.setattr(pipeline, "_workers", lambda: 4)
    monkeypatch.setattr(pipeline, "IN_FLIGHT_BYTES", int(2.5 * small))
    seen = _decoded_at_once(monkeypatch)
    # WHEN they are recovered again
    recovered = recover_rings([out / "rings"])
    # THEN every ring is read back, one at a time (their decompressed bytes are not known beforehand)
    assert len(recovered.meta["rings"]) == len(packed)
    assert max(len(s) for s in seen) == 1


def test_tiny_rings_are_decoded_in_turn_by_the_caller_and_large_ones_by_the_workers(
    hosts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN six crafted rings of 3 marks (about 20 KiB each, under INLINE_BYTES), one host's 1 MiB rings (over
    # it), and four workers
    sys.path.insert(0, str(REPO / "tools"))
    from bench_many_rings import make_rings

    make_rings(tmp_path / "tiny", 6, 3)
    tiny = [p.name for p in (tmp_path / "tiny").glob("*.ring")]
    large = [p.name for p in hosts[0].glob("*.ring")]
    assert max(_there(tmp_path / "tiny" / n) for n in tiny) < pipeline.INLINE_BYTES
    assert min(_there(hosts[0] / n) for n in large) >= pipeline.INLINE_BYTES
    monkeypatch.setattr(pipeline, "_workers", lambda: 4)
    decoded_on: dict[str, int] = {}
    one = RecoveryPass._one

    def watched(self: RecoveryPass, path: Path) -> Any:
        decoded_on[path.name] = threading.get_ident()
        return one(self, path)

    monkeypatch.setattr(RecoveryPass, "_one", watched)
    # WHEN they are recovered together
    recovered = recover_rings([tmp_path / "tiny", hosts[0]])
    # THEN every ring is recovered: the tiny ones in the calling thread (no hand-off to a worker and back),
    # the large ones by the workers
    assert len(recovered.meta["rings"]) == len(tiny) + len(large) == len(decoded_on)
    assert {decoded_on[n] for n in tiny} == {threading.get_ident()}
    assert threading.get_ident() not in {decoded_on[n] for n in large}


def test_the_writer_holds_small_rings_rows_in_memory_that_does_not_grow_with_their_count(tmp_path: Path) -> None:
    # GIVEN 1,280 timelines of 3 rows each (a crafted tiny ring's, each a copy with buffers of its own)
    sys.path.insert(0, str(REPO / "tools"))
    from bench_many_rings import make_rings

    make_rings(tmp_path / "tiny", 1, 3)
    (ring,) = (tmp_path / "tiny").glob("*.ring")
    template = recover_rings([ring]).table
    before = pa.total_allocated_bytes()
    one = template.take(pa.array(range(3), type=pa.int64()))
    per_table = pa.total_allocated_bytes() - before  # a 3-row table's own buffers (a few KiB: one per column)
    del one
    held_bytes: list[int] = []

    def tables() -> Iterator[pa.Table]:
        for i in range(1280):
            if i % 128 == 0:
                gc.collect()
                held_bytes.append(pa.total_allocated_bytes())
            yield template.take(pa.array(range(3), type=pa.int64()))

    # WHEN the writer takes them (fewer rows than a row group: all are held until the end)
    with pq.ParquetWriter(tmp_path / "t.parquet", TIMELINE_SCHEMA) as writer:
        bundle._write_row_groups(writer, tables())
    # THEN every row is written, and the writer held the rows, not each table as it came: under a third
    # of what 1,280 such tables take (their rows are about a fifth)
    assert pq.ParquetFile(tmp_path / "t.parquet").metadata.num_rows == 3 * 1280
    assert max(held_bytes) - held_bytes[0] < 1280 * per_table / 3


def test_over_the_ring_limit_the_newest_are_recovered_and_the_rest_named(
    hosts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN one host's 12 rings, modified one a minute apart in an order that is not their names', and a
    # limit of 9 rings per recovery
    folder = tmp_path / "rings"
    folder.mkdir()
    rings = sorted(hosts[0].glob("*.ring"))
    order = rings[5:] + rings[:5]  # oldest first
    for age, ring in enumerate(order):
        (folder / ring.name).write_bytes(ring.read_bytes())
        os.utime(folder / ring.name, ns=(1_700_000_000 * 10**9 + age * 60 * 10**9,) * 2)
    monkeypatch.setattr(pipeline, "MAX_RINGS", 9)
    # WHEN the folder is recovered
    meta = write_postmortem([folder], tmp_path / "b", plot=False)
    # THEN the 9 last modified are recovered (in their names' order), the 3 oldest are named, oldest first
    kept = sorted(r.name for r in order[3:])
    assert [Path(m["ring"]).name for m in meta["rings"]] == kept
    pids = {int(r.name.split("-pid")[1].split("-")[0]) for r in order[3:]}
    assert set(pq.read_table(tmp_path / "b" / "timeline.parquet", columns=["pid"])["pid"].to_pylist()) == pids
    left = json.loads((tmp_path / "b" / "metadata.json").read_text())["rings_left_out"]
    assert left == {"limit": 9, "count": 3, "rings": [str(folder / r.name) for r in order[:3]]}
    assert "## Rings left out (3)" in (tmp_path / "b" / "summary.md").read_text()


def test_over_the_ring_limit_another_users_newer_rings_do_not_push_out_the_owners(
    hosts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with local_users("ringowner", "planter") as (owner, planter), shared_folder() as shared:
        # GIVEN a team folder of the owner's, writable by all, holding 3 of her rings (an hour old), and 4
        # copies of real rings the planter, another user, wrote there just now
        folder = shared / "team"
        folder.mkdir()
        rings = sorted(hosts[0].glob("*.ring"))
        for ring in rings[:3]:
            (folder / ring.name).write_bytes(ring.read_bytes())
            os.utime(folder / ring.name, ns=(time.time_ns() - 3600 * 10**9,) * 2)
        owner.give(folder)
        os.chmod(folder, 0o777)
        data = {ring.name: ring.read_bytes() for ring in rings[3:7]}
        planter.run(lambda: [(folder / name).write_bytes(raw) for name, raw in data.items()])
        monkeypatch.setattr(pipeline, "MAX_RINGS", 3)
        # WHEN root recovers the folder, 3 rings at most
        meta = write_postmortem([folder], tmp_path / "b", plot=False)
    # THEN the owner's 3 are recovered and the planter's 4, newer, are the ones named
    assert [Path(m["ring"]).name for m in meta["rings"]] == [r.name for r in rings[:3]]
    left = json.loads((tmp_path / "b" / "metadata.json").read_text())["rings_left_out"]
    assert sorted(Path(p).name for p in left["rings"]) == sorted(data)


def test_the_picture_draws_every_death_in_one_collection_per_panel(hosts: list[Path]) -> None:
    pytest.importorskip("matplotlib", reason="memory.png is drawn only where matplotlib is installed")
    from matplotlib.collections import LineCollection

    from blackbox.views.plot import memory_figure

    recovered = recover_rings(hosts)
    fig = memory_figure(recovered.table, recovered.meta)
    host_ax = fig.axes[0]
    # the others' deaths: one collection of 23 lines, not 23 artists per panel
    (others,) = [c for c in host_ax.collections if isinstance(c, LineCollection)]
    assert len(others.get_segments()) == RANKS - 1
    # the first death: its own line, named
    assert [t.get_text() for t in host_ax.texts] == ["rank 7 killed"]
    vertical = [line for line in host_ax.get_lines() if line.get_color() == "black"]
    assert len(vertical) == 1 and len(set(vertical[0].get_xdata())) == 1


def test_no_rings_table_is_held_while_the_next_ring_is_decoded_but_the_one_being_written(
    hosts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN rings decoded one at a time, each decode first noting which earlier rings' tables live on
    monkeypatch.setattr(pipeline, "_workers", lambda: 1)
    earlier: list[weakref.ref[Any]] = []
    alive: list[list[int]] = []
    one = RecoveryPass._one

    def watched(self: RecoveryPass, path: Path) -> Any:
        gc.collect()
        alive.append([i for i, ref in enumerate(earlier) if ref() is not None])
        result = one(self, path)
        earlier.append(weakref.ref(result[0]))
        return result

    monkeypatch.setattr(RecoveryPass, "_one", watched)
    # WHEN they are written into a bundle
    write_postmortem(hosts, tmp_path / "b", plot=False)
    # THEN neither the pass nor the writer kept one (a ring's table is as large as its ring), but for the
    # ring just before, whose rows may still be being written
    assert len(alive) == RANKS
    assert all(set(seen) <= {n - 1} for n, seen in enumerate(alive)), alive


def test_the_next_ring_is_decoded_while_the_rows_of_the_last_are_written(
    hosts: list[Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN one worker, a budget of two and a half rings, and a consumer that holds each table until the
    # next ring's decoding has begun (at most 10 s)
    monkeypatch.setattr(pipeline, "_workers", lambda: 1)
    small = _there(next(hosts[0].glob("*.ring")))
    monkeypatch.setattr(pipeline, "IN_FLIGHT_BYTES", int(2.5 * small))
    began: dict[Path, threading.Event] = {}
    one = RecoveryPass._one

    def watched(self: RecoveryPass, path: Path) -> Any:
        began.setdefault(path, threading.Event()).set()
        return one(self, path)

    monkeypatch.setattr(RecoveryPass, "_one", watched)
    recovery = RecoveryPass([hosts[0]])
    # WHEN each table is taken
    waited = []
    for n, table in enumerate(recovery.tables()):
        if n + 1 < len(recovery.paths):
            waited.append(began.setdefault(recovery.paths[n + 1], threading.Event()).wait(10))
        del table
    # THEN the next ring was being decoded while each table was held (6ff0f51 decoded it only once the
    # consumer came back for it: decoding and writing took turns)
    assert len(waited) == len(recovery.paths) - 1 > 1 and all(waited)


def test_a_ring_over_the_budget_is_not_decoded_while_another_rings_rows_are_written(
    hosts: list[Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN small rings, then one larger than the whole budget, then small ones again; four workers, a budget
    # of two and a half small rings, and a consumer that holds each table 0.2 s (time for any ring handed out
    # to begin), noting what began meanwhile
    big_ring = _big_ring(tmp_path / "big")
    monkeypatch.setattr(pipeline, "_workers", lambda: 4)
    small = _there(next(hosts[0].glob("*.ring")))
    assert _there(big_ring) > 3 * small
    monkeypatch.setattr(pipeline, "IN_FLIGHT_BYTES", int(2.5 * small))
    events: list[tuple[str, Path]] = []
    one = RecoveryPass._one

    def watched(self: RecoveryPass, path: Path) -> Any:
        events.append(("began", path))
        return one(self, path)

    monkeypatch.setattr(RecoveryPass, "_one", watched)
    recovery = RecoveryPass([hosts[0], tmp_path / "big", hosts[1]])
    # WHEN the tables are taken (in the rings' order: every ring is readable)
    for n, table in enumerate(recovery.tables()):
        events.append(("held", recovery.paths[n]))
        time.sleep(0.2)
        events.append(("released", recovery.paths[n]))
        del table
    # THEN the large ring began while no other ring's table was held, and no ring began while its was
    held: Path | None = None
    for what, path in events:
        if what == "held":
            held = path
        elif what == "released":
            held = None
        elif path == big_ring:
            assert held is None, f"the ring over the budget began while the rows of {held} were held"
        else:
            assert held != big_ring, f"{path} began while the rows of the ring over the budget were held"
    assert ("began", big_ring) in events and len([e for e in events if e[0] == "held"]) == RANKS + 1


def test_the_writer_keeps_a_copy_of_the_rest_of_a_large_ring_not_the_ring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # GIVEN timelines of 3.5 row groups each, whose seq column is a numpy array Arrow wraps without a copy
    monkeypatch.setattr(bundle, "ROW_GROUP", 1000)
    rows = 3500
    earlier: list[weakref.ref[Any]] = []
    alive: list[int] = []

    def timelines() -> Iterator[pa.Table]:
        for n in range(3):
            gc.collect()
            alive.append(sum(ref() is not None for ref in earlier))
            yield timeline(np.arange(n * rows, (n + 1) * rows, dtype=np.uint64))

    def timeline(seq: np.ndarray) -> pa.Table:
        earlier.append(weakref.ref(seq))
        column = pa.Array.from_buffers(pa.uint64(), rows, [None, pa.py_buffer(seq)])
        return pa.Table.from_arrays([column if f.name == "seq" else pa.nulls(rows, f.type) for f in TIMELINE_SCHEMA],
                                    schema=TIMELINE_SCHEMA)  # fmt: skip

    # WHEN they are written
    with open(tmp_path / "t.parquet", "wb") as sink, pq.ParquetWriter(sink, TIMELINE_SCHEMA) as writer:
        bundle._write_row_groups(writer, timelines())
    # THEN by the time the next timeline comes no earlier one's memory is held (the 500 rows left over
    # are a copy), every row is written, in row groups of 1,000
    assert alive == [0, 0, 0]
    file = pq.ParquetFile(tmp_path / "t.parquet")
    assert file.read(columns=["seq"])["seq"].to_pylist() == list(range(3 * rows))
    assert [file.metadata.row_group(g).num_rows for g in range(file.metadata.num_row_groups)] == [1000] * 10 + [500]


def test_filters_of_every_shape_pyarrow_takes_read_the_same_rows(shared_groups: tuple[Path, Any]) -> None:
    out, meta = shared_groups
    table = pq.read_table(out / "timeline.parquet", columns=["pid", "seq"])
    a, b = sorted({m["pid"] for m in meta["rings"]})[:2]

    def read(filters: Any) -> list[tuple[int, int]]:
        with open(out / "timeline.parquet", "rb") as source:
            rows = bundle.read_thinned(source, filters, ["pid", "seq"], max_rows=1 << 30)
        return sorted(zip(rows["pid"].to_pylist(), rows["seq"].to_pylist(), strict=True))

    def plain(pids: set[int]) -> list[tuple[int, int]]:
        return sorted((p, s) for p, s in zip(table["pid"].to_pylist(), table["seq"].to_pylist(), strict=True)
                      if p in pids)  # fmt: skip

    assert read([("pid", "in", (p for p in [a]))]) == plain({a})  # a generator, read once
    assert read([[("pid", "=", a)], [("pid", "=", b)]]) == plain({a, b})  # either of two (DNF)
    assert read([("pid", "in", [])]) == []


TIME_FILTER_WITHOUT_PANDAS = """
import sys, pyarrow.parquet as pq
from blackbox.cli._common import skip_pandas
from blackbox.recovery.bundle import read_thinned
skip_pandas()
path = sys.argv[1]
first = pq.read_table(path, columns=["time"])["time"][0]
with open(path, "rb") as source:
    rows = read_thinned(source, [("time", "=", first)], ["time"], 1 << 30)
print(rows.num_rows, "pandas" in sys.modules)
"""


def test_a_time_filter_reads_where_pandas_is_not_imported(shared_groups: tuple[Path, Any]) -> None:
    out, _ = shared_groups
    # a nanosecond statistic becomes a Python value only through pandas: the row groups are then kept
    env = dict(os.environ, PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-c", TIME_FILTER_WITHOUT_PANDAS, str(out / "timeline.parquet")],
                          capture_output=True, text=True, timeout=120, env=env)  # fmt: skip
    assert done.returncode == 0, done.stderr
    count, pandas = done.stdout.split()
    assert int(count) >= 1 and pandas == "False"


def test_a_trace_export_reads_each_rings_metadata_once(hosts: list[Path]) -> None:
    from blackbox.views.perfetto import trace_events

    class Counted(SpilledRings):
        reads = 0

        def __getitem__(self, index: Any) -> Any:
            Counted.reads += 1
            return super().__getitem__(index)

    recovered = recover_rings(hosts)
    meta = {**recovered.meta, "rings": Counted(recovered.meta["rings"])}
    Counted.reads = 0
    trace = trace_events(recovered.table, meta)
    assert Counted.reads == RANKS
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    assert len(names) == RANKS and any(n.startswith("rank 7 pid") for n in names)


def test_rows_of_a_kind_are_found_in_a_table_with_null_or_unknown_kind_codes() -> None:
    # GIVEN a timeline read from a file (a bundle's timeline.parquet is the user's): kinds with a null and a
    # code past the dictionary, in two chunks
    from blackbox.recovery.kinds import kind_mask, of_kind, rows_of_kind

    words = pa.array(["mark", "sample", "step"])
    bad = pa.DictionaryArray.from_arrays(pa.array([0, 1, None, 2, 7, 0], pa.int32()), words, safe=False)
    good = pa.DictionaryArray.from_arrays(pa.array([2, 1], pa.int32()), pa.array(["exit", "step", "mark"]))
    table = pa.table({"kind": pa.chunked_array([bad, good]), "n": pa.array(range(8))})
    # WHEN the rows of some kinds are asked for THEN those rows, and no others, and no error; the chunks' own
    # dictionaries read each by its words
    assert kind_mask(table, "mark", "step").to_pylist() == [True, False, False, True, False, True, True, True]
    assert not any(kind_mask(table, "gpu_sample").to_pylist())
    assert rows_of_kind(table, "mark", "step").tolist() == [0, 3, 5, 6, 7]  # ascending, across the chunks
    assert rows_of_kind(table, "step").tolist() == [3, 7] and rows_of_kind(table, "sample").tolist() == [1]
    assert rows_of_kind(table, "gpu_sample").tolist() == [] and rows_of_kind(table, "exit").tolist() == []
    assert of_kind(table, "mark", "step")["n"].to_pylist() == [0, 3, 5, 6, 7]
    assert of_kind(table, "sample", columns=["n"]).column_names == ["n"]
    # AND a table whose kind column has no chunk at all (a filter that kept nothing can make one) has none
    none = pa.table({"kind": pa.chunked_array([], pa.dictionary(pa.int32(), pa.string()))})
    assert rows_of_kind(none, "mark").tolist() == [] and of_kind(none, "mark").num_rows == 0
    # AND the rows handed out cannot be changed by one caller under another
    with pytest.raises(ValueError, match="read-only"):
        rows_of_kind(table, "step")[0] = 5
