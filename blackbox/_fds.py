"""Descriptors blackbox opens inside the job: kept away from the numbers the job reuses, and
never used or closed once the number has come to mean another file.

A job may close every descriptor (``os.closerange``, daemonising code) and open
its own, which then get the lowest free numbers. So each descriptor we keep is
moved high (``F_DUPFD_CLOEXEC``) and remembered with its device and inode;
``intact()`` says whether the number still refers to our file, and ``close()``
closes only then.
"""

from __future__ import annotations

import fcntl
import os
import resource


def _high_base() -> int:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return 64
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 1 << 16
    return max(16, min(soft // 2, 4096))


class OwnedFd:
    """One descriptor of ours, with the identity of the file it was opened on."""

    __slots__ = ("dev", "fd", "ino")

    def __init__(self, fd: int, dev: int, ino: int) -> None:
        self.fd, self.dev, self.ino = fd, dev, ino

    @classmethod
    def adopt(cls, fd: int) -> OwnedFd:
        """Take ownership of ``fd``: moved to a high number (close-on-exec) where the limit allows."""
        try:
            high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, _high_base())
        except OSError:
            high = fd
        else:
            os.close(fd)
        st = os.fstat(high)
        return cls(high, st.st_dev, st.st_ino)

    @classmethod
    def open(cls, path: str | os.PathLike[str], flags: int = os.O_RDONLY) -> OwnedFd | None:
        """Open and adopt; None where the path cannot be opened."""
        try:
            fd = os.open(path, flags | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            return cls.adopt(fd)
        except OSError:
            os.close(fd)
            return None

    def intact(self) -> bool:
        """The number still refers to the file we opened (the job has not closed it and reused it)."""
        try:
            st = os.fstat(self.fd)
        except OSError:
            return False
        return st.st_dev == self.dev and st.st_ino == self.ino

    def close(self) -> None:
        """Close, only if the number is still ours."""
        if self.fd >= 0 and self.intact():
            try:
                os.close(self.fd)
            except OSError:
                pass
        self.fd = -1
