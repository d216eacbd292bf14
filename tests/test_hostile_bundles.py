"""Node bundles planted to hurt the job-wide view (issue 23: findings 5, 6, 7, 11), which runs as root over
folders users wrote: every bundle is read within bounds, and a bundle that claims another's rings drops
nothing silently. Peak RSS against these bundles is measured by tools/fuzz_recover.py --mode bundles."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO
from test_job import blackbox_cli, copy_bundles, edit_rings, fleet

from blackbox._postmortem import job_account, write_postmortem
from blackbox.recovery.job import MAX_JSON_VALUES, MAX_RANKS_DECODED

MiB = 1 << 20


@pytest.fixture(scope="module")
def node_bundles(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """As in test_job: two hosts of four ranks each, rank 5 (on node001) killed first, a bundle per host."""
    rings, out = tmp_path_factory.mktemp("rings"), tmp_path_factory.mktemp("bundles")
    fleet(rings, 8, 2, victim=5)
    for host in sorted(p.name for p in rings.iterdir()):
        write_postmortem([rings / host], out / host, plot=False)
    return out


def many_rings(bundle: Path, count: int) -> dict[str, object]:
    """The bundle's metadata with ``count`` rings (copies of its first under new pids), written back."""
    meta = json.loads((bundle / "metadata.json").read_text())
    meta["rings"] = [dict(meta["rings"][0], pid=100_000 + i) for i in range(count)]
    (bundle / "metadata.json").write_text(json.dumps(meta))
    return meta


def ranks_with(bundle: Path, name: str, text: str, rows: int, stored: bool = False) -> None:
    """A ranks.parquet of ``rows`` rows whose column ``name`` holds ``text`` on every row as a one-value
    dictionary (a few bytes on disk once compressed), its other ranks columns those of the bundle's rows;
    without the Arrow schema stored, a reader decodes it to plain strings."""
    table = pq.read_table(bundle / "ranks.parquet").slice(0, 1).take(pa.array([0] * rows))
    column = pa.DictionaryArray.from_arrays(pa.array([0] * rows, pa.int32()), pa.array([text]))
    table = table.set_column(table.schema.get_field_index(name), name, column) if name in table.column_names else (
        table.append_column(name, column))  # fmt: skip
    pq.write_table(table, bundle / "ranks.parquet", compression="zstd", compression_level=19, store_schema=stored)


