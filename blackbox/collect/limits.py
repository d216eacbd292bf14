"""The limits a process runs under (one place for "the job's limits"): read once at arm for the header
metadata's ``limits``, and each sample for the alerts (``collect.alerts``), with how much of each is in use.

- ``address_space``: the soft ``RLIMIT_AS`` (``ulimit -v``) in bytes, None where
  unlimited. It counts address space, not memory: every mapping, each thread's
  stack and each malloc arena counts whole. Under it an allocation fails with
  ``MemoryError`` (ENOMEM) whatever memory is free, so the verdict names it. In
  use: the process's ``VmSize``.
- ``mem_total``: the host's ``MemTotal`` in bytes (``/proc/meminfo``). In use:
  ``MemTotal - MemAvailable``, every process's, not the job's alone: the kernel's
  OOM killer acts when the host runs out, whoever filled it.
- the memory cgroup's limit: the lowest of its cgroup and the cgroups above it
  (``HostProbe`` finds the file; a sample's ``cgroup_limit``). In use: that
  cgroup's usage less its page cache (``host.file_cache``, shared memory aside),
  which the kernel writes back and reclaims before it kills: a job that reads a
  dataset through the page cache sits at its limit without being in danger.
- each accelerator's memory: ``device_total`` against ``device_total -
  device_free`` (every process's on the device, the CUDA context included), else
  what the caching allocator reserved.

Under an address-space limit, arming takes as little of it as it can
(``SMALL_CAPACITY`` slots of records, a ``SAMPLER_STACK`` stack for the sampler
thread, whose allocations come from a small heap of its own rather than a glibc
arena of 64 MiB: ``collect/_own_heap.h``), so that the job's own
``MemoryError`` comes where it would unarmed. What remains (about 12 MiB) is
measured by ``tools/bench_address_space.py``.
"""

from __future__ import annotations

import resource
from typing import Any

from ..ring import format as fmt

SMALL_CAPACITY = 1 << 13  # 8,192 slots (1 MiB of records) where the address space is limited
SAMPLER_STACK = 512 << 10  # the sampler thread's stack where the address space is limited (8 MiB by default)
CGROUP, HOST, RLIMIT_AS, GPU = (next(c for c, n in fmt.LIMIT_KINDS.items() if n == name)
                                for name in ("cgroup", "host", "rlimit_as", "gpu"))  # fmt: skip
Use = tuple[int, int, int]  # (limit kind, bytes in use, the limit in bytes)


def address_space() -> int | None:
    """The soft RLIMIT_AS in bytes, None where there is none."""
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    except (OSError, ValueError, AttributeError):
        return None
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def mem_total() -> int | None:
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f.read(8192).decode("ascii", "replace").splitlines():
                key, _, value = line.partition(":")
                if key == "MemTotal":
                    return int(value.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def limits() -> dict[str, int | None]:
    """The header metadata's ``limits`` object."""
    return {"address_space": address_space(), "mem_total": mem_total()}


def host_uses(probe: Any, figures: tuple[int, ...], address_limit: int | None) -> list[Use]:
    """Each host limit the process has, with its use, from a ``HostProbe`` just read (``figures``: its
    ``read()``; ``address_limit``: ``address_space()``)."""
    out: list[Use] = []
    limit = figures[2]
    if limit > 0:
        usage = probe.owner_usage if probe.owner_usage >= 0 else figures[1]
        if usage >= 0:
            out.append((CGROUP, max(0, usage - max(probe.file_cache, 0)), limit))
    if probe.mem_total > 0 and figures[4] >= 0:
        out.append((HOST, max(0, probe.mem_total - figures[4]), probe.mem_total))
    if address_limit and probe.vm_size >= 0:
        out.append((RLIMIT_AS, probe.vm_size, address_limit))
    return out


def gpu_use(payload: tuple[int, ...]) -> Use | None:
    """A device's use against its total from one ``gpu_sample`` payload; None where its total is not known."""
    reserved, free, total = payload[1], payload[4], payload[5]
    if total <= 0:
        return None
    used = total - free if free >= 0 else reserved
    return (GPU, used, total) if used >= 0 else None


def binding(uses: list[Use]) -> Use | None:
    """The limit that will be reached first at equal growth: the one with the least headroom."""
    return min(uses, key=lambda u: u[2] - u[1], default=None)
