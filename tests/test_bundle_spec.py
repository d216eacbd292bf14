"""BUNDLE.md and the code that writes bundles say the same thing: files, causes, confidences, death
fields, ring, bundle and job metadata, and the ranks.parquet columns."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from conftest import REPO, run_py

import blackbox
from blackbox._postmortem import job_account, write_postmortem
from blackbox.recovery import bundle, diagnosis, ranks
from blackbox.recovery.pipeline import RecoveryPass, recover_rings

SPEC = (REPO / "blackbox" / "recovery" / "BUNDLE.md").read_text()
# where death's fields are set
WRITERS = ("diagnosis.py", "headline.py", "gpu_oom.py", "levers.py", "pipeline.py", "attempts.py", "family.py",
           "alloc_levers.py")
SOURCES = "".join((REPO / "blackbox" / "recovery" / f).read_text() for f in WRITERS)


def rows(heading: str) -> list[list[str]]:
    """The cells of the first table under ``## heading`` (header and rule left out)."""
    section = SPEC.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")][2:]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def names(heading: str) -> list[str]:
    """The names in a table's first column (a cell may name several: `a`, `b`)."""
    return [n for r in rows(heading) for n in re.findall(r"`([^`]+)`", r[0])]


def test_files_table_names_every_bundle_file() -> None:
    assert set(names("Files")) == set(bundle.BUNDLE_FILES) | {"crash-<pid>.txt", f"{bundle.RAW_RINGS}/<ring>.zst"}


def test_causes_table_matches_the_diagnosis() -> None:
    assert names("Causes") == list(diagnosis.CAUSES)


def test_confidence_table_matches_the_diagnosis() -> None:
    assert names("Confidence") == list(diagnosis.CONFIDENCE)


def test_ranks_table_matches_the_schema() -> None:
    documented = [(r[0].strip("`"), r[1]) for r in rows("ranks.parquet")]
    assert documented == [(f.name, str(f.type)) for f in ranks.SCHEMA]


def test_allocations_table_matches_the_schema() -> None:
    from blackbox.recovery import live_stacks

    documented = [(r[0].strip("`"), r[1]) for r in rows("allocations.parquet")]
    assert documented == [(f.name, str(f.type)) for f in live_stacks.SCHEMA]


def test_every_documented_death_field_is_written_by_the_code() -> None:
    for field in names("death"):
        assert f'"{field}"' in SOURCES, field


