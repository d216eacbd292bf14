"""Retention: every arm keeps its ring folder within a default count and size (overridable), never touching
a ring still being written; `blackbox run`'s run folders are kept or removed whole, never while their run
lives; `blackbox prune` understands both layouts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_py, spawn_py

import blackbox
from blackbox.cli import main
from blackbox.ring.retention import DEFAULT_KEEP, parse_keep

DEFAULT_COUNT, DEFAULT_SIZE = parse_keep(DEFAULT_KEEP)
HOLDER = """
import sys, blackbox
rec = blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600, keep="off")
print(rec.path, flush=True)
sys.stdin.readline()          # wait until the test says so, armed all along
blackbox.mark("after", 1)
blackbox.disarm()
print("clean", flush=True)
"""


def _age(path: Path, age_s: float) -> None:
    """Set the mtime of a file, or of a folder and everything in it (links themselves, never their target)."""
    t = time.time() - age_s
    for top, dirs, files in os.walk(path) if path.is_dir() else []:
        for name in dirs + files:
            os.utime(Path(top, name), (t, t), follow_symlinks=False)
    os.utime(path, (t, t), follow_symlinks=False)


def _old_ring(folder: Path, name: str, age_s: float) -> Path:
    rec = blackbox.Recorder.arm(folder / name, capacity=64, sample_interval=3600, keep="off")
    rec.disarm()
    assert rec.path is not None
    _age(rec.path, age_s)
    return rec.path


def _arm_in(folder: Path, env: dict[str, str] | None = None, keep: str = "") -> subprocess.CompletedProcess[str]:
    return run_py(
        "import sys, blackbox\n"
        "rec = blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600, keep=sys.argv[2] or None)\n"
        "print(rec.armed)\n",
        str(folder),
        keep,
        env=env,
    )


def _holder(folder: Path) -> tuple[subprocess.Popen[str], Path]:
    child = spawn_py(HOLDER, str(folder), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    path = Path(child.stdout.readline().strip())
    assert path.is_file()
    return child, path


def _release(child: subprocess.Popen[str]) -> str:
    out, _ = child.communicate("go\n", timeout=60)
    assert child.returncode == 0, "the holder's job ran to its clean end"
    return out


def test_arm_keeps_the_default_count_and_never_a_live_ring(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN more old rings than the default count, and an older ring still armed by another process
    assert DEFAULT_COUNT is not None and DEFAULT_SIZE is not None
    monkeypatch.delenv("BLACKBOX_KEEP", raising=False)
    holder, live = _holder(tmp_path)
    try:
        _age(live, 100_000)  # the oldest of all
        old = [_old_ring(tmp_path, f"old{i:03}.ring", 10_000 - i) for i in range(DEFAULT_COUNT + 5)]
        # WHEN a process arms with no setting at all
        armed = _arm_in(tmp_path)
        assert armed.stdout.strip() == "True"
        # THEN it says in one line what it removed, where, and by which setting
        said = [line for line in armed.stderr.splitlines() if "BlackboxWarning" in line]
        assert len(said) == 1 and "removed 7 old rings (" in said[0] and f"from {tmp_path}" in said[0], armed.stderr
        assert f"within {DEFAULT_KEEP} (the default keep" in said[0], said
        # AND the folder holds the default count: the live ring, the newest old ones and the new ring
        rings = sorted(tmp_path.glob("*.ring"))
        assert len(rings) == DEFAULT_COUNT
        assert live.exists(), "another process's armed ring is never removed"
        gone = [p for p in old if not p.exists()]
        assert gone == old[:7], "the oldest go first, the live ring counting towards the limit"
    finally:
        assert _release(holder).strip() == "clean"
    bundle = blackbox.recover(live, tmp_path / "bundle")
    assert json.loads((bundle / "metadata.json").read_text())["death"]["cause"] == "clean_exit"


def test_arm_keeps_the_default_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # GIVEN three old rings of 0.45 of the default size each (grown sparse: their header still reads)
    assert DEFAULT_SIZE is not None
    monkeypatch.delenv("BLACKBOX_KEEP", raising=False)
    rings = []
    for i in range(3):
        path = _old_ring(tmp_path, f"big{i}.ring", 10_000 - i)
        os.truncate(path, int(DEFAULT_SIZE * 0.45))
        _age(path, 10_000 - i)
        rings.append(path)
    # WHEN a process arms with no setting
    assert _arm_in(tmp_path).stdout.strip() == "True"
    # THEN the oldest went: the two left are within the default size
    assert [p.exists() for p in rings] == [False, True, True]


def test_keep_off_and_keep_argument_override_the_default(tmp_path: Path) -> None:
    old = [_old_ring(tmp_path, f"old{i}.ring", 10_000 - i) for i in range(4)]
    kept = _arm_in(tmp_path, {"BLACKBOX_KEEP": "off"})
    assert kept.stdout.strip() == "True" and "BlackboxWarning" not in kept.stderr, "nothing removed: nothing said"
    assert all(p.exists() for p in old), "BLACKBOX_KEEP=off keeps everything"
    pruned = _arm_in(tmp_path, {"BLACKBOX_KEEP": "off"}, keep="count=2")
    assert pruned.stdout.strip() == "True" and "removed 4 old rings (" in pruned.stderr, pruned.stderr
    assert "within count=2 (keep=;" in pruned.stderr, pruned.stderr
    assert not any(p.exists() for p in old), "arm's keep= wins over the environment"
    assert len(list(tmp_path.glob("*.ring"))) == 2, "the young ring of the first arm stays (never removed)"
    bad = _arm_in(tmp_path, keep="forever")
    assert bad.stdout.strip() == "True" and "keep= not applied" in bad.stderr


def _blackbox_run(work: Path, *cmd: str, env: dict[str, str] | None = None, **kw) -> subprocess.Popen[str]:  # type: ignore[no-untyped-def]
    return subprocess.Popen(
        [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(work), "--", *cmd],
        cwd=REPO,
        env=dict(env or os.environ, PYTHONPATH=str(REPO)),
        text=True,
        **kw,
    )


@pytest.mark.slow
def test_prune_and_blackbox_run_keep_run_folders_whole_and_never_a_live_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = [sys.executable, "-c", "import numpy, sys; sys.exit(3)"]
    # GIVEN three finished runs, each with its rings and its bundle, aged one after the other
    for i in range(3):
        assert _blackbox_run(tmp_path, *job, stderr=subprocess.DEVNULL).wait(timeout=180) == 3
        (run,) = [p for p in tmp_path.glob("run-*") if os.stat(p).st_mtime > time.time() - 600]
        assert any((run / "rings").glob("*.ring")) and (run / "bundle" / "metadata.json").is_file()
        _age(run, 10_000 - i * 100)
    runs = sorted(tmp_path.glob("run-*"), key=lambda p: p.stat().st_mtime)
    # AND a run still going, its folder aged as old as the oldest: its job (a shell) waits on stdin and has no
    # ring: only its blackbox run's lock tells that it is in use
    live = _blackbox_run(
        tmp_path,
        "sh",
        "-c",
        "echo started; read line; echo done",
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert live.stdout is not None and live.stdout.readline().strip() == "started"
    (live_run,) = set(tmp_path.glob("run-*")) - set(runs)
    _age(live_run, 20_000)
    try:
        # WHEN prune keeps one entry
        assert main(["prune", str(tmp_path), "--max-count", "1"]) == 0
        out = capsys.readouterr().out
        # THEN the finished runs go whole (rings and bundle), the live one stays: it is in use
        assert sorted(tmp_path.glob("run-*")) == [live_run]
        assert all(f"removed {r} (" in out for r in runs)
        assert "1 kept" in out and "1 in use or too recent (never removed)" in out
    finally:
        out, _ = live.communicate("go\n", timeout=180)
    assert live.returncode == 0 and out.strip() == "done", "the live run's job ran to its end untouched"
    assert (live_run / "rings" / "relayed.jsonl").is_file(), "its run folder is whole"

    # WHEN a new run starts beside it with BLACKBOX_KEEP=count=1, and runs three Python processes
    _age(live_run, 20_000)
    killed = "import numpy, os, signal; os.kill(os.getpid(), signal.SIGKILL)"  # leaves its ring (no clean end)
    aged = '--date=@$(($(date +%s) - 20000)) "$BLACKBOX_DIR"/*.ring'  # each ring left old before the next arm
    three = f"for i in 1 2 3; do {sys.executable} -c '{killed}'; touch {aged}; done; true"
    env = dict(os.environ, BLACKBOX_KEEP="count=1")
    assert _blackbox_run(tmp_path, "sh", "-c", three, env=env, stderr=subprocess.DEVNULL).wait(timeout=180) == 0
    # THEN the older run went at its start, and its own rings folder was never pruned inside
    (new_run,) = tmp_path.glob("run-*")
    assert new_run != live_run
    assert len(list((new_run / "rings").glob("*.ring"))) == 3


def test_prune_says_what_it_found_in_a_folder_it_does_not_understand(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "notes.txt").write_text("x")
    assert main(["prune", str(tmp_path), "--max-count", "1"]) == 1
    err = capsys.readouterr().err
    assert "expected rings (*.ring), blackbox run's run-* folders or bundles" in err and "'notes.txt'" in err
    run = tmp_path / "run-20260101T000000Z-abcd"
    (run / "rings").mkdir(parents=True)
    assert main(["prune", str(run), "--max-count", "1"]) == 1
    assert f"found one run's folder: prune {tmp_path}" in capsys.readouterr().err


def test_arm_in_a_slurm_job_keeps_the_users_folder_of_job_folders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from blackbox.ring import file as ring_file

    user = tmp_path / "user"
    user.mkdir(mode=0o700)
    monkeypatch.setattr(ring_file, "user_dir", lambda uid=None: user)  # /var/tmp/blackbox-<uid>, here
    monkeypatch.delenv("BLACKBOX_DIR", raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "1000")
    # GIVEN the folders of four earlier Slurm jobs, each with its dead ring, and an older one whose ring is
    # still armed by another process
    old = []
    for i in range(4):
        folder = user / f"slurm-{900 + i}"
        folder.mkdir(mode=0o700)
        _old_ring(folder, "rank0.ring", 10_000 - i)
        _age(folder, 10_000 - i)
        old.append(folder)
    (user / "slurm-899").mkdir(mode=0o700)
    holder, live = _holder(user / "slurm-899")
    try:
        _age(user / "slurm-899", 100_000)
        # WHEN a process of job 1000 arms in its default folder, keeping 3
        rec = blackbox.Recorder.arm(capacity=64, sample_interval=3600, keep="count=3")
        try:
            assert rec.path is not None and rec.path.parent == user / "slurm-1000"
        finally:
            rec.disarm()
        # THEN the user's folder keeps 3 job folders: the live job's, the newest old one and job 1000's
        assert sorted(p.name for p in user.iterdir()) == ["slurm-1000", "slurm-899", "slurm-903"]
        assert live.exists()
    finally:
        assert _release(holder).strip() == "clean"


@pytest.mark.slow
def test_a_bad_keep_setting_only_warns_and_the_job_runs_as_unarmed(tmp_path: Path) -> None:
    job = ["sh", "-c", "echo out; echo err >&2; exit 7"]
    env = dict(os.environ, BLACKBOX_KEEP="forever")
    unarmed = subprocess.run(job, capture_output=True, text=True, env=env, timeout=60)
    armed = _blackbox_run(tmp_path, *job, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = armed.communicate(timeout=180)
    assert (armed.returncode, out) == (unarmed.returncode, unarmed.stdout) == (7, "out\n")
    assert "err\n" in err and err.count("BLACKBOX_KEEP not applied") == 1
