"""The memory limit an out-of-memory death hit is named (RLIMIT_AS, the cgroup's, MemTotal, the device's), and
arming under an address-space limit (`ulimit -v`) takes little of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.collect.limits import SMALL_CAPACITY
from blackbox.recovery.limits import limit_hit

GIB = 1 << 30
LIMITS = {"address_space": None, "mem_total": 64 * GIB}
AS_LIMITED = {**LIMITS, "address_space": 2 * GIB}
CGROUP_LINE = "Memory cgroup out of memory: Killed process 7 (python) total-vm:1kB"
GLOBAL_LINE = "Out of memory: Killed process 7 (python) total-vm:1kB"
# a device's out-of-memory with no capacity in its message: never a host limit (RLIMIT_AS, cgroup, MemTotal)
CUDA_RUNTIME = "RuntimeError: CUDA error: out of memory"
PREEMPTIVE = "OutOfMemoryError: CUDA out of memory. Allocation was preemptively rejected. Requested size: 1.00 GiB"


@pytest.mark.parametrize(
    "cause,limits,sample,oom,line,name,size",
    [
        ("oom_exception", AS_LIMITED, {}, {"label": "MemoryError"}, None, "RLIMIT_AS", 2 * GIB),
        ("oom_exception", AS_LIMITED, {}, {"oom_capacity": 80 * GIB}, None, "device total", 80 * GIB),
        ("oom_exception", LIMITS, {"cgroup_limit": GIB, "cgroup_usage": GIB - 1}, {}, None, "cgroup", GIB),
        ("oom_exception", LIMITS, {"cgroup_limit": GIB, "cgroup_usage": GIB // 2}, {}, None, "MemTotal", 64 * GIB),
        ("host_oom_kill", LIMITS, {"cgroup_limit": GIB, "cgroup_usage": GIB // 2}, None, CGROUP_LINE, "cgroup", GIB),
        ("host_oom_kill", LIMITS, {}, None, GLOBAL_LINE, "MemTotal", 64 * GIB),
        ("host_oom_kill", LIMITS, {}, None, CGROUP_LINE, "cgroup", None),  # it read "a global OOM kill"
        ("oom_exception", AS_LIMITED, {}, {"label": CUDA_RUNTIME, "device_total": 80 * GIB}, None, "device total",
         80 * GIB),
        ("oom_exception", AS_LIMITED, {"cgroup_limit": GIB, "cgroup_usage": GIB}, {"label": CUDA_RUNTIME}, None,
         None, None),
        ("oom_exception", LIMITS, {}, {"label": PREEMPTIVE, "oom_requested": GIB}, None, None, None),
        ("exception", AS_LIMITED, {}, None, None, None, None),
        ("killed", LIMITS, {"cgroup_limit": GIB, "cgroup_usage": GIB}, None, None, None, None),
    ],
    ids=["address-space", "gpu", "cgroup-exception", "overcommit", "cgroup-kill", "global-kill",
         "cgroup-kill-joined-after-arming", "gpu-runtime-read",
         "gpu-runtime-unknown", "gpu-no-capacity", "not-oom", "sigkill"],
)
def test_the_limit_hit_is_the_one_the_evidence_names(cause, limits, sample, oom, line, name, size) -> None:  # type: ignore[no-untyped-def]
    hit = limit_hit(cause, limits, sample, oom, line)
    assert (hit["name"], hit["bytes"]) == (name, size) if name else hit is None, hit


STEP_MIB = 16
JOB = f"""\
import numpy
try:
    import blackbox
    step = blackbox.step
except ImportError:
    step = lambda n: None
kept = []
for n in range(100000):
    step(n)
    try:
        kept.append(numpy.ones({STEP_MIB} << 20 >> 3))  # {STEP_MIB} MiB a step, touched
    except MemoryError:
        print("MemoryError at step", n, flush=True)
        raise
"""


@pytest.mark.slow
def test_under_ulimit_v_the_memory_error_comes_near_where_it_does_unarmed_and_is_named(tmp_path: Path) -> None:
    # GIVEN a job that takes 16 MiB a step until it fails, under `ulimit -v` 1.5 GiB, unarmed and armed
    (tmp_path / "job.py").write_text(JOB)
    limit = 1_500_000  # KiB
    steps = {}
    for armed in (False, True):
        run = f"{sys.executable} -m blackbox run --quiet --dir {tmp_path / 'run'} -- " if armed else ""
        env = dict(os.environ, PYTHONPATH=str(REPO) if armed else "")
        proc = subprocess.run(["bash", "-c", f"ulimit -v {limit}; exec {run}{sys.executable} job.py"],
                              capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)  # fmt: skip
        assert proc.returncode == 1 and "MemoryError at step" in proc.stdout, proc.stderr[-2000:]
        steps[armed] = int(proc.stdout.split("MemoryError at step")[1].split()[0])
    # THEN armed, it comes at most one step (16 MiB) earlier: the ring and the sampler's stack are small, and the
    # sampler thread allocates from a heap of its own, not a glibc arena (arming took 112 MiB of address space,
    # 7 steps; then 74 MiB, 4 steps, with the arena; now about 12 MiB)
    assert 0 <= steps[False] - steps[True] <= 1, steps
    (run_folder,) = (tmp_path / "run").glob("run-*")
    meta = json.loads((run_folder / "bundle" / "metadata.json").read_text())
    assert meta["recovery"]["slots"] == SMALL_CAPACITY
    # AND the verdict names the limit hit: RLIMIT_AS, at its planted size, beside the free memory that did not help
    death = meta["death"]
    assert death["cause"] == "oom_exception" and death["step"] == steps[True], death
    assert (death["limit"]["name"], death["limit"]["bytes"]) == ("RLIMIT_AS", limit << 10), death["limit"]
    summary = (run_folder / "bundle" / "summary.md").read_text()
    assert "The limit it hit: the address-space limit (RLIMIT_AS, `ulimit -v`) of 1.4 GiB" in summary
