"""Under cgroup v1 the kernel counts an OOM kill in the victim's own cgroup, not where the limit sits.

Slurm's ``task/cgroup`` puts a job in ``job_J/step_S/task_T`` with the limit on
``job_J`` and ``step_S``; the kill is counted in ``task_T``'s
``memory.oom_control`` alone. Done for real: a limited cgroup with an unlimited
child (the task), an armed job in the child whose forked worker outgrows the
limit. The kernel's own counters are the planted truth (1 in the task, 0 where
the limit is); the ring's samples must see the count rise, where reading the
limit's cgroup saw nothing.

And a rise of the counter after a ring's last sample is not its own kill where
the kernel log names another process of the cgroup killed since.
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


KILLED_ITSELF = """
import os, signal, sys, time
import blackbox
blackbox.arm(sys.argv[1], sample_interval=0.05)
time.sleep(0.5)
os.kill(os.getpid(), signal.SIGKILL)
"""
LEAKS = "kept = []\nwhile True:\n    kept.append(bytearray(8 << 20))\n"


def test_a_sigkill_stays_one_when_another_process_of_its_cgroup_is_oom_killed_before_recovery(
    tmp_path: Path, memory_cgroup
) -> None:
    from blackbox.recovery.pipeline import recover_rings

    cg: MemoryCgroup = memory_cgroup(160 << 20)
    # GIVEN an armed process SIGKILLed (by itself) in a memory cgroup, then another, unarmed, OOM-killed there
    # before the first one's rings are recovered (a notebook's kernels, a job's tools, in one cgroup)
    rings = tmp_path / "rings"
    killed = run_py(KILLED_ITSELF, f"{rings}/", check=False, preexec_fn=cg.join)
    assert killed.returncode == -9, killed.stderr
    before = cg.oom_kills()
    leaked = run_py(LEAKS, check=False, preexec_fn=cg.join)
    assert leaked.returncode == -9 and cg.oom_kills() == before + 1, leaked.stderr
    # WHEN its rings are recovered
    death = recover_rings([rings]).meta["death"]
    # THEN it was killed with SIGKILL, not by the OOM killer (its cgroup's counter rose for the other one, the
    # kernel log says so); the other's kill is said as what the counter counted
    assert death["cause"] == "killed", death  # (it read host_oom_kill: "oom_kill counter rose from 0 to 1")
    assert any("the kernel OOM-killed another process of its memory cgroup after its last record" in e
               for e in death["evidence"]), death["evidence"]  # fmt: skip
