"""The verdict first: `blackbox run` killed mid-recovery (a scheduler's SIGKILL a few seconds after its
SIGTERM) leaves metadata.json and summary.md naming the cause, and the next `recover` writes the whole
bundle and leaves nothing of the killed one behind.

The job is a real training loop under `blackbox run` with the default ring (32 MiB) written past a full
lap, so its recovery takes as long as a real one; it is ended as Slurm ends a job, every process of it
signalled.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

JOB = """
import os, time
import blackbox
kept = []
for i in range(300_000):  # more than the default ring's 262,144 slots: a full lap and more
    if i % 100 == 0:
        blackbox.step(i // 100)
    else:
        blackbox.mark("batch", i)
    if i % 10_000 == 0:
        kept.append(bytearray(1 << 20))
print(os.getpid(), flush=True)
time.sleep(600)
"""
ENV = dict(os.environ, PYTHONPATH=str(REPO), MPLBACKEND="Agg")
GRACE_S = 2.0  # Slurm's KillWait on a loaded node, as the field report had it


def blackbox_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blackbox", *args], capture_output=True, text=True, timeout=300,
                          env=ENV, cwd=REPO)  # fmt: skip


def start_job(work: Path) -> tuple[subprocess.Popen[str], int, Path]:
    """`blackbox run -- python job.py` in a session of its own, once the job has written its lap:
    (blackbox run, the job's pid, the run folder)."""
    script = work / "job.py"
    script.write_text(JOB)
    proc = subprocess.Popen([sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(work / "d"), "--",
                             sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV, cwd=REPO, start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    job_pid = int(proc.stdout.readline())
    (run,) = (work / "d").glob("run-*")
    return proc, job_pid, run


def signal_every_process(proc: subprocess.Popen[str], job_pid: int, sig: int) -> None:
    """As slurmstepd does: every process of the job (blackbox run's group, and the job's own group)."""
    for group in (proc.pid, job_pid):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, sig)


def metadata(bundle: Path) -> dict[str, Any] | None:
    try:
        return dict(json.loads((bundle / "metadata.json").read_bytes()))
    except FileNotFoundError:
        return None


def left_beside(run: Path) -> list[str]:
    return sorted(p.name for p in run.iterdir() if p.name.startswith(".bundle."))


def recovered_again(run: Path) -> dict[str, Any]:
    """`blackbox recover` of the run's rings into its bundle folder, as the summary of a verdict says."""
    done = blackbox_cli("recover", str(run / "rings"), "-o", str(run / "bundle"))
    assert done.returncode == 0, done.stderr
    meta = metadata(run / "bundle")
    assert meta is not None
    return meta


@pytest.mark.slow
def test_a_group_kill_leaves_the_verdict_and_the_next_recover_the_whole_bundle(tmp_path: Path) -> None:
    # GIVEN a job with a full default ring under blackbox run
    proc, job_pid, run = start_job(tmp_path)
    bundle = run / "bundle"
    # WHEN the scheduler ends it: SIGTERM to every process, then SIGKILL to every process 2 s later
    signal_every_process(proc, job_pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    first = None
    while time.monotonic() < deadline:
        first = first or metadata(bundle)
        time.sleep(0.002)
    signal_every_process(proc, job_pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    # THEN the verdict is on disk, and it came before the whole bundle: metadata.json and summary.md name
    # the cause (SIGTERM, the signal that ended the job)
    load = os.getloadavg()[0]
    assert first is not None, f"no verdict {GRACE_S} s after the SIGTERM (load {load:.0f}); beside: {left_beside(run)}"
    assert first.get("complete") is False
    meta = metadata(bundle)
    assert meta is not None and meta["cause"] == "signal" and meta["death"]["killed_by"]["signal"] == "SIGTERM"
    summary = (bundle / "summary.md").read_text()
    assert "Cause `signal`" in summary and "SIGTERM" in summary
    # AND recovering the run again writes the whole bundle, and nothing is left beside it
    again = recovered_again(run)
    assert again["complete"] is True and again["cause"] == "signal" and again["events"] == 262144
    assert (bundle / "timeline.parquet").is_file() and left_beside(run) == []


@pytest.mark.slow
def test_killed_after_its_verdict_run_leaves_a_verdict_that_says_so(tmp_path: Path) -> None:
    # GIVEN a job with a full default ring under blackbox run, ended by SIGTERM to every process
    proc, job_pid, run = start_job(tmp_path)
    bundle = run / "bundle"
    signal_every_process(proc, job_pid, signal.SIGTERM)
    # WHEN blackbox run is SIGKILLed the moment its verdict is on disk
    deadline = time.monotonic() + 120
    while metadata(bundle) is None and time.monotonic() < deadline:
        time.sleep(0.001)
    signal_every_process(proc, job_pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    # THEN the bundle is the verdict, and says so: complete false, no timeline yet, and in summary.md,
    # the command that writes the rest; the holder it was writing the rest in is left beside it
    meta = metadata(bundle)
    assert meta is not None and meta.get("complete") is False and meta["cause"] == "signal"
    assert sorted(p.name for p in bundle.iterdir()) == ["allocations.parquet", "metadata.json", "ranks.parquet",
                                                         "summary.md"]  # fmt: skip
    summary = (bundle / "summary.md").read_text()
    assert summary.startswith("# blackbox:") and "**Verdict only.**" in summary
    assert f"`blackbox recover {run / 'rings'} -o {bundle}` writes the whole bundle" in summary
    assert len(left_beside(run)) == 1
    # AND what needs the timeline says in one line that this is a verdict alone
    export = blackbox_cli("export", "--perfetto", str(bundle), "-o", str(tmp_path / "trace.json"))
    assert export.returncode == 1 and export.stderr.count("\n") == 1 and "a verdict alone" in export.stderr
    # AND recovering the run again writes the whole bundle and removes what the killed one left
    again = recovered_again(run)
    assert again["complete"] is True and (bundle / "timeline.parquet").is_file()
    assert "Verdict only" not in (bundle / "summary.md").read_text() and left_beside(run) == []
