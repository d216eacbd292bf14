"""Accelerator memory through torch's own APIs, read only once the job has set the device up.

Nothing here imports torch or initialises a device: a probe looks for ``torch``
in ``sys.modules`` (the job imported it) and, per backend, for the job having
initialised it (``torch.cuda.is_initialized()`` and the like). Calling
``mem_get_info`` on a device would create a CUDA context there, so it is only
called for devices where the caching allocator already holds memory.

Each backend is feature-detected: a CPU-only build answers these calls with
AttributeError, AssertionError, RuntimeError or KeyError, so any exception
turns that backend off for this probe (never into the job).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

NULL = -1
GpuReading = tuple[int, tuple[int, ...]]  # (device index, the 9 gpu_sample payload words)
MAX_DEVICES = 64
MAX_DUTY = 0.005  # polling takes at most 0.5% of the sampler thread's CPU: a slow backend is polled less often
MAX_WAIT_S = 5.0  # ...but never less often than this: one slow poll (a driver's first call) is not the rule


def loaded_torch() -> Any:
    """The job's torch module once it is fully imported, else None (never imports it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    spec = getattr(torch, "__spec__", None)
    if getattr(spec, "_initializing", False) or not hasattr(torch, "cuda"):
        return None  # still being imported by the job
    return torch


def _get(d: Any, *keys: str) -> int:
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return NULL
        d = d[k]
    return int(d) if isinstance(d, int) else NULL


def cuda_payload(stats: dict[str, Any], free: int, total: int) -> tuple[int, ...]:
    """gpu_sample words from the nested dict of ``torch._C._cuda_memoryStats(device)``."""
    return (
        _get(stats, "allocated_bytes", "all", "current"),
        _get(stats, "reserved_bytes", "all", "current"),
        _get(stats, "active_bytes", "all", "current"),
        _get(stats, "inactive_split_bytes", "all", "current"),
        free,
        total,
        _get(stats, "num_alloc_retries"),
        _get(stats, "num_ooms"),
        _get(stats, "allocated_bytes", "all", "peak"),
    )


def flat_payload(stats: dict[str, Any], free: int, total: int) -> tuple[int, ...]:
    """gpu_sample words from a flattened ``memory_stats()`` dict (XPU, torch.accelerator)."""

    def g(key: str) -> int:
        v = stats.get(key)
        return int(v) if isinstance(v, int) else NULL

    return (
        g("allocated_bytes.all.current"),
        g("reserved_bytes.all.current"),
        g("active_bytes.all.current"),
        g("inactive_split_bytes.all.current"),
        free,
        total,
        g("num_alloc_retries"),
        g("num_ooms"),
        g("allocated_bytes.all.peak"),
    )


class GpuProbe:
    """Polls the job's accelerators; ``poll()`` returns a reading per device in use."""

    def __init__(self) -> None:
        self._off: set[str] = set()  # backends that failed: not asked again
        self._next = 0.0
        self.last_cost_s = 0.0

    def poll(self) -> list[GpuReading]:
        """Readings of every device in use; [] before the job has set one up, or while throttled.

        The cost is this thread's CPU time, not the wall time: on a training host the poll waits for the
        GIL behind the job's own thread, and that wait costs the job nothing (counted as cost, it kept a
        GPU unpolled for minutes)."""
        now = time.monotonic()
        if now < self._next:
            return []
        cpu = time.thread_time()
        readings = self._poll()
        self.last_cost_s = time.thread_time() - cpu
        self._next = now + min(self.last_cost_s / MAX_DUTY, MAX_WAIT_S)
        return readings

    def _poll(self) -> list[GpuReading]:
        torch = loaded_torch()
        if torch is None:
            return []
        for name, reader in self._readers():
            if name in self._off:
                continue
            try:
                readings = reader(torch)
            except Exception:  # the CPU build's assorted errors: this backend is off
                self._off.add(name)
                continue
            if readings is not None:
                return readings
        return []

    def _readers(self) -> list[tuple[str, Callable[[Any], list[GpuReading] | None]]]:
        return [("cuda", _cuda), ("xpu", _xpu), ("mps", _mps), ("accelerator", _accelerator)]


def _cuda(torch: Any) -> list[GpuReading] | None:
    cuda = torch.cuda
    if not cuda.is_initialized():
        return None
    out = []
    current = cuda.current_device()
    for d in range(min(cuda.device_count(), MAX_DEVICES)):
        stats = torch._C._cuda_memoryStats(d)
        reserved = _get(stats, "reserved_bytes", "all", "current")
        if d != current and reserved <= 0:
            continue  # never touched by this process: no context there, do not make one
        free = total = NULL
        if reserved > 0:
            free, total = (int(x) for x in cuda.mem_get_info(d))
        out.append((d, cuda_payload(stats, free, total)))
    return out


def _xpu(torch: Any) -> list[GpuReading] | None:
    xpu = getattr(torch, "xpu", None)
    if xpu is None or not xpu.is_initialized():
        return None
    out = []
    for d in range(min(xpu.device_count(), MAX_DEVICES)):
        stats = xpu.memory_stats(d)
        if not stats.get("reserved_bytes.all.current"):
            continue
        free, total = (int(x) for x in xpu.mem_get_info(d))
        out.append((d, flat_payload(stats, free, total)))
    return out


def _mps(torch: Any) -> list[GpuReading] | None:
    mps_backend = getattr(getattr(torch, "backends", None), "mps", None)
    if mps_backend is None or not mps_backend.is_available():
        return None
    mps = torch.mps
    allocated = int(mps.current_allocated_memory())
    reserved = int(mps.driver_allocated_memory())
    if reserved <= 0:
        return None  # the job has not used the device yet
    total = int(mps.recommended_max_memory()) if hasattr(mps, "recommended_max_memory") else NULL
    return [(0, (allocated, reserved, NULL, NULL, NULL, total, NULL, NULL, NULL))]


def _accelerator(torch: Any) -> list[GpuReading] | None:
    """Another backend through ``torch.accelerator`` (2.9 and newer), once its allocator is initialised.
    Never for a CUDA or ROCm build (``_cuda`` reads those): there ``is_available()`` counts devices through
    the driver, initialising it in the job's process (a second on a large GPU) before the job did."""
    version = getattr(torch, "version", None)
    if getattr(version, "cuda", None) or getattr(version, "hip", None):
        return None
    acc = getattr(torch, "accelerator", None)
    initialised = getattr(torch._C, "_accelerator_isAllocatorInitialized", None)
    if acc is None or initialised is None or not initialised() or not acc.is_available():
        return None
    kind = acc.current_accelerator()
    if kind is None or getattr(kind, "type", None) in ("cuda", "xpu", "mps"):
        return None
    d = acc.current_device_index()
    stats = acc.memory_stats(d)
    free = total = NULL
    if hasattr(acc, "get_memory_info"):
        free, total = (int(x) for x in acc.get_memory_info(d))
    return [(d, flat_payload(stats, free, total))]
