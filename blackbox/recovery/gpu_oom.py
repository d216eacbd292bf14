"""A GPU's out-of-memory, read (pure): true exhaustion or fragmentation of PyTorch's caching allocator, from the
figures of its message, or a failure outside that cache, which the CUDA runtime or a library reported with no
figure; the levers for each. PyTorch's CPU allocator's out-of-memory (host memory) is none."""

from __future__ import annotations

from typing import Any

from .._units import human_bytes
from ..collect.oom import is_device_oom_text, parse_oom

EXPANDABLE_ON = ("expandable_segments is already on: the cached bytes were pages inside the growing segment "
                 "that the request could not use; lower the peak (smaller micro-batch) or call "
                 "torch.cuda.empty_cache() between phases of different shapes")  # fmt: skip


# "CUDA error: out of memory", CUBLAS_STATUS_ALLOC_FAILED, NCCL's "Cuda failure 'out of memory'": the device had
# no room for what PyTorch's cache does not hold (the context, libraries' workspaces and buffers)
OUTSIDE_CACHE = {
    "kind": "outside_cache",
    "why": "a CUDA call outside PyTorch's caching allocator (the context, cuBLAS's or cuDNN's workspace, NCCL's "
           "buffers, a kernel launch) found no free device memory; the message gives no figures",
    "levers": [
        "leave room outside PyTorch's cache: lower the peak (smaller micro-batch with gradient accumulation) or "
        "cap the cache (torch.cuda.set_per_process_memory_fraction)",
        "make libraries' handles and communicators before the cache fills (a warm-up step; init_process_group and "
        "a first collective before the model's first forward), or torch.cuda.empty_cache() before the failing call",
        "check that no other process holds the device (nvidia-smi: a previous run's survivor)",
    ],
}  # fmt: skip


def gpu_oom_kind(oom: dict[str, Any]) -> dict[str, Any] | None:
    """True exhaustion or fragmentation, from the parsed OOM figures, with the levers for each; outside the
    cache (``outside_cache``) for a device's out-of-memory the CUDA runtime or a library reported, which gives
    no figure; None for PyTorch's CPU allocator (``DefaultCPUAllocator``: host memory, no device and no cache
    to fragment) and for any other memory."""
    req, unalloc, label = oom.get("oom_requested"), oom.get("oom_reserved_unallocated"), str(oom.get("label") or "")
    if req is None:
        return {**OUTSIDE_CACHE, "levers": list(OUTSIDE_CACHE["levers"])} if is_device_oom_text(label) else None
    if (parse_oom(label) or {}).get("backend") == "CPU":
        return None
    if unalloc is not None and unalloc >= req:
        return {
            "kind": "fragmentation",
            "why": f"{human_bytes(unalloc)} reserved but unallocated >= the {human_bytes(req)} request",
            "levers": [
                "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the cache had the bytes, not in one piece)"
            ],
        }
    return {
        "kind": "exhaustion",
        "why": f"the {human_bytes(req)} request exceeded what was free and cached",
        "levers": [
            "smaller micro-batch with gradient accumulation (same effective batch)",
            "activation checkpointing on the largest blocks",
            "shard more (FSDP / ZeRO stage up, tensor or pipeline parallel)",
        ],
    }
