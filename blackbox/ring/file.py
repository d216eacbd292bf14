"""Where a ring lives and how its file is made: naming, the default folder, creation.

Creation is all-or-nothing: the file is made with ``O_EXCL|O_NOFOLLOW`` and mode
0600, its blocks are reserved with ``posix_fallocate`` (so a full disk fails
here, not as a SIGBUS mid-run), it is mapped ``MAP_SHARED`` and every page is
faulted in (so the recorder's own writes never allocate memory later). On any
failure the partial file is removed and the ``OSError`` propagates to the
recorder, which turns it into one warning.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)  # Linux 5.14+
RING_SUFFIX = ".ring"
CRASH_SUFFIX = ".crash"  # faulthandler's tracebacks of a native crash
SNAPSHOT_SUFFIX = ".oom-snapshot.pickle"  # PyTorch's allocator snapshot at the first CUDA OOM
SIDECAR_SUFFIXES = (CRASH_SUFFIX, SNAPSHOT_SUFFIX)
_DISKLESS = {"tmpfs", "ramfs", "devtmpfs", "shm"}


def default_dir() -> Path:
    """``$BLACKBOX_DIR`` if set, else ``/var/tmp/blackbox-<uid>``.

    ``/var/tmp`` is disk-backed on Linux distributions that follow the FHS and
    survives reboots, unlike ``/tmp``, which is often a tmpfs.
    """
    env = os.environ.get("BLACKBOX_DIR")
    if env:
        return Path(env)
    return Path("/var/tmp") / f"blackbox-{os.getuid()}"


def ring_name(host: str, pid: int, rank: int | None, started_ns: int) -> str:
    """``blackbox-<host>-rank<R>-pid<P>-<UTC start>.ring``; rank ``x`` when unknown."""
    safe_host = re.sub(r"[^A-Za-z0-9.-]", "_", host)[:64] or "host"
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started_ns / 1e9))
    micros = (started_ns // 1000) % 1_000_000
    rank_s = "x" if rank is None else str(rank)
    return f"blackbox-{safe_host}-rank{rank_s}-pid{pid}-{stamp}.{micros:06d}Z{RING_SUFFIX}"


def sidecar(ring: Path, suffix: str) -> Path:
    """A file kept beside a ring: ``<ring><suffix>`` (one of SIDECAR_SUFFIXES)."""
    return Path(str(ring) + suffix)


def hostname() -> str:
    return socket.gethostname()


def boot_id() -> str | None:
    """This boot's id: tells whether a ring's writer pid can still be the same process."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
            return f.read().strip()
    except OSError:
        return None


def writer_running(meta: dict[str, Any]) -> bool:
    """The ring's writer is a live process on this host, this boot (its pid was not reused across a reboot)."""
    ident = meta.get("identity") or {}
    pid, boot = ident.get("pid"), ident.get("boot_id")
    if not isinstance(pid, int) or pid <= 0 or ident.get("host") != socket.gethostname():
        return False
    return (boot is None or boot == boot_id()) and _alive(pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    return True


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem holding ``path``, from /proc/self/mountinfo."""
    try:
        target = os.path.realpath(path)
        best, fstype = "", None
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                mount_point = fields[4].replace("\\040", " ")
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, fstype = mount_point, right.split()[0]
        return fstype
    except OSError:
        return None


def is_diskless(path: Path) -> bool:
    return filesystem_type(path) in _DISKLESS


def create_ring(path: Path, header: bytes, total_size: int) -> tuple[int, mmap.mmap]:
    """Create, reserve, map and pre-fault a ring file; write its header. Returns (fd, map)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    try:
        os.posix_fallocate(fd, 0, total_size)
        mm = mmap.mmap(fd, total_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        try:
            _prefault(mm)
            mm[: len(header)] = header
        except BaseException:
            mm.close()
            raise
    except BaseException:
        os.close(fd)
        try:
            os.unlink(path)
        except OSError:
            pass
        raise
    return fd, mm


def _prefault(mm: mmap.mmap) -> None:
    try:
        mm.madvise(MADV_POPULATE_WRITE)
        return
    except (OSError, ValueError):
        pass  # older kernel: touch one byte per page instead
    view = memoryview(mm)
    try:
        for off in range(0, len(mm), mmap.PAGESIZE):
            view[off] = 0
    finally:
        view.release()


def lock_pages(mm: mmap.mmap) -> bool:
    """mlock the mapping so reclaim never evicts it; best effort (needs RLIMIT_MEMLOCK)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        anchor = ctypes.c_char.from_buffer(mm)
        try:
            addr = ctypes.addressof(anchor)
        finally:
            del anchor
        return bool(libc.mlock(ctypes.c_void_p(addr), ctypes.c_size_t(len(mm))) == 0)
    except (OSError, AttributeError, TypeError, ValueError):
        return False
