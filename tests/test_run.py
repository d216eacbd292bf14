"""`blackbox run`: any Python job armed with no code change, recovered and diagnosed after it dies."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

LEAKY_SCRIPT = """\
import time
kept = []
for step in range(100000):
    kept.append(bytearray(4 << 20))   # an unmodified script that leaks 4 MiB a step
    time.sleep(0.005)
"""


def blackbox_run(work: Path, *cmd: str, preexec_fn=None, env=None) -> subprocess.CompletedProcess[str]:  # type: ignore[no-untyped-def]
    return subprocess.run(
        [sys.executable, "-m", "blackbox", "run", "--dir", str(work), "--", *cmd],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=REPO,
        preexec_fn=preexec_fn,
        env=env,
    )


def _meta(work: Path) -> dict:
    return json.loads((work / "bundle" / "metadata.json").read_text())


@pytest.mark.slow
def test_run_around_a_script_the_kernel_oom_kills(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    cg = memory_cgroup(300 << 20)
    script = tmp_path / "train.py"
    script.write_text(LEAKY_SCRIPT)
    proc = blackbox_run(tmp_path / "run", sys.executable, str(script), preexec_fn=cg.join)
    assert proc.returncode == 137, proc.stderr  # 128 + SIGKILL, as a shell reports it
    meta = _meta(tmp_path / "run")
    assert meta["death"]["cause"] == "host_oom_kill", meta["death"]
    assert "host_oom_kill" in proc.stdout and "exit status 137" in proc.stderr
    assert (tmp_path / "run" / "bundle" / "timeline.parquet").exists()
    png = tmp_path / "run" / "bundle" / "memory.png"
    if os.environ.get("BLACKBOX_KEEP_PLOT"):  # to look at it: BLACKBOX_KEEP_PLOT=/some/file.png
        shutil.copyfile(png, os.environ["BLACKBOX_KEEP_PLOT"])
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000


@pytest.mark.parametrize(
    "code,status,cause",
    [
        ("raise SystemExit(3)", 3, "clean_exit"),
        (
            "import os, signal; signal.signal(signal.SIGTERM, signal.SIG_DFL); os.kill(os.getpid(), signal.SIGTERM)",
            143,
            "signal",
        ),
        ("raise RuntimeError('boom')", 1, "exception"),
    ],
    ids=["exit-3", "sigterm", "exception"],
)
def test_run_passes_the_exit_status_through_and_names_the_cause(
    tmp_path: Path, code: str, status: int, cause: str
) -> None:
    proc = blackbox_run(tmp_path / "run", sys.executable, "-c", code)
    assert proc.returncode == status, proc.stderr
    assert _meta(tmp_path / "run")["death"]["cause"] == cause


def test_run_chains_the_jobs_own_sitecustomize(tmp_path: Path) -> None:
    own = tmp_path / "site"
    own.mkdir()
    (own / "sitecustomize.py").write_text("import builtins\nbuiltins.JOB_SITE = 'ran'\n")
    env = {"PYTHONPATH": str(own), "PATH": "/usr/bin:/bin"}
    code = "import builtins, blackbox; print(builtins.JOB_SITE, blackbox.active().armed)"
    proc = blackbox_run(tmp_path / "run", sys.executable, "-c", code, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == "ran True"


def test_run_of_a_non_python_command_says_so_and_keeps_its_status(tmp_path: Path) -> None:
    proc = blackbox_run(tmp_path / "run", "sh", "-c", "exit 7")
    assert proc.returncode == 7 and "left no ring" in proc.stderr


def test_run_without_a_command_is_one_line_error(tmp_path: Path) -> None:
    proc = blackbox_run(tmp_path / "run")
    assert proc.returncode == 1 and proc.stderr.count("\n") <= 2 and "expected a command" in proc.stderr
