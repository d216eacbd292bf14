"""recover(): the bundle's Parquet timeline, metadata.json and summary.md; merging rings."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, readme_fleet_query, run_py

import blackbox
from blackbox.recovery.timeline import TIMELINE_SCHEMA
from blackbox.ring import format as fmt

JOB = """
import blackbox, sys, time, os, signal
blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.01)
for i in range(5):
    blackbox.step()
    with blackbox.phase("forward"):
        blackbox.mark("loss", 100 - i)
time.sleep(0.1)
if sys.argv[2] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture(scope="module")
def killed_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("killed")
    run_py(JOB, str(d / "job.ring"), "kill", check=False, env={"RANK": "2", "WORLD_SIZE": "4"})
    return blackbox.recover(d / "job.ring", d / "bundle")


def test_bundle_holds_its_files_and_the_picture(killed_bundle: Path) -> None:
    names = sorted(p.name for p in killed_bundle.iterdir())
    picture = ["memory.png"] if importlib.util.find_spec("matplotlib") else []
    assert names == sorted(["metadata.json", "summary.md", "timeline.parquet", "ranks.parquet", "rings",
                            "allocations.parquet", *picture])  # fmt: skip
    assert [p.name for p in (killed_bundle / "rings").iterdir()] == ["job.ring.zst"]


def test_timeline_schema_and_types(killed_bundle: Path) -> None:
    table = pq.read_table(killed_bundle / "timeline.parquet")
    assert table.schema.equals(TIMELINE_SCHEMA, check_metadata=False)
    assert table.schema.field("time").type == pa.timestamp("ns", tz="UTC")
    assert pa.types.is_dictionary(table.schema.field("kind").type)


def test_timeline_reads_in_pandas_with_expected_rows(killed_bundle: Path) -> None:
    df = pd.read_parquet(killed_bundle / "timeline.parquet")
    assert list(df["seq"]) == list(range(1, len(df) + 1))
    assert df["time"].is_monotonic_increasing
    kinds = df["kind"].astype(str)
    assert kinds.iloc[0] == "arm" and "disarm" not in set(kinds)
    marks = df[kinds == "mark"]
    assert list(marks["label"].astype(str)) == ["loss"] * 5 and list(marks["value"]) == [100, 99, 98, 97, 96]
    assert list(marks["step"]) == [0, 1, 2, 3, 4]
    assert set(df["rank"]) == {2} and df["pid"].nunique() == 1
    samples = df[kinds == "sample"]
    assert len(samples) >= 5 and (samples["host_rss"] > 1 << 20).all()
    assert df.loc[kinds != "sample", "host_rss"].isna().all()
    assert df["label"].isna().sum() == (kinds.isin(["sample", "cgroup_sample", "arm", "step"])).sum()


def test_timeline_queries_in_duckdb(killed_bundle: Path) -> None:
    path = killed_bundle / "timeline.parquet"
    rows = duckdb.sql(f"SELECT kind, count(*) FROM '{path}' GROUP BY kind ORDER BY kind").fetchall()
    counts = dict(rows)
    assert counts["mark"] == 5 and counts["phase_begin"] == 5 and counts["phase_end"] == 5 and counts["step"] == 5
    ((peak,),) = duckdb.sql(f"SELECT max(host_rss) FROM '{path}'").fetchall()
    assert peak > 1 << 20


def test_metadata_says_who_and_how_it_ended(killed_bundle: Path) -> None:
    m = json.loads((killed_bundle / "metadata.json").read_text())
    for key in ("format_version", "pid", "host", "rank", "world_size", "argv", "versions", "started_at", "clean"):
        assert key in m, key
    assert m["format_version"] == fmt.FORMAT_VERSION and m["rank"] == 2 and m["world_size"] == 4
    assert m["clean"] is False and m["writer_state"] == "ended without a clean end"
    assert m["versions"]["python"] and m["versions"]["numpy"] and m["versions"]["torch"] is None
    r = m["recovery"]
    assert r["slots"] == 4096 and r["valid"] == m["events"] and r["torn"] == 0 and r["first_seq"] == 1
    assert r["overwritten"] == 0 and r["last_seq"] == r["valid"]
    assert m["last_step"] == 4 and m["last_sample"]["host_rss"] > 0


