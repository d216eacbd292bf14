"""Host memory probes: process and children RSS, the memory cgroup's usage, limit
and oom_kill counter, MemAvailable, and memory pressure (PSI).

Files are opened once and re-read with ``pread`` at offset 0 (the kernel
regenerates them on every read), which is about 8x cheaper than reopening.
Any probe that cannot be read is left out: its gauge is recorded as -1 (null).
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._fds import OwnedFd

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _holding_the_gil() -> tuple[Callable[[int, int, int], bytes], Callable[[str, int], int], Callable[[int], None]]:
    """pread, open and close (2) called with the GIL held (ctypes.PyDLL), or os's where libc cannot be had so.
    A read of a /proc or cgroup file takes microseconds; os's calls release the GIL around it, and a job's
    thread busy in Python then keeps it for the switch interval (5 ms) before the sampler thread gets it
    back: with ~20 such calls a tick, a tick took 32-37 ms of wall time instead of 0.5 (docs/performance.md)."""
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        c_pread, c_open, c_close = libc.pread, libc.open, libc.close
    except (OSError, AttributeError):
        return os.pread, os.open, os.close
    c_pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
    c_pread.restype = ctypes.c_ssize_t
    c_open.argtypes, c_open.restype = [ctypes.c_char_p, ctypes.c_int], ctypes.c_int
    c_close.argtypes, c_close.restype = [ctypes.c_int], ctypes.c_int

    def failed(name: str) -> OSError:
        err = ctypes.get_errno()
        return OSError(err, f"{name}: {os.strerror(err)}")

    def pread(fd: int, size: int, offset: int) -> bytes:
        buf = ctypes.create_string_buffer(size)
        n = c_pread(fd, buf, size, offset)
        if n < 0:
            raise failed("pread")
        return buf.raw[:n]

    def open_(path: str, flags: int) -> int:
        fd = c_open(os.fsencode(path), flags)
        if fd < 0:
            raise failed("open")
        return int(fd)

    def close(fd: int) -> None:
        c_close(fd)  # (Linux frees the number whatever close returns)

    return pread, open_, close


PREAD, _OPEN, _CLOSE = _holding_the_gil()  # (tools/bench_tick_gil.py compares them with os's)

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


def oom_counter_file(cg: CgroupPaths, limit_file: Path | None) -> Path:
    """Where the kernel counts OOM kills of this process and its children. cgroup v2 counts a kill in
    the victim's cgroup and every ancestor (``memory.events``): read it where the effective limit is.
    cgroup v1 counts it in the victim's own cgroup alone (``memory.oom_control``), not where the limit
    sits: under Slurm the limit is on ``job_J`` and ``step_S``, the kill counted in ``task_T``, ours."""
    if cg.version == 1:
        return cg.directory / "memory.oom_control"
    owner = limit_file.parent if limit_file else cg.directory
    return owner / "memory.events"


def oom_kill_count(text: str) -> int | None:
    """The ``oom_kill`` line of cgroup v2 ``memory.events`` or v1 ``memory.oom_control``."""
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def psi_totals(text: str) -> tuple[int, int]:
    """(some total, full total) stall microseconds from a PSI file; -1 where missing."""
    some = full = -1
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for field in rest.split():
            if field.startswith("total="):
                try:
                    value = int(field[6:])
                except ValueError:
                    continue
                if kind == "some":
                    some = value
                elif kind == "full":
                    full = value
    return some, full


MEMORY_STAT_KEYS = {  # the cgroup_sample words, by cgroup version (v1: the hierarchical totals)
    2: ("anon", "file", "shmem", "file_dirty", "file_writeback", "pgmajfault"),
    1: ("total_rss", "total_cache", "total_shmem", "total_dirty", "total_writeback", "total_pgmajfault"),
}
MAX_CHILDREN = 64  # child_sample records per tick at most
# A child still bearing this process's name when first seen (between its fork and its rename: a spawned
# DataLoader worker's interpreter starts before it names itself ``pt_data_worker``) has its name read again
# each tick for this long, until it differs: read once, it kept the name it had before its rename for good.
RENAME_WINDOW_NS = 5 * 10**9
FULL_SCAN_NS = 10**9  # every thread's children list read once a second; the main thread's every tick


def parse_memory_stat(text: str, version: int) -> tuple[int, ...]:
    """The cgroup_sample payload from memory.stat: anon, file (page cache), shmem, file_dirty,
    file_writeback (bytes), pgmajfault (count); -1 where a line is missing."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            values[key] = int(value)
    return tuple(values.get(k, -1) for k in MEMORY_STAT_KEYS.get(version, ()))


