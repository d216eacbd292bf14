"""A real kernel OOM kill: a leaking training loop in a memory cgroup, killed by the kernel.

The recovered ring must show memory climbing to the limit, the optimizer's step
count the job printed, and an event within one sample interval of the death.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import spawn_py

import blackbox
from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import find_rings, read_ring

torch = pytest.importorskip("torch", reason="the leaking training loop needs torch (tools/setup.sh installs it)")

LIMIT = 700 << 20
INTERVAL = 0.05
LEAKY_JOB = """
import sys, blackbox
blackbox.arm(sys.argv[1], capacity=1 << 16, sample_interval=float(sys.argv[2]))
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
kept = []  # the leak: every step's loss kept with its graph (its activations stay alive)
for step in range(1, 100000):
    x = torch.randn(1024, 256)
    loss = model(x).pow(2).mean()
    kept.append(model(x).mean())  # an eval loss never backwarded: 8 MiB of activations per step
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, flush=True)
"""


@pytest.mark.slow
def test_kernel_oom_kill_of_leaking_training_loop(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    cg = memory_cgroup(LIMIT)
    kills_before = cg.oom_kills()
    ring_dir = tmp_path / "rings"
    ring_dir.mkdir()
    child = spawn_py(
        LEAKY_JOB, str(ring_dir), str(INTERVAL), stdout=subprocess.PIPE, preexec_fn=cg.join, env={"RANK": "0"}
    )
    out, _ = child.communicate(timeout=300)
    died_at = time.time_ns()
    assert child.returncode == -signal.SIGKILL, f"expected a SIGKILL from the kernel, got {child.returncode}"
    assert cg.oom_kills() == kills_before + 1, "the kernel's OOM killer did it (the cgroup's oom_kill counter)"
    printed = [int(line) for line in out.split()]
    assert printed, "the job completed some steps before it died"

    (ring_path,) = find_rings([ring_dir])
    ring = read_ring(ring_path)
    assert not ring.clean and ring.recovery.valid > 0
    table = ring_table(ring)
    samples = table.filter(pc.equal(table["kind"].cast("string"), "sample"))
    usage = samples["cgroup_usage"].to_pylist()
    rss = samples["host_rss"].to_pylist()
    assert samples["cgroup_limit"].to_pylist()[-1] == LIMIT
    assert max(usage) >= 0.85 * LIMIT, f"the ring shows the climb to the limit (peak {max(usage) >> 20} MiB)"
    assert rss[-1] > rss[0] + (200 << 20), "RSS grew by the leak"

    steps = table["step"].drop_null()
    last_step = pc.max(steps).as_py()
    # the optimizer's post hook records step k just before the job prints k: a kill can fall in between
    assert printed[-1] <= last_step <= printed[-1] + 1, (printed[-1], last_step)

    last_event = table["time"].cast("int64")[-1].as_py()
    assert died_at - last_event < INTERVAL * 1e9 + 0.5e9, (
        f"the last event is {(died_at - last_event) / 1e9:.3f} s before the death was seen"
    )
    bundle = blackbox.recover(ring_path, tmp_path / "bundle")
    assert (bundle / "timeline.parquet").exists()
