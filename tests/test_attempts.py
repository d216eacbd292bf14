"""Second times: a requeued command, a torchrun restart and retention at an explicit path, each recovered
with its attempts apart (each attempt's own first death; the summary leads with the last)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_py, spawn_py

from blackbox.recovery.attempts import group_attempts
from blackbox.recovery.pipeline import recover_rings
from blackbox.ring.reader import read_ring
from blackbox.ring.retention import YOUNG_S
from blackbox.views.summary import bundle_summary

STEPS = """
import sys, time, blackbox
blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05)
for step in range(int(sys.argv[2])):
    blackbox.step(step)
    if step == 20:
        print("at 20", flush=True)
    time.sleep(0.01)
"""


def test_a_requeued_command_is_recovered_with_both_attempts(tmp_path: Path) -> None:
    # GIVEN one command run twice at one ring path: SIGKILLed in its first run (a preemption), clean in its second
    ring = tmp_path / "rings" / "train.ring"
    first = spawn_py(STEPS, str(ring), "100000", stdout=subprocess.PIPE)
    assert first.stdout is not None and first.stdout.readline().strip() == "at 20"
    time.sleep(0.2)
    first.kill()
    first.wait()
    run_py(STEPS, str(ring), "30")
    # WHEN the folder is recovered
    meta = recover_rings([ring.parent]).meta
    # THEN both attempts are there, each with its own account, and the job's cause is the last attempt's
    attempts = meta["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["cause"] == "killed" and attempts[0]["first_death"]["step"] >= 20
    assert attempts[1]["cause"] == "clean_exit" and attempts[1]["last_step"] == 29
    assert meta["cause"] == "clean_exit" and meta["first_death"] is None
    text = bundle_summary(meta)
    assert f"- attempt 1 of 2: killed at step {attempts[0]['first_death']['step']:,}" in text
    assert "attempt 2 of 2 (the last)" in text


TORCHRUN_JOB = """
import os, sys, time, blackbox
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
blackbox.arm(os.path.join(sys.argv[1], f"rank{rank}.ring"), capacity=4096, sample_interval=0.05)
for step in range(40):
    blackbox.step(step)
    if attempt == 0 and rank == 1 and step == 25:
        os.kill(os.getpid(), 9)  # rank 1 is killed in the first attempt
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_torchrun_restart_is_recovered_with_both_attempts(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    script, rings = tmp_path / "train.py", tmp_path / "rings"
    script.write_text(TORCHRUN_JOB)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # GIVEN a torchrun job allowed one restart, whose rank 1 is SIGKILLed in the first attempt
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", "--max-restarts=1",
           f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-backend=c10d", str(script), str(rings)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # WHEN its ring folder (the killed attempt's ring kept aside by the second) is recovered
    assert len(list(rings.glob("*.ring"))) == 4
    meta = recover_rings([rings]).meta
    # THEN each attempt has its own first death: rank 1 killed in the first; the second ended cleanly
    attempts = meta["attempts"]
    assert [(a["attempt"], a["launcher_attempt"], a["rings"]) for a in attempts] == [(1, 0, 2), (2, 1, 2)]
    first = attempts[0]["first_death"]
    assert (first["rank"], first["cause"], first["step"]) == (1, "killed", 25)
    assert attempts[1]["cause"] == "clean_exit" and meta["cause"] == "clean_exit"
    assert "- attempt 1 of 2: killed at step 25 (rank 1 on " in bundle_summary(meta)


def test_blackbox_keep_applies_to_an_explicit_ring_path_s_folder(tmp_path: Path) -> None:
    # GIVEN a folder of five dead runs of one command (kept aside as train.N.ring), all older than a rank arming
    folder = tmp_path / "rings"
    for _ in range(5):
        run_py("import sys, blackbox; blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600); "
               "import os; os.kill(os.getpid(), 9)", str(folder / "train.ring"), check=False)  # fmt: skip
    for i, p in enumerate(sorted(folder.glob("*.ring"), key=lambda p: p.stat().st_mtime)):
        t = time.time() - YOUNG_S - 100 + i
        os.utime(p, (t, t))
    ages = {read_ring(p).meta["identity"]["pid"]: p.stat().st_mtime for p in folder.glob("*.ring")}
    assert len(ages) == 5
    # WHEN the command runs again at that path with BLACKBOX_KEEP=count=3
    proc = spawn_py(
        "import sys, blackbox; blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600); print(1, flush=True); "
        "sys.stdin.read()", str(folder / "train.ring"), env={"BLACKBOX_KEEP": "count=3"},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "1"
        # THEN the oldest kept-aside attempts went (counted like any ring), and the new run records at the path
        left = {read_ring(p).meta["identity"]["pid"] for p in folder.glob("*.ring")}
        youngest = sorted(ages, key=ages.__getitem__)[-2:]  # the new ring counts as one of the three
        assert left == {proc.pid, *youngest}, (left, ages)
        assert read_ring(folder / "train.ring").meta["identity"]["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def _ring(pid: int, rank: int | None, start: str | None, end: str | None, **more: object) -> dict[str, object]:
    at = "2026-11-23T{}:00.000000Z"
    return {"pid": pid, "rank": rank, "role": "main", "host": "n1", "started_at": start and at.format(start),
            "last_event_at": end and at.format(end), **more}  # fmt: skip


def _pids(groups: list[list[dict[str, object]]]) -> list[list[object]]:
    return [[r["pid"] for r in g] for g in groups]


def test_a_ring_whose_start_is_unknown_joins_an_attempt_and_opens_none() -> None:
    # GIVEN one run of three ranks, and a fourth rank whose start could not be read and which wrote last
    one_run = [_ring(10, 0, "10:00", "10:05"), _ring(11, 1, "10:00", "10:05"), _ring(12, 2, "10:01", "10:04")]
    assert _pids(group_attempts([*one_run, _ring(13, 3, None, "10:06")])) == [[10, 11, 12, 13]]
    # AND two runs (a requeue: rank 0 starts again after its ring ended): an undated ring joins the run that
    # had begun when it last wrote
    requeue = [*one_run, _ring(20, 0, "11:00", "11:05")]
    groups = group_attempts([*requeue, _ring(15, 5, None, "10:03"), _ring(16, 6, None, "12:00"),
                             _ring(17, 7, None, None), _ring(18, 8, None, "09:00")])  # fmt: skip
    assert _pids(groups) == [[10, 11, 12, 15, 18], [20, 16, 17]]
