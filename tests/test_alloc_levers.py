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
