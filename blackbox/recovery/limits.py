"""Which memory limit an out-of-memory death hit (pure): ``death.limit``.

Memory runs out against one of four limits, and the figures beside the verdict
mean something only against the one that was hit (MemAvailable says nothing of
an address-space limit):

- ``RLIMIT_AS``: the process's address-space limit (``ulimit -v``), recorded at
  arm (the header's ``limits.address_space``): a host ``MemoryError`` under one
  is that limit, whatever memory was free;
- ``cgroup``: the memory cgroup's limit: the kernel's kill line says "Memory
  cgroup out of memory", or the usage was at the limit;
- ``MemTotal``: the host's memory (a global OOM kill, or an allocation the
  kernel's overcommit refused);
- ``device total``: the accelerator's memory, from a GPU OOM's own message or
  what the recorder read of the device at the OOM; none is named for a device's
  out-of-memory whose size neither gives (never a host limit).
"""

from __future__ import annotations

from typing import Any

from .._units import human_bytes
from ..collect.oom import on_device

NEAR = 0.95  # the cgroup's usage at this share of its limit or more: it was the limit


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def limit_hit(
    cause: str, limits: Any, last_sample: dict[str, Any] | None, oom: dict[str, Any] | None, kill_line: str | None
) -> dict[str, Any] | None:
    """``{"name", "bytes", "text"}`` of the limit an out-of-memory death hit, None for any other death or where
    none can be told. ``limits``: the ring header's; ``oom``: the uncaught OOM's record (its parsed figures);
    ``kill_line``: the kernel's OOM kill line, where it logged one."""
    sample = last_sample or {}
    limits = limits if isinstance(limits, dict) else {}
    cgroup = _int(sample.get("cgroup_limit"))
    usage = _int(sample.get("cgroup_usage"))
    at_cgroup = cgroup is not None and usage is not None and usage >= NEAR * cgroup
    if cause == "oom_exception" and oom is not None:
        device = _int(oom.get("oom_capacity")) or _int(oom.get("device_total"))
        if device is not None:
            return _limit("device total", device, "the device's total memory")
        if on_device(str(oom.get("label") or "")):
            return None  # a device's memory, its size not known: no host limit was it
        address = _int(limits.get("address_space"))
        if address is not None:
            return _limit("RLIMIT_AS", address, "the address-space limit (RLIMIT_AS, `ulimit -v`)",
                          "address space, not memory: every mapping, thread stack and malloc arena counts whole, "
                          "and free memory (MemAvailable) does not help")  # fmt: skip
        if at_cgroup and cgroup is not None:
            return _limit("cgroup", cgroup, "the memory cgroup's limit")
        total = _int(limits.get("mem_total"))
        refused = "the kernel refused the allocation"
        return _limit("MemTotal", total, "the host's memory (MemTotal)", refused) if total else None
    if cause == "host_oom_kill":
        in_cgroup = "Memory cgroup out of memory" in (kill_line or "")
        if cgroup is not None and (in_cgroup or at_cgroup):
            return _limit("cgroup", cgroup, "the memory cgroup's limit")
        if in_cgroup:  # the kernel says so, where the samples read no limit (it read "a global OOM kill")
            return {"name": "cgroup", "bytes": None, "text": "a memory cgroup's limit (the kernel's line says so), of "
                    "a size blackbox did not read: the process joined that cgroup after arming, or the limit is on "
                    "a cgroup it cannot see"}
        total = _int(limits.get("mem_total"))
        if kill_line and total is not None:
            return _limit("MemTotal", total, "the host's memory (MemTotal)", "a global OOM kill")
    return None


def _limit(name: str, size: int, what: str, why: str = "") -> dict[str, Any]:
    return {"name": name, "bytes": size, "text": f"{what} of {human_bytes(size)}" + (f": {why}" if why else "")}
