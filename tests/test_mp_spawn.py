"""torch.multiprocessing.spawn (``mp.spawn``, as pytorch/examples' DDP scripts start their ranks) under
`blackbox run`, unarmed and armed side by side: where one rank dies, the parent ends the others by SIGTERM
and raises. That SIGTERM is no Pool's teardown (a clean end): those ranks are collateral of the first death."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, free_port

pytestmark = pytest.mark.slow

JOB = """\
import os, signal, sys, time
import torch.distributed as dist
import torch.multiprocessing as mp

def fn(rank):
    dist.init_process_group("gloo", rank=rank, world_size=3)  # the rank an argument, no RANK in the environment
    for step in range(400):
        time.sleep(0.02)
        if rank == 1 and step == 25:
            os.kill(os.getpid(), signal.SIGKILL)  # PLANT: rank 1's death

if __name__ == "__main__":
    mp.spawn(fn, nprocs=3)
"""


def _unarmed_and_armed(tmp_path: Path) -> list[subprocess.CompletedProcess[str]]:
    """train.py run unarmed, then under `blackbox run` (its run folder in tmp_path/run)."""
    runs = []
    for armed in (False, True):
        run = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--"] * armed
        env = dict(os.environ, PYTHONPATH=str(REPO) if armed else "", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()))
        runs.append(subprocess.run([*run, sys.executable, "train.py"], capture_output=True, text=True, timeout=180,
                                   cwd=tmp_path, env=env))  # fmt: skip
    return runs


def test_ranks_the_parent_ends_after_one_dies_are_collateral_not_clean_ends(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(JOB)
    # GIVEN mp.spawn's 3 ranks, rank 1 SIGKILLed at its step 25; the parent then SIGTERMs ranks 0 and 2, and raises
    runs = _unarmed_and_armed(tmp_path)
    plain, armed = runs
    # THEN it ends as unarmed: the parent's ProcessExitedException, status 1
    assert plain.returncode == armed.returncode == 1, (plain.stderr[-2000:], armed.stderr[-2000:])
    for done in runs:
        assert "process 1 terminated with signal SIGKILL" in done.stderr, done.stderr[-2000:]
    (bundle,) = (tmp_path / "run").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    # AND the first death is rank 1's SIGKILL (its rank said as torch.distributed gave it: it read "rank -"); the
    # other two were stopped by their parent after it, collateral
    first = meta["first_death"]
    assert (first["cause"], first["victim"]["role"]) == ("killed", "torch.multiprocessing.spawn process"), first
    assert first["rank"] == 1, first
    rings = {m["pid"]: m for m in meta["rings"]}
    spawned = [m for m in rings.values() if m["death"]["victim"]["role"] == "torch.multiprocessing.spawn process"]
    assert len(spawned) == 3, [m["death"]["victim"] for m in rings.values()]
    stopped = [m for m in spawned if m["pid"] != first["pid"]]
    for m in stopped:  # (they read `clean_exit`: "multiprocessing ends a Pool's workers so")
        assert m["death"]["cause"] == "signal" and m["death"]["killed_by"]["signal"] == "SIGTERM", m["death"]
        assert m["death"]["collateral_of"]["pid"] == first["pid"], m["death"]
    summary = (bundle / "summary.md").read_text()
    assert "**First death: rank 1 (host " in summary, summary[:3000]
    assert "ranks 0 and 2 stopped by the parent process after rank 1 died" in summary, summary[:3000]
    assert "clean_exit" not in summary.split("## How they ended", 1)[1].split("##", 1)[0], summary[:3000]
    assert signal.SIGKILL.name in summary


RAISES_AT_ONCE = """\
import torch.distributed as dist
import torch.multiprocessing as mp

def fn(rank):
    dist.init_process_group("gloo", rank=rank, world_size=3)
    dist.barrier()
    if rank == 1:
        raise ValueError("planted: rank 1 fails")  # before any tick of its sampler wrote its rank
    dist.barrier()  # (the others wait for it: the parent ends them)

if __name__ == "__main__":
    mp.spawn(fn, nprocs=3)
"""


def test_a_rank_that_raises_at_once_is_named_and_the_parents_report_is_no_death_of_its_own(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(RAISES_AT_ONCE)
    # GIVEN mp.spawn's 3 ranks, rank 1 raising as soon as its group is up; the parent raises
    # ProcessRaisedException after ending the others
    runs = _unarmed_and_armed(tmp_path)
    for done in runs:  # as unarmed
        assert done.returncode == 1 and "ValueError: planted: rank 1 fails" in done.stderr, done.stderr[-2000:]
    (bundle,) = (tmp_path / "run").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    # THEN the first death is rank 1's ValueError, its rank said (its ring held none: the rank is written at its
    # disarm too, not only at a tick), and the parent's ProcessRaisedException is its report of that death,
    # collateral (it counted as "1 other died of its own cause")
    first = meta["first_death"]
    assert (first["cause"], first["rank"]) == ("exception", 1), first
    (parent,) = [m for m in meta["rings"] if m["rank"] is None]
    assert parent["death"]["cause"] == "exception", parent["death"]
    assert parent["death"]["collateral_of"] == {"rank": 1, "host": first["host"], "pid": first["pid"], "by": None,
                                                "reported": True}, parent["death"]  # fmt: skip
    assert meta["attempts"][0]["deaths"] == 1, meta["attempts"]
    summary = (bundle / "summary.md").read_text()
    told = next(line for line in summary.splitlines() if line.startswith("4 processes: "))
    assert f"pid {parent['pid']} reported rank 1's death and ended (`exception`)" in told, told
    assert "own cause" not in told and "1 rank `exception` (the first death)" in summary, summary[:3000]
