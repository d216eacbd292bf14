"""blackbox watch on a live ring, and blackbox prune keeping folders within limits."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_py, spawn_py

import blackbox
from blackbox.cli import main

LEAKER = """
import sys, time, blackbox
blackbox.arm(sys.argv[1], capacity=1 << 14, sample_interval=0.02)
kept = []
for step in range(1, 100000):
    blackbox.step(step)
    kept.append(bytearray(1 << 20))  # 1 MiB a step, 50 steps a second
    time.sleep(0.02)
"""


def test_watch_follows_a_live_ring_read_only_then_sees_its_death(
    tmp_path: Path,
    memory_cgroup,
    capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
) -> None:
    cg = memory_cgroup(2 << 30)
    child = spawn_py(LEAKER, str(tmp_path), preexec_fn=cg.join, stdout=subprocess.DEVNULL)
    try:
        time.sleep(2.0)
        (ring,) = tmp_path.glob("*.ring")
        before = ring.read_bytes()[:4096]
        assert main(["watch", str(ring), "--once"]) == 0
        live = capsys.readouterr().out
        assert "[running]" in live and "step " in live and "steps/s" in live
        assert "host RSS" in live and "/s)" in live, "a growth rate"
        assert "cgroup:" in live and "of 2.0 GiB" in live and "limit in ~" in live
        assert ring.read_bytes()[:4096] == before, "the header is untouched: watch only reads"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert main(["watch", str(ring), "--interval", "0.1"]) == 0  # returns by itself: the writer is gone
    assert "ENDED without a clean end" in capsys.readouterr().out


def _ring(folder: Path, name: str, age_s: float) -> Path:
    rec = blackbox.Recorder.arm(folder / name, capacity=64, sample_interval=3600)
    rec.disarm()
    assert rec.path is not None
    t = time.time() - age_s
    os.utime(rec.path, (t, t))
    return rec.path


def test_prune_removes_the_oldest_and_never_a_live_ring(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    live = blackbox.Recorder.arm(tmp_path / "live.ring", capacity=64, sample_interval=3600)  # this process writes it
    assert live.path is not None
    old_live = time.time() - 10_000
    os.utime(live.path, (old_live, old_live))  # the oldest of all, and still in use
    rings = [_ring(tmp_path, f"r{i}.ring", 1000 - i * 100) for i in range(4)]  # r0 oldest
    crash = Path(str(rings[0]) + ".crash")
    crash.write_text("Fatal Python error\n")
    try:
        assert main(["prune", str(tmp_path), "--max-count", "3", "--dry-run"]) == 0
        assert "would remove" in capsys.readouterr().out and rings[0].exists()
        assert main(["prune", str(tmp_path), "--max-count", "3"]) == 0
        out = capsys.readouterr().out
        assert sorted(p.name for p in tmp_path.glob("*.ring")) == ["live.ring", "r2.ring", "r3.ring"]
        assert not crash.exists(), "sidecar files go with their ring"
        assert "1 in use or too recent (never removed)" in out
        assert main(["prune", str(tmp_path), "--max-count", "0"]) == 0
        assert [p.name for p in tmp_path.glob("*.ring")] == ["live.ring"]
    finally:
        live.disarm()


def test_prune_bundles_by_total_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        b = tmp_path / f"bundle{i}"
        b.mkdir()
        (b / "metadata.json").write_text("{}")
        (b / "timeline.parquet").write_bytes(bytes(1 << 20))
        t = time.time() - 100 + i
        os.utime(b / "metadata.json", (t, t))
    assert main(["prune", str(tmp_path), "--max-size", "2.5M"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle1", "bundle2"]
    assert main(["prune", str(tmp_path)]) == 1
    assert "expected --max-count and/or --max-size" in capsys.readouterr().err
    assert main(["prune", str(tmp_path), "--max-size", "lots"]) == 1


def test_arm_keeps_the_ring_folder_within_blackbox_keep(tmp_path: Path) -> None:
    for i in range(4):
        _ring(tmp_path, f"old{i}.ring", 1000 - i)
    out = run_py(
        "import os, sys, blackbox\n"
        "os.environ['BLACKBOX_KEEP'] = sys.argv[2]\n"
        "rec = blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600)\n"
        "print(rec.armed)\n",
        str(tmp_path),
        "count=3",
    )
    assert out.stdout.strip() == "True"
    names = sorted(p.name for p in tmp_path.glob("*.ring"))
    assert len(names) == 3 and "old2.ring" in names and "old3.ring" in names and "old0.ring" not in names
    bad = run_py(
        "import os, sys, blackbox\nos.environ['BLACKBOX_KEEP'] = 'forever'\n"
        "print(blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600).armed)\n",
        str(tmp_path),
    )
    assert bad.stdout.strip() == "True" and "BLACKBOX_KEEP not applied" in bad.stderr
