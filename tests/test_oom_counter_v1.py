"""Under cgroup v1 the kernel counts an OOM kill in the victim's own cgroup, not where the limit sits.

Slurm's ``task/cgroup`` puts a job in ``job_J/step_S/task_T`` with the limit on
``job_J`` and ``step_S``; the kill is counted in ``task_T``'s
``memory.oom_control`` alone. Done for real: a limited cgroup with an unlimited
child (the task), an armed job in the child whose forked worker outgrows the
limit. The kernel's own counters are the planted truth (1 in the task, 0 where
the limit is); the ring's samples must see the count rise, where reading the
limit's cgroup saw nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import MemoryCgroup, run_py

from blackbox._postmortem import write_postmortem

pytestmark = pytest.mark.slow

JOB = """
import os, sys, time
import blackbox
rec = blackbox.arm(sys.argv[1], sample_interval=0.05)
time.sleep(0.3)
pid = os.fork()
if pid == 0:
    chunks = []
    while True:
        chunks.append(bytearray(os.urandom(1 << 20) * 8))
_, status = os.waitpid(pid, 0)
time.sleep(0.5)
print(os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1)
"""


def test_v1_oom_kill_is_read_in_the_task_cgroup(tmp_path: Path, memory_cgroup) -> None:
    limited: MemoryCgroup = memory_cgroup(160 << 20)
    if limited.version != 1:
        pytest.skip("cgroup v2 counts a kill in every ancestor (memory.events): nothing to read elsewhere")
    task = limited.directory / "task_0"
    task.mkdir()
    try:
        out = run_py(JOB, str(tmp_path / "rings") + "/",
                     preexec_fn=lambda: (task / "cgroup.procs").write_text("0"))  # fmt: skip
        assert out.stdout.strip() == "9", out.stdout + out.stderr  # the worker was SIGKILLed
        counts = [MemoryCgroup(d, 1).oom_kills() for d in (task, limited.directory)]
        assert counts == [1, 0], f"the kernel's counters (task, limit) are {counts}"
        write_postmortem([tmp_path / "rings"], tmp_path / "bundle", plot=False)
        samples = pq.read_table(tmp_path / "bundle" / "timeline.parquet").to_pandas()
        kills = samples.loc[samples["kind"] == "sample", "cgroup_oom_kills"].dropna().astype(int).tolist()
        assert kills and kills[0] == 0 and kills[-1] == 1, f"oom_kill in the samples: {kills}"
    finally:
        for _ in range(50):
            try:
                task.rmdir()
                break
            except OSError:
                time.sleep(0.1)
