"""Host memory probes: process RSS and the memory cgroup's usage and limit.

Files are opened once and re-read with ``pread`` at offset 0 (the kernel
regenerates them on every read), which is about 8x cheaper than reopening.
Any probe that cannot be read is left out: its gauge is recorded as -1 (null).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2**63 - 1


@dataclass(frozen=True)
class CgroupPaths:
    version: int  # 1 or 2
    directory: Path
    usage: Path
    limit: Path


def _read_text(path: str | Path) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def find_memory_cgroup(
    proc_cgroup: str = "/proc/self/cgroup", mountinfo: str = "/proc/self/mountinfo"
) -> CgroupPaths | None:
    """The memory cgroup this process is in, for cgroup v1 or v2, or None."""
    try:
        cgroup_lines = _read_text(proc_cgroup).splitlines()
        mounts = _read_text(mountinfo).splitlines()
    except OSError:
        return None
    v1_mount = v2_mount = None
    for line in mounts:
        left, _, right = line.partition(" - ")
        fields, rfields = left.split(), right.split()
        if len(fields) < 5 or len(rfields) < 3:
            continue
        fstype, options = rfields[0], rfields[2].split(",") + fields[5].split(",")
        if fstype == "cgroup" and "memory" in options and v1_mount is None:
            v1_mount = (fields[3], fields[4])
        elif fstype == "cgroup2" and v2_mount is None:
            v2_mount = (fields[3], fields[4])
    for line in cgroup_lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, rel = parts
        if v1_mount and "memory" in controllers.split(","):
            d = _resolve(v1_mount, rel)
            if d is not None:
                return CgroupPaths(1, d, d / "memory.usage_in_bytes", d / "memory.limit_in_bytes")
        if v2_mount and controllers == "" and v1_mount is None:
            d = _resolve(v2_mount, rel)
            if d is not None and (d / "memory.current").exists():
                return CgroupPaths(2, d, d / "memory.current", d / "memory.max")
    return None


def _resolve(mount: tuple[str, str], rel: str) -> Path | None:
    """Map a /proc/self/cgroup path to a directory under the mount (cgroup namespaces aware)."""
    root, point = mount
    rel_to_root = os.path.relpath(rel, root) if rel.startswith(root) else rel.lstrip("/")
    for candidate in (Path(point) / rel_to_root, Path(point) / rel.lstrip("/"), Path(point)):
        if candidate.is_dir():
            return candidate.resolve()
    return None


def effective_limit_file(cg: CgroupPaths) -> Path | None:
    """The limit file of the nearest cgroup (self or an ancestor) with the lowest limit."""
    best: tuple[int, Path] | None = None
    d = cg.directory
    name = cg.limit.name
    for _ in range(64):
        f = d / name
        if not f.exists():
            break
        value = parse_limit(_safe_read(f))
        if value is not None and (best is None or value < best[0]):
            best = (value, f)
        if d.parent == d:
            break
        d = d.parent
    return best[1] if best else None


def _safe_read(path: Path) -> str:
    try:
        return _read_text(path)
    except OSError:
        return ""


def parse_limit(text: str) -> int | None:
    """A limit in bytes, or None for "max" / unlimited / unreadable."""
    text = text.strip()
    if not text or text == "max":
        return None
    try:
        value = int(text)
    except ValueError:
        return None
    return None if value >= _UNLIMITED else value


class HostProbe:
    """Reads RSS, cgroup usage and cgroup limit through descriptors kept open."""

    def __init__(self) -> None:
        self.cgroup = find_memory_cgroup()
        self._statm = self._open("/proc/self/statm")
        self._usage = self._open(self.cgroup.usage) if self.cgroup else -1
        limit_file = effective_limit_file(self.cgroup) if self.cgroup else None
        self._limit = self._open(limit_file) if limit_file else -1

    @staticmethod
    def _open(path: str | Path) -> int:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return -1

    def read(self) -> tuple[int, int, int]:
        """(host_rss, cgroup_usage, cgroup_limit) in bytes, -1 where unknown."""
        rss = usage = limit = -1
        if self._statm >= 0:
            try:
                rss = int(os.pread(self._statm, 128, 0).split()[1]) * _PAGE
            except (OSError, ValueError, IndexError):
                rss = -1
        if self._usage >= 0:
            try:
                usage = int(os.pread(self._usage, 64, 0))
            except (OSError, ValueError):
                usage = -1
        if self._limit >= 0:
            try:
                parsed = parse_limit(os.pread(self._limit, 64, 0).decode())
                limit = -1 if parsed is None else parsed
            except (OSError, ValueError):
                limit = -1
        return rss, usage, limit

    def close(self) -> None:
        for fd in (self._statm, self._usage, self._limit):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._statm = self._usage = self._limit = -1