def test_summary_tells_the_story(killed_bundle: Path) -> None:
    text = (killed_bundle / "summary.md").read_text()
    assert "No clean end was recorded" in text and "last step 4" in text and "host_rss" in text


def test_clean_exit_bundle_is_marked_clean(tmp_path: Path) -> None:
    run_py(JOB, str(tmp_path / "ok.ring"), "exit")
    m = json.loads((blackbox.recover(tmp_path / "ok.ring", tmp_path / "b") / "metadata.json").read_text())
    assert m["clean"] is True and m["writer_state"] == "clean"
    assert "Ended cleanly" in (tmp_path / "b" / "summary.md").read_text()


def test_a_process_that_raised_and_ran_its_exit_handlers_is_not_said_to_have_ended_cleanly(tmp_path: Path) -> None:
    # GIVEN an armed process that dies of an uncaught exception: its exit handlers run, disarming the ring
    code = f"import blackbox; blackbox.arm({str(tmp_path / 'r.ring')!r}); blackbox.step(3); raise ValueError('x')"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 1 and "ValueError" in proc.stderr
    m = json.loads((blackbox.recover(tmp_path / "r.ring", tmp_path / "b") / "metadata.json").read_text())
    # THEN the ring is clean, but the summary's ending line does not contradict its cause of death
    assert m["writer_state"] == "clean" and m["death"]["cause"] == "exception", m["death"]
    text = (tmp_path / "b" / "summary.md").read_text()
    assert "Ended cleanly" not in text and "- Ending: The process ran its exit handlers" in text, text[:600]


def test_folder_of_rings_merges_into_one_timeline(tmp_path: Path) -> None:
    rings = tmp_path / "rings"
    rings.mkdir()
    for rank in (0, 1):
        run_py(JOB, str(rings / f"r{rank}.ring"), "exit", env={"RANK": str(rank)})
    out = blackbox.recover(rings, tmp_path / "merged")
    df = pd.read_parquet(out / "timeline.parquet")
    assert set(df["rank"]) == {0, 1} and df["pid"].nunique() == 2
    assert df["time"].is_monotonic_increasing
    m = json.loads((out / "metadata.json").read_text())
    assert len(m["rings"]) == 2 and m["events"] == len(df) and m["clean"] is True


def test_recover_of_a_live_ring_reports_running(tmp_path: Path) -> None:
    rec = blackbox.Recorder.arm(tmp_path / "live.ring", capacity=256, sample_interval=3600)
    rec.mark("alive")
    try:
        m = json.loads((blackbox.recover(tmp_path / "live.ring", tmp_path / "b") / "metadata.json").read_text())
        assert m["writer_state"] == "running" and m["clean"] is False
    finally:
        rec.disarm()


def test_readme_fleet_queries_run_over_many_bundles(killed_bundle: Path, tmp_path: Path) -> None:
    """README's fleet query runs as written over a fleet's bundles (the bucket made a local folder)."""
    fleet = tmp_path / "fleet"
    for i in range(2):
        shutil.copytree(killed_bundle, fleet / f"job{i}" / "node")
    code = readme_fleet_query().replace("s3://ml-postmortems/", f"file://{fleet}/")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md", "exec"), {})
    lines = [ln for ln in printed.getvalue().splitlines() if " killed " in ln]
    assert len(lines) == 2, printed.getvalue()  # the rank of each of the two bundles, by death time


