"""`accelerate launch` of two CPU ranks (gloo) under `blackbox run`, as unarmed: the launcher named as itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, free_port

pytestmark = pytest.mark.slow

ACCELERATE = Path(sys.executable).with_name("accelerate")
ENV = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
# The planted truth: rank 1 stops at step 20 in its data source (it writes the stuck file first); rank 0 then
# waits for it in backward, where DDP all-reduces the gradients. `--multi_gpu` is accelerate's multi-process
# launcher (torchrun's agent, in accelerate's own process); Accelerator(cpu=True) makes it gloo on CPU.
JOB = """\
import sys, threading, time
import torch
from accelerate import Accelerator

acc = Accelerator(cpu=True)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model, opt = acc.prepare(model, opt)


def next_batch(step):
    if acc.process_index == 1 and step == 20:
        open(sys.argv[1], "w").close()
        threading.Event().wait()  # STUCK
    return torch.randn(16, 32)


for step in range(10**6):
    loss = model(next_batch(step)).pow(2).mean()
    opt.zero_grad()
    acc.backward(loss)
    opt.step()
    if acc.is_main_process:
        print(f"step {step}", flush=True)
    time.sleep(0.02)
"""
STUCK_FOR = 4.0  # seconds the planted hang lasts before `timeout` is made to end the job


# the command as users type it, and as a module (armed before runpy set sys.argv[0], its argv read "-m" alone)
LAUNCHES = {"accelerate launch": [str(ACCELERATE), "launch"],
            "python -m": [sys.executable, "-m", "accelerate.commands.launch"]}  # fmt: skip


@pytest.mark.skipif(not ACCELERATE.exists(), reason="no accelerate beside this Python (tools/setup.sh installs it)")
@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_accelerate_launch_hang_names_the_stuck_rank_and_accelerate_as_the_launcher(
    tmp_path: Path, launch: str
) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("torch.distributed")
    (tmp_path / "train.py").write_text(JOB)
    runs = tmp_path / "runs"
    # GIVEN the job under `timeout`, unarmed and under `blackbox run`, side by side; once rank 1 is stuck and
    # STUCK_FOR more seconds pass, SIGALRM makes each `timeout` act as if its time had run out
    procs, stuck = [], []
    for i, prefix in enumerate([[], [sys.executable, "-m", "blackbox", "run", "--dir", str(runs), "--"]]):
        stuck.append(tmp_path / f"stuck{i}")
        cmd = [*prefix, *LAUNCHES[launch], "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
               str(tmp_path / "train.py"), str(stuck[i])]  # fmt: skip
        procs.append(subprocess.Popen(["timeout", "120", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=ENV, cwd=tmp_path))  # fmt: skip
    deadline = time.monotonic() + 150
    for path, proc in zip(stuck, procs, strict=True):
        while not path.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(STUCK_FOR)
    for proc in procs:
        proc.send_signal(signal.SIGALRM)
    (out0, err0), (out1, err1) = [p.communicate(timeout=120) for p in procs]
    # THEN it ends as unarmed: timeout's status, the same steps printed
    assert procs[0].returncode == procs[1].returncode == 124, (err0[-2000:], err1[-3000:])
    assert out0.splitlines()[:20] == out1.splitlines()[:20] == [f"step {n}" for n in range(20)]
    # AND the first death is rank 1's hang where it was planted, rank 0 stopped by accelerate's launcher (its
    # agent's thread is named as torchrun's), the launcher named as itself, never as torchrun
    (bundle,) = runs.glob("run-*/bundle")
    meta: dict[str, Any] = json.loads((bundle / "metadata.json").read_text())
    first, (attempt,) = meta["first_death"], meta["attempts"]
    line = JOB.splitlines().index("        threading.Event().wait()  # STUCK") + 1
    assert (meta["cause"], first["rank"], first["cause"]) == ("hang", 1, "hang"), json.dumps(first, default=str)
    assert first["hang"]["site"].startswith(f"next_batch ({tmp_path / 'train.py'}:{line})"), first["hang"]
    assert first["headline"].endswith("; then SIGTERM from accelerate launch ended it."), first["headline"]
    roles = sorted(m["death"]["victim"]["role"] for m in meta["rings"])
    assert roles == ["accelerate launcher", "main process", "main process"], roles
    by_rank = {m["rank"]: m["death"] for m in meta["rings"]}
    assert by_rank[0]["collateral_of"]["by"] == "accelerate launch", by_rank[0]
    chain = attempt["hang"]["chain"]
    assert [(c["sender"], c["launcher"]) for c in chain] == [("timeout", None), ("pt_elastic", "accelerate launch")]
    summary = (bundle / "summary.md").read_text()
    assert "rank 0 stopped by accelerate launch after rank 1 hung" in summary
    assert "torchrun" not in summary, [ln for ln in summary.splitlines() if "torchrun" in ln]
