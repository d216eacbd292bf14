"""tools/gpu_check.py --dry-run: every GPU check's plumbing on the fake CUDA device (tools/gpucheck/fake_cuda.py),
so the command is known to work before a GPU is at hand (the real run: tests/gpu/test_gpu_check_cuda.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

pytestmark = pytest.mark.slow
TOOL = REPO / "tools" / "gpu_check.py"


def _run(*args: str, timeout: float = 600, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(TOOL), "--dry-run", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})  # fmt: skip


def test_every_check_holds_on_the_fake_device(tmp_path: Path) -> None:
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    proc = _run("--out", str(out), "--scratch", str(scratch))
    report = json.loads((out / "gpu_check.json").read_text())
    failed = {c["name"]: c.get("error") or c.get("figures") for c in report["checks"] if not c.get("ok")}
    assert proc.returncode == 0 and not failed, (failed, proc.stdout[-2000:])
    assert [c["name"] for c in report["checks"]] == ["oom", "history", "snapshot", "sigkill", "gpu_leak", "cost",
                                                     "unchanged"]  # fmt: skip
    table = (out / "gpu_check.md").read_text()
    assert table.count("| yes |") == 7 and "dry run" in table
    assert {p.name for p in out.iterdir()} <= {"gpu_check.json", "gpu_check.md", "memory_viz.html"}
    oom = next(c for c in report["checks"] if c["name"] == "oom")["figures"]
    assert oom["fragmentation"]["verdict"] == "oom_exception / fragmentation"
    assert oom["exhaustion"]["allocated"]["blackbox"] == oom["exhaustion"]["allocated"]["pytorch_stats"]


def test_a_check_that_runs_over_is_recorded_and_the_next_still_runs(tmp_path: Path) -> None:
    out = tmp_path / "out"
    # GIVEN the OOM check's jobs hang (planted: tools/gpucheck/job.py's GPUCHECK_HANG) under a 2 s cap a check
    proc = _run("--out", str(out), "--only", "oom,unchanged", "--check-timeout", "2", timeout=120,
                env={"GPUCHECK_HANG": "oom_exhaustion,oom_fragmentation"})  # fmt: skip
    assert proc.returncode == 1
    report = json.loads((out / "gpu_check.json").read_text())
    # THEN its jobs are cut at its deadline (the check then says what it could not see), or the check itself is
    # killed a few seconds later: either way it is recorded as not held, in seconds, and the next one runs
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == ["oom", "unchanged"] and checks["oom"]["ok"] is False, report["checks"]
    assert all(0 < c["seconds"] < 15 for c in report["checks"]), "the jobs were killed, not waited for"
    rows = [r for r in (out / "gpu_check.md").read_text().splitlines() if r.startswith("| 1 |")]
    assert len(rows) == 1 and rows[0].endswith("| **no** |"), rows


def test_a_check_left_without_time_is_recorded_as_not_run(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = _run("--out", str(out), "--budget", "0", timeout=120)
    report = json.loads((out / "gpu_check.json").read_text())
    assert proc.returncode == 1 and len(report["checks"]) == 7
    assert all(c["error"].startswith("not run:") for c in report["checks"])
