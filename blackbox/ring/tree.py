"""Folder trees through descriptors: what a tree holds, and removing it, never following a link.

Retention (at arm and ``blackbox prune``), the epilogue and a bundle's private holder work in folders that
other users can change while they work, often as root. Every step here goes through the descriptor of a
folder opened once (``O_DIRECTORY|O_NOFOLLOW``): a name swapped for a link, or a folder above it swapped
for a link to another user's folder, changes nothing. ``shutil.rmtree`` takes ``dir_fd`` only from Python
3.11, and opens the top of the tree by its path.
"""

from __future__ import annotations

import contextlib
import os
import stat

MAX_DEPTH = 32  # trees deeper than this are left where they are (a bundle is two levels deep, a run folder three)
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def identity(st: os.stat_result) -> tuple[int, int]:
    """What names one file whatever its name: (device, inode)."""
    return st.st_dev, st.st_ino


def usage(fd: int, depth: int = 0) -> tuple[int, float]:
    """(bytes of the regular files in the folder open at ``fd`` and below, the newest modification time
    of what it holds or 0.0); entries that vanish meanwhile count as nothing."""
    size, newest = 0, 0.0
    try:
        names = os.listdir(fd)
    except OSError:
        return 0, 0.0
    for name in names:
        try:
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        except OSError:
            continue
        newest = max(newest, st.st_mtime)
        if stat.S_ISREG(st.st_mode):
            size += st.st_size
        elif stat.S_ISDIR(st.st_mode) and depth < MAX_DEPTH:
            try:
                sub = os.open(name, _DIR, dir_fd=fd)
            except OSError:
                continue
            try:
                inner, when = usage(sub, depth + 1)
            finally:
                os.close(sub)
            size, newest = size + inner, max(newest, when)
    return size, newest


def empty(fd: int, depth: int = 0) -> None:
    """Remove everything in the folder open at ``fd``, never following a link (at most MAX_DEPTH deep)."""
    try:
        names = os.listdir(fd)
    except OSError:
        return
    for name in names:
        with contextlib.suppress(OSError):
            remove(fd, name, depth)


def remove(fd: int, name: str, depth: int = 0, same: tuple[int, int] | None = None) -> bool:
    """Remove ``name`` in the folder open at ``fd``: a folder tree through descriptors, else the entry.
    ``same``: only if it is still the file listed (its ``identity``): another file put in its place
    meanwhile stays. True if it went (what cannot go stays, as with ``shutil.rmtree(ignore_errors=True)``)."""
    try:
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if same is not None and identity(st) != same:
            return False
        if not stat.S_ISDIR(st.st_mode):
            os.unlink(name, dir_fd=fd)
            return True
        if depth >= MAX_DEPTH:
            return False
        sub = os.open(name, _DIR, dir_fd=fd)
        try:
            if same is not None and identity(os.fstat(sub)) != same:
                return False  # swapped between the look and the open
            empty(sub, depth + 1)
        finally:
            os.close(sub)
        os.rmdir(name, dir_fd=fd)
        return True
    except OSError:
        return False
