"""A stand-in ``torch`` for driving the GPU code paths in CI (no GPU, no torch needed).

Installed into ``sys.modules`` by a child process before it arms blackbox. It
answers the calls blackbox makes, like a CUDA build would, and logs them so a
test can check what was (and was not) called before the job "initialised CUDA".
"""

from __future__ import annotations

import pickle
import sys
import types
from typing import Any

GiB = 1 << 30
calls: list[tuple[str, Any]] = []
state: dict[str, Any] = {"initialised": False, "allocated": 3 * GiB, "trace": [], "observers": []}


def _stats(device: int) -> dict[str, Any]:
    calls.append(("memoryStats", device))
    if device != 0:
        return {"allocated_bytes": {"all": {"current": 0, "peak": 0}}, "reserved_bytes": {"all": {"current": 0}}}
    a = state["allocated"]
    return {
        "allocated_bytes": {"all": {"current": a, "peak": a + GiB}},
        "reserved_bytes": {"all": {"current": a + 2 * GiB}},
        "active_bytes": {"all": {"current": a + 1}},
        "inactive_split_bytes": {"all": {"current": 5 << 20}},
        "num_alloc_retries": 2,
        "num_ooms": 1,
    }


def _mem_get_info(device: int) -> tuple[int, int]:
    calls.append(("mem_get_info", device))
    return 10 * GiB, 80 * GiB


def _record_memory_history(**kwargs: Any) -> None:
    calls.append(("record_memory_history", kwargs))


def _snapshot() -> dict[str, Any]:
    calls.append(("snapshot", None))
    return {"segments": [], "device_traces": [list(state["trace"]), []]}


def _dump_snapshot(path: str) -> None:
    calls.append(("dump_snapshot", path))
    with open(path, "wb") as f:
        pickle.dump(_snapshot(), f)


def add_trace(action: str, addr: int, size: int, time_us: int, frames: list[dict[str, Any]] | None = None) -> None:
    """One allocator history entry; ``frames`` (innermost first) as ``stacks="python"`` records them."""
    entry = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": time_us}
    if frames is not None:
        entry["frames"] = frames
    state["trace"].append(entry)
    del state["trace"][:-8]  # PyTorch's history is a bounded ring too


def install() -> types.ModuleType:
    torch = types.ModuleType("torch")
    torch.__spec__ = None  # type: ignore[assignment]
    cuda = types.ModuleType("torch.cuda")
    cuda.is_initialized = lambda: state["initialised"]  # type: ignore[attr-defined]
    cuda.current_device = lambda: 0  # type: ignore[attr-defined]
    cuda.device_count = lambda: 2  # type: ignore[attr-defined]
    cuda.mem_get_info = _mem_get_info  # type: ignore[attr-defined]
    cuda.get_allocator_backend = lambda: "native"  # type: ignore[attr-defined]
    cuda.memory = types.SimpleNamespace(  # type: ignore[attr-defined]
        _record_memory_history=_record_memory_history, _snapshot=_snapshot, _dump_snapshot=_dump_snapshot
    )
    torch.cuda = cuda  # type: ignore[attr-defined]
    torch.version = types.SimpleNamespace(hip=None, cuda="13.0")  # type: ignore[attr-defined]

    def attach(cb: Any) -> None:
        calls.append(("attach_observer", None))
        state["observers"].append(cb)

    torch._C = types.SimpleNamespace(  # type: ignore[attr-defined]
        _cuda_memoryStats=_stats, _cuda_attach_out_of_memory_observer=attach
    )
    torch.autograd = types.SimpleNamespace(backward=lambda *a, **k: None)  # type: ignore[attr-defined]
    optimizer = types.ModuleType("torch.optim.optimizer")
    handle = types.SimpleNamespace(remove=lambda: None)
    optimizer.register_optimizer_step_pre_hook = lambda fn: handle  # type: ignore[attr-defined]
    optimizer.register_optimizer_step_post_hook = lambda fn: handle  # type: ignore[attr-defined]
    optim = types.ModuleType("torch.optim")
    optim.optimizer = optimizer  # type: ignore[attr-defined]
    torch.optim = optim  # type: ignore[attr-defined]
    sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.optim": optim, "torch.optim.optimizer": optimizer})
    return torch
