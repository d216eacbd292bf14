"""The CLI through main(argv): recover, info, demo, and the console entry point."""

from __future__ import annotations

import importlib.util
import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import REPO, tick_kinds

import blackbox
from blackbox.cli import demo, info, main, recover


@pytest.fixture
def ring(tmp_path: Path) -> Iterator[Path]:
    # allocation sampling off: the counts below are of this ring's own events alone
    rec = blackbox.Recorder.arm(tmp_path / "c.ring", capacity=64, sample_interval=3600, allocations=False)
    for i in range(100):
        rec.mark("m", i)
    assert rec.path is not None
    yield rec.path  # armed during the test: the writer is this (live) process
    rec.disarm()


def test_info_reports_counts_and_live_writer(ring: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert info.main([str(ring), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["capacity"] == 64 and facts["valid"] == 64 and facts["empty"] == 0 and facts["torn"] == 0
    newest = 101 + len(tick_kinds())  # arm, the first tick, 100 marks
    assert facts["newest_seq"] == newest and facts["overwritten"] == newest - 64
    assert facts["writer"] == "running"
    assert main(["info", str(ring)]) == 0
    text = capsys.readouterr().out
    assert "64 valid, 0 empty, 0 torn" in text and f"newest {newest}" in text and "writer:     running" in text


def test_recover_cli_writes_bundle_and_prints_summary(
    ring: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    assert recover.main([str(ring), "-o", str(out), "--summary"]) == 0
    printed = capsys.readouterr()
    assert printed.out.startswith(f"wrote {out}/ (64 events") and "## Recovery" in printed.out
    assert (out / "timeline.parquet").exists() and "replaced" not in printed.err
    # AND recovered again to the same OUT, it says in one line that it replaced the earlier bundle
    assert recover.main([str(ring), "-o", str(out)]) == 0
    assert capsys.readouterr().err == f"blackbox: replaced the earlier bundle at {out}/\n"


def test_recover_without_out_is_a_usage_error(ring: Path) -> None:
    with pytest.raises(SystemExit) as e:
        main(["recover", str(ring)])
    assert e.value.code == 2


def test_console_script_and_module_entry_point(ring: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "blackbox", "info", str(ring)], capture_output=True, text=True, cwd=REPO
    )
    assert proc.returncode == 0 and "valid" in proc.stdout


def test_demo_arms_kills_recovers_and_summarises(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--dir", str(tmp_path / "demo"), "--kill-after", "5"]) == 0
    out = capsys.readouterr().out
    assert "sent SIGKILL" in out and "No clean end was recorded" in out
    meta = json.loads((tmp_path / "demo" / "bundle" / "metadata.json").read_text())
    assert meta["clean"] is False and meta["last_step"] >= 5
    # AND its last hint runs as printed (by a shell: shlex splits it as bash does)
    (hint,) = [line for line in out.splitlines() if line.startswith("[demo] query it with DuckDB: ")]
    counted = subprocess.run(shlex.split(hint.split(": ", 1)[1]), capture_output=True, text=True, timeout=120)
    assert counted.returncode == 0 and "stack_sample" in counted.stdout, counted.stderr


def test_the_demos_hint_without_duckdb_counts_with_pyarrow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN a timeline whose path has a space and a quote, and no DuckDB
    timeline = tmp_path / "it's a bundle" / "timeline.parquet"
    timeline.parent.mkdir()
    pq.write_table(pa.table({"kind": ["sample", "step", "sample"]}), timeline)
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "duckdb" else real(name, *a))
    # WHEN the hint is run as printed
    hint = demo.query_hint(timeline)
    counted = subprocess.run(shlex.split(hint.split(": ", 1)[1]), capture_output=True, text=True, timeout=120)
    # THEN it counts the rows by kind
    assert hint.startswith("count its rows by kind (pip install duckdb for SQL): ")
    assert counted.returncode == 0 and "sample" in counted.stdout and "2" in counted.stdout, counted.stderr


def test_demo_names_its_planted_leak_with_the_bytes_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN the demo's job, which keeps one hidden activation a step at a line marked "# the leak"
    assert main(["demo", "--dir", str(tmp_path / "demo"), "--kill-after", "20"]) == 0
    out = capsys.readouterr().out
    source = (REPO / "blackbox" / "cli" / "_demo_job.py").read_text().splitlines()
    lines = [i for i, text in enumerate(source, 1) if text.rstrip().endswith("# the leak")]
    meta = json.loads((tmp_path / "demo" / "bundle" / "metadata.json").read_text())
    # THEN the site blackbox sampled there holds the bytes kept (one activation a step, torch's float32
    # or numpy's float64), within twice its 95% error (about 4 sigma) and one step (the kill lands mid-step)
    (site,) = [s for s in meta["allocations"]["sites"] if any(s["site"].endswith(f"_demo_job.py:{n})") for n in lines)]
    kept = 256 * 1024 * (4 if "train_torch" in site["site"] else 8)
    truth = kept * (meta["last_step"] + 1)
    assert abs(site["live_bytes"] - truth) <= 2 * site["error_bytes"] + kept, (site, truth)
    # AND the demo says so, naming the line and the grower's rank
    assert f"on purpose at _demo_job.py:{site['site'].rsplit(':', 1)[1][:-1]}" in out and "the #1 grower" in out


def test_summary_of_a_ring_writes_nothing_and_of_a_bundle_prints_its_file(
    ring: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in ring.parent.iterdir())
    assert main(["summary", str(ring)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("# blackbox: ") and "## Cause of death" in text
    assert sorted(p.name for p in ring.parent.iterdir()) == before
    assert main(["recover", str(ring), "-o", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    assert main(["summary", str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out == (tmp_path / "b" / "summary.md").read_text()
    assert main(["summary", str(tmp_path / "nothing-here")]) == 1


def test_recover_to_a_filesystem_uri_and_a_bad_one(
    ring: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    uri = (tmp_path / "remote" / "bundle").as_uri()  # file:// is a local folder, written whole like one
    assert main(["recover", str(ring), "-o", uri, "--summary"]) == 0
    assert "# blackbox: " in capsys.readouterr().out
    names = {p.name for p in (tmp_path / "remote" / "bundle").iterdir()}
    plotted = importlib.util.find_spec("matplotlib") is not None
    files = {"timeline.parquet", "ranks.parquet", "metadata.json", "summary.md", "rings", "allocations.parquet"}
    assert names == files | ({"memory.png"} if plotted else set())
    assert main(["recover", str(ring), "-o", "nosuchscheme://bucket/x"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a local folder or a pyarrow filesystem URI" in err


PANDAS_AFTER_THE_COMMAND = """
import sys
import pyarrow as pa
from blackbox.cli import main
library = pa.default_memory_pool().backend_name
sys.argv = ["blackbox", "recover", sys.argv[1], "-o", sys.argv[2]]
status = main()
print(status, "pandas" in sys.modules, library, pa.default_memory_pool().backend_name)
import pandas as pd
print(pa.table({"a": [1, 2]}).to_pandas().shape, pa.array(pd.Series([1, None], dtype="Int64")).null_count)
"""


def test_the_commands_own_process_skips_pandas_and_frees_memory_to_the_system(ring: Path, tmp_path: Path) -> None:
    pytest.importorskip("pandas", reason="pyarrow imports pandas only where it is installed")
    # GIVEN pandas installed, where pyarrow imports it on its first array (35 MiB that recovery never uses)
    # WHEN the command recovers a ring in its own process
    done = subprocess.run([sys.executable, "-c", PANDAS_AFTER_THE_COMMAND, str(ring), str(tmp_path / "b")],
                          capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
    # THEN it never imported pandas, Arrow allocated from the system allocator (which hands freed rings
    # back) where a library import left pyarrow's own, and pandas conversions still work after it
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    status, pandas, library, command = lines[-2].split()
    assert (status, pandas, command) == ("0", "False", "system") and library != "system"
    assert lines[-1] == "(2, 1) 1"


def test_the_verdict_line_of_a_job_whose_processes_all_ended_cleanly_has_a_headline() -> None:
    from blackbox.cli.run import _main_ring

    clean = {"cause": "clean_exit", "headline": "The job exited cleanly."}
    helper = {"role": "worker", "death": {"cause": "clean_exit", "headline": "The Pool worker (pid 9) exited cleanly."}}
    # a main process and its helpers: the main's sentence (the line read "cause: clean_exit;  bundle in")
    assert _main_ring({"cause": "clean_exit", "rings": [{"role": "main", "death": clean}, helper]}) == clean
    # ranks, or a restarted attempt's processes: the job's clean end; where one died, the first death says it
    ranks = [{"role": "main", "death": clean}, {"role": "main", "death": clean}]
    every = {"headline": "Every process of the job ended cleanly."}
    assert _main_ring({"cause": "clean_exit", "rings": ranks}) == every
    assert _main_ring({"cause": "exception", "rings": ranks}) == {}
    # a restarted job whose last attempt ended cleanly: the attempt that failed is said (it read "Every process
    # of the job ended cleanly")
    died = {"rank": 1, "step": 6, "headline": "The job died of an uncaught KeyError."}
    attempts = [{"attempt": 1, "cause": "exception", "first_death": died}, {"attempt": 2, "cause": "clean_exit"}]
    assert _main_ring({"cause": "clean_exit", "rings": ranks, "attempts": attempts})["headline"] == (
        "Every process of the last attempt (2 of 2) ended cleanly; attempt 1 ended in exception (rank 1, step 6): "
        "The job died of an uncaught KeyError.")  # fmt: skip
