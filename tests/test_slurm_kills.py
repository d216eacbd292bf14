"""Slurm's own memory kill told apart: ``JobAcctGatherParams=OverMemoryKill``.

With ``task/none`` there is no memory cgroup limit and no kernel OOM kill:
slurmstepd polls the step's RSS and SIGKILLs a step over ``--mem``, writing
"exceeded memory limit (X > Y), being killed" into the job's output. The
epilogue's bundle must name it (``userspace_oom_kill`` by slurmstepd, the job's
limit from Slurm's account), where it used to read as a plain ``killed``.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.slurm_cluster import slurm_cluster

pytestmark = pytest.mark.slow

GROW = """
import os, sys, time
import blackbox
blackbox.arm(sample_interval=0.1)
chunks = []
while True:
    chunks.append(bytearray(os.urandom(1 << 20) * 8))  # 8 MiB, every page touched
    time.sleep(0.15)
"""


def test_slurm_over_memory_kill_is_a_memory_kill() -> None:
    dest = Path(os.environ.get("TMPDIR", "/tmp")) / f"bb-omk-dest-{os.getpid()}"
    epilog = f"{sys.executable} -m blackbox epilog -o {dest}"
    try:
        with slurm_cluster(task="none", gather="linux", gather_params="OverMemoryKill", epilog=epilog) as c:
            (c.folder / "jobs" / "grow.py").write_text(GROW)
            out = c.folder / "jobs" / "grow.out"
            job = c.sbatch(f"#!/bin/sh\nexec {sys.executable} {c.folder}/jobs/grow.py\n", "--mem=200M", "-o", str(out))
            c.wait(job, timeout=180)
            assert "exceeded memory limit" in out.read_text(), out.read_text()  # Slurm's own word
            meta = json.loads((dest / str(job) / c.host / "metadata.json").read_text())
            death = meta["death"]
            assert (death["cause"], death["confidence"]) == ("userspace_oom_kill", "strong"), death
            assert death["killed_by"]["sender"] == "slurmstepd", death
            assert any("200.0 MiB in Slurm's account" in e for e in death["evidence"]), death["evidence"]
    finally:
        shutil.rmtree(dest, ignore_errors=True)
