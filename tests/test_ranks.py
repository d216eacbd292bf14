"""Several ranks: torchrun with gloo workers on CPU, one SIGKILLed; the merged timeline names who died first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from conftest import REPO, free_port

pytest.importorskip("torch.distributed", reason="torchrun needs torch")

WORKER = """\
import os, signal, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(64, 64)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 1000):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    if rank == 1 and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)  # the rank that dies first
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_torchrun_rank_killed_first_is_named_in_merged_bundle(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    cmd = [
        sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "run"), "--quiet", "--",
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3", "--max-restarts=0",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-backend=c10d", str(script),
    ]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO, env=env)
    assert proc.returncode != 0, proc.stderr[-2000:]
    (run,) = (tmp_path / "run").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    by_rank = {m["rank"]: m for m in meta["rings"]}
    assert {0, 1, 2} <= set(by_rank), sorted(by_rank, key=str)  # the launcher's ring has rank None
    assert by_rank[1]["death"]["cause"] == "killed"
    assert meta["first_death"]["rank"] == 1 and meta["first_death"]["cause"] == "killed"
    for r in (0, 2):
        assert by_rank[r]["death"]["time"] >= meta["first_death"]["time"]
    table = pq.read_table(run / "bundle" / "timeline.parquet")
    assert set(pc.unique(table["rank"]).drop_null().to_pylist()) >= {0, 1, 2}
    assert len(pc.unique(table["pid"])) == len(meta["rings"])
    for pid in pc.unique(table["pid"]).to_pylist():  # each ring's rows in time order (row groups per ring)
        times = table.filter(pc.equal(table["pid"], pid))["time"].cast("int64").to_numpy()
        assert (times[1:] >= times[:-1]).all(), f"pid {pid}: rows in time order"
    steps = table.filter(pc.equal(table["rank"], 1))["step"].drop_null()
    assert pc.max(steps).as_py() in (19, 20)
    summary = (run / "bundle" / "summary.md").read_text()
    assert "**First death: rank 1 (host " in summary and "## How they ended" in summary
