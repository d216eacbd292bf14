"""The allocation sites' lever (blackbox.recovery.alloc_levers): whose sites they are decides where it goes."""

from __future__ import annotations

from typing import Any

from blackbox.recovery.alloc_levers import with_site_lever

SITE = {"site": "load (/job/train.py:24)", "line": "cache.append(x)", "live_bytes": 64 << 20, "thread": "MainThread"}
ALLOCATIONS: dict[str, Any] = {"recorded": True, "sites": [SITE], "grew": []}
WORKER_LEVER = "the worker grew 1.0 MiB per step: the Dataset keeps what __getitem__ makes"


def _death(victim_pid: int) -> dict[str, Any]:
    return {"cause": "host_oom_kill", "victim": {"pid": victim_pid, "role": "DataLoader worker"},
            "levers": [WORKER_LEVER]}  # fmt: skip


def test_a_process_killed_itself_gets_its_sites_lever_first() -> None:
    death = with_site_lever(_death(100), ALLOCATIONS, None, None, pid=100)
    assert "/job/train.py:24" in death["levers"][0] and death["levers"][1] == WORKER_LEVER
    assert death["memory_pattern"] == "held"


def test_another_process_killed_keeps_its_own_levers_first_and_this_ones_site_last() -> None:
    # GIVEN the main process's ring (pid 100) whose DataLoader worker (pid 200) the kernel killed
    death = with_site_lever(_death(200), ALLOCATIONS, None, None, pid=100)
    # THEN the worker's levers come first; the main process's site comes last, said to be another process's
    assert death["levers"][0] == WORKER_LEVER
    assert death["levers"][-1].startswith("in this process (pid 100, not the one killed): ")
    assert "/job/train.py:24" in death["levers"][-1] and "memory_pattern" not in death


HOST_SITE = {**SITE, "domains": ["python"]}
GPU_SITE = {"site": "forward (/job/model.py:51)", "line": "acts.append(h)", "live_bytes": 2 << 30,
            "thread": "MainThread", "domains": ["gpu"]}  # fmt: skip
GPU_OOM = {"cause": "oom_exception", "victim": {"pid": 100}, "gpu_oom": {"kind": "fragmentation"},
           "levers": ["expandable_segments is already on: ..."]}  # fmt: skip


def test_a_cuda_out_of_memory_never_gets_a_host_sites_lever() -> None:
    # GIVEN a CUDA out-of-memory where the only sampled site is a host allocation (the host sampler's one
    # block on the job's line, larger than any GPU block)
    host_only = {"recorded": True, "sites": [HOST_SITE], "grew": []}
    death = with_site_lever(GPU_OOM, host_only, None, None, pid=100)
    # THEN the device's own levers stay as they were: host memory did not run the device out
    assert death["levers"] == GPU_OOM["levers"] and "memory_pattern" not in death


def test_a_cuda_out_of_memory_gets_the_gpu_sites_lever_even_below_a_larger_host_site() -> None:
    both = {"recorded": True, "sites": [{**HOST_SITE, "live_bytes": 8 << 30}, GPU_SITE], "grew": []}
    exhausted = {**GPU_OOM, "gpu_oom": {"kind": "exhaustion"}, "levers": ["activation checkpointing"]}
    death = with_site_lever(exhausted, both, None, None, pid=100)
    assert "/job/model.py:51" in death["levers"][0] and death["levers"][1:] == exhausted["levers"]
    # AND a host out-of-memory with the same sites names the host's site, not the GPU's
    host = with_site_lever(_death(100), both, None, None, pid=100)
    assert "/job/train.py:24" in host["levers"][0]


def test_a_fragmented_gpu_cache_keeps_its_own_lever_first_and_the_gpu_site_second() -> None:
    gpu_only = {"recorded": True, "sites": [GPU_SITE], "grew": []}
    death = with_site_lever(GPU_OOM, gpu_only, None, None, pid=100)
    assert death["levers"][0] == GPU_OOM["levers"][0] and "/job/model.py:51" in death["levers"][1]
