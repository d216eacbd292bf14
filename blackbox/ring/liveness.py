"""Is a ring's writer alive? The lock a writer holds, and what to believe without one.

An armed writer holds an open-file-description (OFD) write lock on its whole
ring. The kernel drops it when the process dies, zombie or not, and a reader
sees it through the file itself, so the answer holds across pid namespaces (a
containerised job recovered from the host, or the reverse) and against a pid
reused by another process. Rings whose writer did not take the lock (versions
before 3, or a filesystem that refused it) fall back to the pid: a live,
non-zombie process on this host and boot.
"""

from __future__ import annotations

import fcntl
import os
import struct
from typing import Any

_FLOCK = struct.Struct("@hhqqi4x")  # struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks)
LOCK_LIVENESS = "ofd-lock"


_boot_id: list[str | None] = []  # read once: a process outlives no boot


def hostname() -> str:
    """This host's name: the kernel's nodename, which socket.gethostname() returns on Linux (without
    importing socket at arm)."""
    return os.uname().nodename


def boot_id() -> str | None:
    """This boot's id: tells whether a ring's writer pid can still be the same process."""
    if not _boot_id:
        try:
            with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
                _boot_id.append(f.read().strip())
        except OSError:
            _boot_id.append(None)
    return _boot_id[0]


def same_machine(ident: dict[str, Any]) -> bool:
    """The ring was written on this machine: the same kernel boot where the ring names one (a
    container's host name may differ from its host's), else the same host name."""
    ring_boot, now = ident.get("boot_id"), boot_id()
    if isinstance(ring_boot, str) and ring_boot and now:
        return ring_boot == now
    return ident.get("host") == hostname()


def lock_ring(fd: int) -> bool:
    """Take the writer's lock on the whole ring (non-blocking); False where it cannot be had."""
    try:
        fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
    except (OSError, AttributeError):
        return False
    return True


def lock_held(fd: int) -> bool | None:
    """Someone (another open file description) holds a write lock on this file; None if it cannot be asked."""
    try:
        got = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _FLOCK.pack(fcntl.F_RDLCK, os.SEEK_SET, 0, 0, 0))
    except (OSError, AttributeError):
        return None
    return bool(_FLOCK.unpack(got)[0] != fcntl.F_UNLCK)


def ring_locked(path: str | os.PathLike[str], dir_fd: int | None = None) -> bool | None:
    """The file at ``path`` (relative to the folder open at ``dir_fd``) is held by a live writer; None where
    it cannot be opened (never follows a link)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        return lock_held(fd)
    finally:
        os.close(fd)


def writer_alive(locked: bool | None, meta: dict[str, Any]) -> bool:
    """The ring's writer is still running: by its lock where it took one (``locked``: ``lock_held`` asked
    through the descriptor the ring was read by; None where that could not be asked), else by its pid on
    this host and boot."""
    if locked is not None and meta.get("liveness") == LOCK_LIVENESS:
        return locked
    return pid_alive_here(meta)


def pid_alive_here(meta: dict[str, Any]) -> bool:
    """The pid in the ring's identity is a live process on this host, this boot (not a zombie)."""
    ident = meta.get("identity") or {}
    pid, boot = ident.get("pid"), ident.get("boot_id")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or not same_machine(ident):
        return False
    return (boot is None or boot == boot_id()) and process_running(pid)


def process_running(pid: int) -> bool:
    """A process with this pid exists and has not exited (a zombie, killed but not reaped, has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read(512)
    except OSError:
        return True  # exists, no /proc to ask
    state = stat.rpartition(b")")[2].split()[:1]
    return state not in ([b"Z"], [b"X"])