def test_a_cgroups_oom_kill_counter_is_read_once_for_all_its_rings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blackbox.recovery import evidence
    from blackbox.recovery.pipeline import recover_rings
    from blackbox.ring.reader import read_header

    # GIVEN three rings armed by this process: one memory cgroup, on the cgroup filesystem
    for i in range(3):
        ring = blackbox.Recorder.arm(tmp_path / f"r{i}.ring", capacity=64, sample_interval=3600)
        ring.mark("loss", i)
        ring.disarm()
    cgroup = read_header(tmp_path / "r0.ring").meta.get("cgroup")
    if not cgroup or not evidence.on_cgroupfs(cgroup["path"]):
        pytest.skip("this process's memory cgroup is not named or not on a cgroup filesystem here")
    reads: list[Path] = []
    counter = evidence.cgroup_oom_kills
    monkeypatch.setattr(evidence, "cgroup_oom_kills", lambda d, v: reads.append(d) or counter(d, v))
    # WHEN they are recovered in one pass
    recovered = recover_rings([tmp_path])
    # THEN every ring is recovered, and the cgroup's counter (and the mount table) was read once, not per ring
    assert len(recovered.meta["rings"]) == 3
    assert reads == [Path(cgroup["path"])]


def test_kind_lookups_belong_to_their_table_and_go_with_it() -> None:
    import gc

    from blackbox.recovery import kinds as kind_rows

    # GIVEN tables made and freed one after another (a freed table's address is often reused by the next)
    for kinds in (["mark", "sample", "mark"], ["sample", "exit", "sample", "mark"]) * 50:
        table = pa.table({"kind": pa.array(kinds).dictionary_encode()})
        # WHEN rows of a kind are asked for, twice (the second from what the first worked out)
        first, again = kind_rows.rows_of_kind(table, "mark"), kind_rows.rows_of_kind(table, "mark", "exit")
        # THEN each answer is this table's, never an earlier table's
        assert first.tolist() == [i for i, k in enumerate(kinds) if k == "mark"]
        assert again.tolist() == [i for i, k in enumerate(kinds) if k in ("mark", "exit")]
        assert kind_rows.of_kind(table, "nothing").num_rows == 0
        del table
    # AND nothing is kept once the tables are gone
    gc.collect()
    assert not kind_rows._KIND_CODES


def test_a_process_ended_by_sigterm_is_not_offered_sigkill_or_the_oom_killer_as_its_ending(tmp_path: Path) -> None:
    # GIVEN an armed process ended by SIGTERM's default action (no handler: no exit handlers run)
    code = f"import blackbox, os, signal; blackbox.arm({str(tmp_path / 'r.ring')!r}); blackbox.step(2); " \
           "os.kill(os.getpid(), signal.SIGTERM)"  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == -15, proc.stderr
    m = json.loads((blackbox.recover(tmp_path / "r.ring", tmp_path / "b") / "metadata.json").read_text())
    # THEN the cause is the signal, and the ending line leaves the how to it rather than listing other deaths
    assert m["death"]["cause"] == "signal" and "SIGTERM" in m["death"]["headline"], m["death"]
    text = (tmp_path / "b" / "summary.md").read_text()
    assert "No clean end was recorded" in text and "OOM killer" not in text.split("## Cause of death")[0], text[:600]


@pytest.mark.parametrize("code,said", [("'fatal: config missing key lr'", "fatal: config missing key lr"), ("3", None)])
def test_a_failing_sys_exit_is_told_with_what_it_said(tmp_path: Path, code: str, said: str | None) -> None:
    # GIVEN an armed process that ends with sys.exit("message") (Python prints it and exits 1), or sys.exit(3)
    job = f"import blackbox, sys; blackbox.arm({str(tmp_path / 'r.ring')!r}); blackbox.step(3); sys.exit({code})"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True, timeout=120, env=env)
    status = 1 if said else 3
    assert proc.returncode == status and (said is None or proc.stderr == said + "\n"), proc.stderr
    death = json.loads((blackbox.recover(tmp_path / "r.ring", tmp_path / "b") / "metadata.json").read_text())["death"]
    # THEN the verdict quotes the message (it appeared nowhere in the bundle), and an int status says nothing more
    assert (death["cause"], death["exit_status"], death["step"]) == ("nonzero_exit", status, 3), death
    expected = f'The job exited with status 1, saying "{said}".' if said else "The job exited with status 3."
    assert death["headline"] == expected, death["headline"]