def test_an_extra_ranks_column_of_gigabytes_is_never_decoded(node_bundles: Path, tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    # GIVEN a ranks.parquet of a few KiB with a column that is not the ranks schema's: a 2 MiB string on each
    # of 1,250 rows (2.5 GB decoded), beside a metadata.json of 1,250 rings
    job = copy_bundles(node_bundles, tmp_path / "job")
    many_rings(job / "node000", 1250)
    ranks_with(job / "node000", "x", "y" * (2 * MiB), 1250)
    assert (job / "node000" / "ranks.parquet").stat().st_size < 64 << 10
    # WHEN the job-wide bundle is made in a memory cgroup of 1 GiB
    cg = memory_cgroup(1 << 30)
    proc = subprocess.run([sys.executable, "-m", "blackbox", "recover", str(job), "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=600, preexec_fn=cg.join,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})  # fmt: skip
    # THEN it ends, never killed, and reads every ring, its rows from ranks.parquet's own columns
    assert proc.returncode == 0 and cg.oom_kills() == 0, (proc.returncode, proc.stderr[-500:])
    meta = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert meta["ring_count"] == 1254 and meta["unread_bundles"] == []
    assert pq.read_table(tmp_path / "out" / "ranks.parquet").column_names == pq.read_schema(
        job / "node001" / "ranks.parquet").names  # fmt: skip


def test_ranks_text_that_would_decode_past_the_bound_is_taken_from_the_metadata(
    node_bundles: Path, tmp_path: Path
) -> None:
    # GIVEN a ranks.parquet whose host column is one 2 MiB name repeated on 40 rows (80 MiB decoded)
    job = copy_bundles(node_bundles, tmp_path / "job")
    many_rings(job / "node000", 40)
    ranks_with(job / "node000", "host", "h" * (2 * MiB), 40)
    assert 40 * 2 * MiB > MAX_RANKS_DECODED
    # THEN the table is not decoded: its rows come from the checked metadata
    job_pass, meta, _ = job_account([str(job)])
    assert meta["ring_count"] == 44
    assert set(job_pass.ranks()["host"].to_pylist()) == {"node000", "node001"}


def test_recovered_by_is_checked_like_any_field(node_bundles: Path, tmp_path: Path) -> None:
    # GIVEN eight bundles each saying it was recovered by a 1 MB version (it was copied whole: 8 bundles of
    # 100 MB made an 839 MB job metadata.json)
    job = copy_bundles(node_bundles, tmp_path / "job")
    for i in range(2, 8):
        shutil.copytree(job / "node000", job / f"node00{i}")
        edit_rings(job / f"node00{i}", lambda r, i=i: r.update(pid=r["pid"] + 1000 * i))
    for b in sorted(job.iterdir()):
        meta = json.loads((b / "metadata.json").read_text())
        meta["recovered_by"] = {"blackbox": "v" * 1_000_000, "other": ["x"] * 100_000}
        (b / "metadata.json").write_text(json.dumps(meta))
    proc = blackbox_cli("recover", str(job), "-o", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    # THEN the job's metadata keeps a short version per bundle, not what the bundles said
    out = json.loads((tmp_path / "out" / "metadata.json").read_text())
    assert len(out["bundles"]) == 8 and (tmp_path / "out" / "metadata.json").stat().st_size < 64 << 10
    assert all(b["recovered_by"] == {"blackbox": "v" * 63 + "\u2026"} for b in out["bundles"])


def test_a_metadata_json_of_millions_of_values_is_refused_before_it_is_parsed(
    node_bundles: Path, tmp_path: Path
) -> None:
    # GIVEN a metadata.json that is mostly one list of 5 M floats (20 MB; about 400 MB parsed)
    job = copy_bundles(node_bundles, tmp_path / "job")
    text = (job / "node000" / "metadata.json").read_text().rstrip()
    (job / "node000" / "metadata.json").write_text(text[:-1] + ', "x": [' + ",".join(["1.5"] * 5_000_000) + "]}")
    proc = blackbox_cli("summary", str(job))
    # THEN that bundle is named, unread, in one line, and the other one is read
    assert proc.returncode == 0 and "job of 4 rings on 1 host, from 1 bundle" in proc.stdout
    assert f"expected at most {MAX_JSON_VALUES} JSON values, found up to 500" in proc.stderr


def test_a_bundle_claiming_anothers_rings_drops_no_death(node_bundles: Path, tmp_path: Path) -> None:
    # GIVEN a planted bundle that sorts first and claims node001's rings (same host, pid and start), each
    # ended cleanly by its account
    job = copy_bundles(node_bundles, tmp_path / "job")
    shutil.copytree(job / "node001", job / "aaa")
    (job / "aaa" / "ranks.parquet").unlink()
    edit_rings(job / "aaa", lambda r: r.update(death={"cause": "clean_exit", "time": r["last_event_at"]}))
    # WHEN the job's account is made
    proc = blackbox_cli("summary", str(job))
    assert proc.returncode == 0, proc.stderr
    # THEN node001's real deaths are all in it, the first death still rank 5's, and both bundles are named
    assert "**First death: rank 5 (host node001," in proc.stdout and "- 8 ranks `killed`" in proc.stdout
    assert "not read" not in proc.stderr
    both = f"4 rings in `{job}/aaa` and `{job}/node001` (different accounts: both read, one may be planted)"
    assert both in proc.stdout and f"blackbox: held twice: {both}" in proc.stderr
    _, meta, _ = job_account([str(job)])
    assert [c["bundles"] for c in meta["claimed_twice"]] == [[f"{job}/aaa", f"{job}/node001"]] * 4


def test_a_bundle_holding_another_ring_of_the_same_account_reads_it_once(node_bundles: Path, tmp_path: Path) -> None:
    # a bundle with one new ring and one the other bundle holds as well, the same: the shared one is read once
    job = copy_bundles(node_bundles, tmp_path / "job")
    shutil.copytree(job / "node001", job / "node002")
    (job / "node002" / "ranks.parquet").unlink()
    edit_rings(job / "node002", lambda r: r.update(pid=r["pid"] + 100_000), rank=4)
    _, meta, _ = job_account([str(job)])
    assert meta["ring_count"] == 9 and meta["unread_bundles"] == []
    assert sorted(c["same"] for c in meta["claimed_twice"]) == [True, True, True]


def test_a_ring_held_by_three_bundles_counts_once_per_account(node_bundles: Path, tmp_path: Path) -> None:
    # a planted claim and an exact copy of node001, both sorting first: node001's own account equals the
    # copy's, so each real death counts once, beside the claim's clean exits
    job = copy_bundles(node_bundles, tmp_path / "job")
    for name in ("aaa", "aab"):
        shutil.copytree(job / "node001", job / name)
    edit_rings(job / "aaa", lambda r: r.update(death={"cause": "clean_exit", "time": r["last_event_at"]}))
    (job / "aaa" / "ranks.parquet").unlink()
    _, meta, text = job_account([str(job)])
    assert meta["ring_count"] == 12 and "- 8 ranks `killed`" in text and "- 4 ranks `clean_exit`" in text
    assert f"4 rings in `{job}/aaa` and `{job}/aab` (different accounts: both read" in text
    assert [u["reason"] for u in meta["unread_bundles"]] == [
        f"{job}/node001: expected new rings, found those of {job}/aab (a copy)"
    ]