def file_cache(stat: tuple[int, ...]) -> int:
    """The page cache the kernel reclaims before it kills, from a ``parse_memory_stat`` tuple: the file cache
    less shared memory (tmpfs, /dev/shm: not reclaimable without swap); -1 where a figure is missing. Dirty
    pages count as reclaimable (written back first): the ring itself is 36 MiB of them once made, written
    back and dropped as the cgroup nears its limit. A cgroup's usage less this is what its limit really
    holds, and it is stable where a working set (usage less inactive_file) is not: a reader of the ring
    (``blackbox watch``) moves its pages to the active list, and the working set jumps by tens of MiB."""
    if len(stat) < 3 or min(stat[1:3]) < 0:
        return -1
    return max(0, stat[1] - stat[2])


def _statm(data: bytes | None) -> tuple[int, int]:
    """(resident, size) in bytes from /proc/self/statm; -1 where it cannot be read."""
    try:
        fields = data.split() if data else []
        return int(fields[1]) * _PAGE, int(fields[0]) * _PAGE
    except (ValueError, IndexError):
        return -1, -1


def _anon(data: bytes | None) -> int:
    """Anonymous resident bytes from /proc/self/statm: resident less shared (the file and shared-memory
    pages); -1 where it cannot be read."""
    try:
        fields = data.split() if data else []
        return (int(fields[1]) - int(fields[2])) * _PAGE
    except (ValueError, IndexError):
        return -1


def meminfo_available(text: str, key: str = "MemAvailable:") -> int | None:
    """MemAvailable (or another ``key``: ``MemTotal:``) from /proc/meminfo, in bytes."""
    for line in text.splitlines():
        if line.startswith(key):
            parts = line.split()
            try:
                return int(parts[1]) * 1024
            except (IndexError, ValueError):
                return None
    return None


class Source:
    """One /proc or cgroup file read again and again through a descriptor of ours (see ``_fds``), with the
    GIL held (``PREAD``), or released where ``slow``: a file whose read may take milliseconds (memory.stat
    flushes the cgroup's per-CPU statistics first), which a job's thread should not wait for."""

    __slots__ = ("fd", "path", "pread")

    def __init__(self, path: str | Path | None, *, slow: bool = False) -> None:
        self.path = path
        self.fd = OwnedFd.open(path) if path is not None else None
        self.pread = os.pread if slow else PREAD

    def read(self, size: int = 4096, *, check: bool = True) -> bytes | None:
        """The file's current text (the kernel regenerates it on every read); None if unreadable.
        ``check``: first make sure the number still refers to our file (reopen it if the job closed it)."""
        fd = self.fd
        if fd is None:
            return None
        if check and not fd.intact():
            fd = self.fd = OwnedFd.open(self.path) if self.path is not None else None
            if fd is None:
                return None
        try:
            return self.pread(fd.fd, size, 0)
        except OSError:
            return None

    def text(self, size: int = 4096) -> str | None:
        data = self.read(size)
        return None if data is None else data.decode("ascii", "replace")

    def close(self) -> None:
        if self.fd is not None:
            self.fd.close()
            self.fd = None


