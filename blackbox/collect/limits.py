"""The memory limits a process runs under, read once at arm: the header metadata's ``limits``.

- ``address_space``: the soft ``RLIMIT_AS`` (``ulimit -v``) in bytes, None where
  unlimited. It counts address space, not memory: every mapping, each thread's
  stack and each malloc arena counts whole. Under it an allocation fails with
  ``MemoryError`` (ENOMEM) whatever memory is free, so the verdict names it.
- ``mem_total``: the host's ``MemTotal`` in bytes (``/proc/meminfo``).

Under an address-space limit, arming takes as little of it as it can
(``SMALL_CAPACITY`` slots of records, a ``SAMPLER_STACK`` stack for the sampler
thread), so that the job's own ``MemoryError`` comes where it would unarmed.
What remains is measured by ``tools/bench_address_space.py``.
"""

from __future__ import annotations

import resource

SMALL_CAPACITY = 1 << 13  # 8,192 slots (1 MiB of records) where the address space is limited
SAMPLER_STACK = 512 << 10  # the sampler thread's stack where the address space is limited (8 MiB by default)


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