@pytest.fixture(scope="module")
def real_deaths(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Metadata of real ends: SIGKILL after a SIGTERM the job ignored, an uncaught MemoryError, a clean exit."""
    out = []
    for i, code in enumerate([
        "import os, signal\nsignal.signal(signal.SIGTERM, lambda *a: None)\nblackbox.step(1)\n"
        "os.kill(os.getpid(), signal.SIGTERM)\nimport time; time.sleep(0.1)\nos.kill(os.getpid(), signal.SIGKILL)\n",
        "blackbox.step(1)\nbuf = bytearray(1 << 60)\n",
        "blackbox.step(1)\n",
    ]):  # fmt: skip
        folder = tmp_path_factory.mktemp(f"death{i}")
        run_py("import sys, blackbox\nblackbox.arm(sys.argv[1] + '/', sample_interval=0.01)\n" + code,
               str(folder), check=False)  # fmt: skip
        out.append(recover_rings([folder]).meta)
    return out


def test_every_death_field_written_is_documented(real_deaths: list[dict[str, Any]]) -> None:
    documented = set(names("death"))
    for meta in real_deaths:
        assert set(meta["death"]) <= documented, set(meta["death"]) - documented


def test_ring_metadata_table_matches_a_recovered_ring(real_deaths: list[dict[str, Any]]) -> None:
    # a bundle of one ring: its ring's metadata, plus what every bundle carries
    expected = set(names("Ring metadata")) | {"cause", "first_death", "attempts", "jobs"}
    assert {"cause", "first_death", "attempts", "jobs"} <= set(names("Bundle metadata"))
    for meta in real_deaths:
        assert set(meta) == expected


def test_bundle_metadata_table_covers_a_bundle_of_several_rings(tmp_path: Path) -> None:
    for name in ("a", "b"):
        blackbox.Recorder.arm(tmp_path / f"{name}.ring", capacity=256, sample_interval=3600).disarm()
    meta = recover_rings([tmp_path / "a.ring", tmp_path / "b.ring"]).meta
    assert set(meta) <= set(names("Bundle metadata")), set(meta) - set(names("Bundle metadata"))
    assert "rings" in meta and "attempts" in meta


def test_job_metadata_table_matches_a_job_bundle(tmp_path: Path) -> None:
    for host in ("n0", "n1"):
        rec = blackbox.Recorder.arm(tmp_path / "rings" / host / "r.ring", capacity=256, sample_interval=3600)
        rec.disarm()
        write_postmortem([tmp_path / "rings" / host], tmp_path / "bundles" / host, plot=False)
    _, meta, _ = job_account([str(tmp_path / "bundles")])
    assert set(meta) == set(names("Job metadata"))


def test_a_written_bundle_says_whether_it_is_whole_as_the_commit_rule_says(tmp_path: Path) -> None:
    # GIVEN a ring recovered into a bundle, OUT looked at while the whole bundle is being made
    rec = blackbox.Recorder.arm(tmp_path / "r.ring", capacity=256, sample_interval=3600)
    rec.mark("m", 1)
    rec.disarm()
    out = tmp_path / "bundle"
    seen: list[tuple[list[str], Any]] = []

    def views(meta: dict[str, Any], read: bundle.Reader | None) -> dict[str, bytes]:
        if read is not None:  # the verdict is in place by now
            seen.append((sorted(p.name for p in out.iterdir()), json.loads((out / "metadata.json").read_text())))
        return {"summary.md": b"# s\n"}

    meta = bundle.stream_bundle(RecoveryPass([tmp_path / "r.ring"]), out, views)
    # THEN first the verdict alone, complete false, then the whole bundle, complete true: the field documented
    ((files, verdict),) = seen
    assert files == ["allocations.parquet", "metadata.json", "ranks.parquet", "summary.md"]
    assert verdict["complete"] is False
    written = json.loads((out / "metadata.json").read_text())
    assert written["complete"] is True and meta["complete"] is True
    assert set(written) == set(recover_rings([tmp_path / "r.ring"]).meta) | {"complete"}
    assert "complete" in names("Bundle metadata")
    assert "`complete`" in SPEC.split("## Commit rule", 1)[1].split("\n## ", 1)[0]


def test_ranks_and_timeline_give_a_column_they_share_one_type_and_carry_the_job(tmp_path: Path) -> None:
    # GIVEN rank 3 of a Slurm job, SIGKILLed
    code = ("import os, sys, blackbox; blackbox.arm(sys.argv[1], capacity=256, sample_interval=3600); "
            "blackbox.step(1); os.kill(os.getpid(), 9)")  # fmt: skip
    env = {"SLURM_JOB_ID": "4242", "RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1"}
    run_py(code, str(tmp_path / "r.ring"), env=env, check=False)
    # WHEN it is recovered
    write_postmortem([tmp_path / "r.ring"], tmp_path / "b", plot=False)
    timeline, by_rank = (
        pq.read_table(tmp_path / "b" / "timeline.parquet"),
        pq.read_table(tmp_path / "b" / "ranks.parquet"),
    )
    # THEN every column the two tables share has one type (dictionaries compared by their values), times in ns
    plain = {f.name: getattr(f.type, "value_type", f.type) for f in timeline.schema}
    shared = [f.name for f in by_rank.schema if f.name in plain]
    assert {"rank", "pid", "host", "job"} <= set(shared)
    assert [(n, by_rank.schema.field(n).type) for n in shared] == [(n, plain[n]) for n in shared]
    assert by_rank.schema.field("death_time").type == timeline.schema.field("time").type
    # AND both name the job, so the two join on (job, rank) as they are
    assert set(timeline["job"].to_pylist()) == {"4242"} and by_rank["job"].to_pylist() == ["4242"]
    assert by_rank["rank"].to_pylist() == [3] and set(timeline["rank"].to_pylist()) == {3}