class HostProbe:
    """Reads the host figures of a ``sample`` through descriptors kept open.

    ``read()`` returns the version-4 ``sample`` payload: host_rss,
    cgroup_usage, cgroup_limit, children_rss, mem_available, cgroup_oom_kills,
    psi_some_us, psi_full_us, host_anon (-1 where unknown).
    """

    def __init__(self, proc: str = "/proc") -> None:
        self.proc = proc
        from .allocs import sample_module  # (here: allocs imports this module)

        # the C extension's list_dir where built: getdents into a buffer on the stack, where opendir's malloc
        # would give the sampler thread a glibc arena of 64 MiB of address space under `ulimit -v` (_own_heap.h)
        cmod = sample_module()
        self._list_dir: Callable[[str], list[str]] = os.listdir if cmod is None else cmod.list_dir
        self.cgroup = find_memory_cgroup()
        limit_file = effective_limit_file(self.cgroup) if self.cgroup else None
        self._statm = Source(f"{proc}/self/statm")
        self._usage = Source(self.cgroup.usage if self.cgroup else None)
        self._limit = Source(limit_file)
        self._meminfo = Source(f"{proc}/meminfo")
        # where the kernel counts the OOM kills of our processes (see oom_counter_file)
        self._events = Source(oom_counter_file(self.cgroup, limit_file) if self.cgroup else None)
        psi = self.cgroup.directory / "memory.pressure" if self.cgroup and self.cgroup.version == 2 else None
        self._psi = Source(psi)
        if self._psi.fd is None:
            self._psi = Source(f"{proc}/pressure/memory")
        owner = limit_file.parent if limit_file else (self.cgroup.directory if self.cgroup else None)
        self._stat = Source(owner / "memory.stat" if owner else None, slow=True)
        # where the limit is, its usage (the alerts' figure: usage there less its page cache); ours otherwise
        self._owner_usage = Source(owner / self.cgroup.usage.name) if owner and self.cgroup and owner != \
            self.cgroup.directory else None  # fmt: skip
        # Figures the alerts read (collect/alerts.py), not records: -1 where unknown.
        self.vm_size = self.mem_total = self.owner_usage = self.file_cache = -1
        self._children: dict[int, Source] = {}  # child pid -> its statm
        self._comms: dict[int, str] = {}
        self._renaming: dict[int, int] = {}  # child pid -> until when (monotonic ns) its name is read again
        self._parents: set[str] = set()  # the threads whose children lists each tick reads (see _child_pids)
        self._next_scan = 0  # when every thread's list is read again (monotonic ns)
        self._own = _comm(f"{proc}/self/comm")
        self.last_children: list[tuple[int, int, str]] = []  # (pid, rss, command name) at the last read()
        self._closed = False

    def rss(self) -> int:
        """This process's resident set size in bytes (-1 if unknown); one pread, no identity check
        (it runs at every module call with ``modules=True``; each sample checks the descriptor)."""
        data = self._statm.read(128, check=False)
        try:
            return int(data.split()[1]) * _PAGE if data else -1
        except (ValueError, IndexError):
            return -1

    def read(self) -> tuple[int, int, int, int, int, int, int, int, int]:
        usage = limit = mem_available = oom_kills = -1
        data = self._statm.read(128)  # with the identity check that rss() leaves out
        (rss, self.vm_size), anon = _statm(data), _anon(data)
        if (text := self._usage.text(64)) is not None:
            try:
                usage = int(text)
            except ValueError:
                usage = -1
        self.owner_usage = usage
        if self._owner_usage is not None and (text := self._owner_usage.text(64)) is not None:
            self.owner_usage = int(text) if text.strip().isdigit() else -1
        if (text := self._limit.text(64)) is not None:
            parsed = parse_limit(text)
            limit = -1 if parsed is None else parsed
        if (text := self._meminfo.text()) is not None:
            mem_available = meminfo_available(text) or -1
            if self.mem_total < 0:
                self.mem_total = meminfo_available(text, "MemTotal:") or -1
        if (text := self._events.text(1024)) is not None:
            n = oom_kill_count(text)
            oom_kills = -1 if n is None else n
        some, full = psi_totals(self._psi.text(512) or "")
        children = self.children()
        self.last_children = children or []
        children_rss = -1 if children is None else sum(rss for _, rss, _ in children)
        return rss, usage, limit, children_rss, mem_available, oom_kills, some, full, anon

    def memory_stat(self) -> tuple[int, ...] | None:
        """The cgroup_sample payload (see ``parse_memory_stat``), or None without a memory cgroup."""
        text = self._stat.text(8192)
        if text is None or self.cgroup is None:
            return None
        stat = parse_memory_stat(text, self.cgroup.version)
        self.file_cache = file_cache(stat)
        return stat

    def children_rss(self) -> int:
        """Summed RSS of this process's children (e.g. DataLoader workers); -1 if unknowable."""
        children = self.children()
        return -1 if children is None else sum(rss for _, rss, _ in children)

    def children(self) -> list[tuple[int, int, str]] | None:
        """(pid, RSS, command name) of this process's children (e.g. DataLoader workers); None if unknowable."""
        if self._closed:
            return None
        pids = self._child_pids()
        if pids is None:
            return None
        for gone in set(self._children) - pids:
            self._children.pop(gone).close()
            self._comms.pop(gone, None)
            self._renaming.pop(gone, None)
        out = []
        now = time.monotonic_ns()
        for pid in sorted(pids)[:MAX_CHILDREN]:
            src = self._children.get(pid)
            if src is None:
                src = self._children[pid] = Source(f"{self.proc}/{pid}/statm")
                self._comms[pid] = _comm(f"{self.proc}/{pid}/comm")
                if self._comms[pid] == self._own:
                    self._renaming[pid] = now + RENAME_WINDOW_NS
            elif pid in self._renaming:
                self._comms[pid] = name = _comm(f"{self.proc}/{pid}/comm") or self._comms[pid]
                if name != self._own or now > self._renaming[pid]:
                    del self._renaming[pid]
            data = src.read(128)
            try:
                out.append((pid, int(data.split()[1]) * _PAGE if data else 0, self._comms.get(pid, "")))
            except (ValueError, IndexError):
                continue
        return out

    def _child_pids(self) -> set[int] | None:
        """The children's pids, from the ``children`` lists of this process's threads (each lists those that
        thread made). Every thread's list is read once a second (FULL_SCAN_NS); in between, only the main
        thread's and those of threads that had children at the last full read: a job has a thread per core
        (torch's, a data loader's), and reading each one's list every tick cost 436 us a tick with 64
        threads, 868 with 128 (docs/performance.md). A child made by another thread shows within a second."""
        now = time.monotonic_ns()
        full = now >= self._next_scan or not self._parents
        if full:
            try:
                tids = self._list_dir(f"{self.proc}/self/task")
            except OSError:
                return None
        else:
            tids = list(self._parents)
        pids: set[int] = set()
        parents: set[str] = set()  # at a full read, the threads whose list had children
        readable = False
        for tid in tids:
            data = read_proc(f"{self.proc}/self/task/{tid}/children")
            if data is None:
                continue
            try:
                pids.update(int(p) for p in data.split())
            except ValueError:
                continue
            readable = True
            if full and data.strip():
                parents.add(tid)
        if full:
            if not readable:
                return None
            self._parents, self._next_scan = parents | {str(os.getpid())}, now + FULL_SCAN_NS
        elif not readable:  # the threads read have all gone: read every thread's list now
            self._next_scan = 0
            return self._child_pids()
        return pids

    def close(self) -> None:
        for src in (self._statm, self._usage, self._limit, self._meminfo, self._events, self._psi, self._stat,
                    self._owner_usage):  # fmt: skip
            if src is not None:
                src.close()
        for src in self._children.values():
            src.close()
        self._children.clear()
        self._closed = True


def read_proc(path: str, limit: int = 1 << 16) -> bytes | None:
    """A small /proc file's bytes (at most ``limit``), or None where it cannot be read: open, read and
    close with the GIL held (``_holding_the_gil``), no buffered file object, whose fstat, ioctl and lseek
    each cost as much as the read on the sampler's core (children(): 147 us a tick with file objects,
    docs/performance.md)."""
    try:
        fd = _OPEN(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        parts, total = [], 0
        while total < limit:
            want = min(4096, limit - total)
            chunk = PREAD(fd, want, total)
            parts.append(chunk)
            total += len(chunk)
            if len(chunk) < want:  # a /proc file's read falls short only at its end
                break
        return b"".join(parts)
    except OSError:
        return None
    finally:
        _CLOSE(fd)


def _comm(path: str) -> str:
    """A process's command name (``/proc/<pid>/comm``); "" where it cannot be read (it has gone)."""
    data = read_proc(path, 64)
    return "" if data is None else data.decode("utf-8", "replace").strip()
