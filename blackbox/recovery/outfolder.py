"""Where a local bundle is made: a private holder beside OUT, filled through descriptors, each folder
of it put at OUT whole; and what a recovery that was killed left beside OUT, cleaned up.

OUT's parent may be another user's folder (root recovering in a Slurm epilogue into the job user's
folder), who may rename or replace anything in it at any moment. So nothing is ever opened by a path
through it: the parent is opened once, the holder ``.<OUT>.XXXXXXXX.tmp`` is made in it and checked
after opening (a folder of ours, then mode 0700 and empty), and from then on everything happens inside
the holder, which nobody else can enter or change: its folders are made and filled relative to their
descriptors (files new, 0600, ``O_EXCL|O_NOFOLLOW``), and each is put at OUT with ``renameat2`` from
the holder's descriptor onto the parent's. Whatever is done to the holder's name meanwhile, only our
folder can reach OUT, and OUT is never left a link.

The holder is locked (``flock``) while its recovery runs. A holder that is ours, unlocked and not empty
(its content is made after the lock is taken) was left by a recovery that was killed, and the next
recovery into the same OUT removes it; an empty one only when it is older than a minute.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import secrets
import stat
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from .._errors import BundleDestinationError, one_line
from ..ring.inputs import what_is
from ..ring.tree import empty as _empty
from ..ring.tree import remove as _remove

HOLDER_SUFFIX = ".tmp"
EMPTY_HOLDER_STALE_S = 60.0  # an empty unlocked holder younger than this may be one about to be locked
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


class Folder:
    """A folder of the holder, being filled: its files are made new, relative to its descriptor."""

    def __init__(self, fd: int, name: str) -> None:
        self.fd, self.name = fd, name

    def create(self, name: str) -> BinaryIO:
        """A new file, mode 0600: never an existing one, never through a link."""
        return os.fdopen(os.open(name, _NEW_FILE, 0o600, dir_fd=self.fd), "wb")

    def open_back(self, name: str) -> BinaryIO:
        """A file written into it, for reading."""
        return os.fdopen(os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.fd), "rb")

    def mkdir(self, name: str) -> None:
        """A new folder in it, mode 0700 (its files are then created as ``<name>/<file>``)."""
        os.mkdir(name, 0o700, dir_fd=self.fd)

    def remove(self, name: str) -> None:
        """A file made in it, removed."""
        os.unlink(name, dir_fd=self.fd)


class OutFolder:
    """OUT's private holder, for one recovery: ``folder()`` makes a folder in it, ``put(folder)`` puts it
    at OUT whole (exchanged with an earlier bundle there, which is then removed); closing removes the
    holder. ``replaceable(name)`` says which names an earlier bundle at OUT may hold: OUT holding
    anything else (or being a link, a file) is refused, untouched."""

    def __init__(self, out: str | os.PathLike[str], replaceable: Callable[[str], bool]) -> None:
        self.out = Path(os.path.abspath(out))
        self._replaceable = replaceable
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.parent = os.open(self.out.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.holder = -1
        self._made = 0
        try:
            self.check_out()
            clean_stale(self.parent, self.out.name)
            self.holder_name, self.holder = _private_holder(self.parent, self.out)
        except BaseException:
            os.close(self.parent)
            raise

    def __enter__(self) -> OutFolder:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    def folder(self) -> Folder:
        name = f"b{self._made}"
        self._made += 1
        os.mkdir(name, 0o700, dir_fd=self.holder)
        return Folder(os.open(name, _DIR, dir_fd=self.holder), name)

    def put(self, folder: Folder) -> None:
        """Put ``folder`` at OUT: atomically where nothing or an earlier bundle is there."""
        os.close(folder.fd)
        for _ in range(8):
            err = _renameat2(self.holder, folder.name, self.parent, self.out.name, _RENAME_NOREPLACE)
            if err == 0:
                return
            if err == errno.EEXIST:
                self.check_out()
                err = _renameat2(self.holder, folder.name, self.parent, self.out.name, _RENAME_EXCHANGE)
                if err == 0:
                    _remove(self.holder, folder.name)  # what was at OUT, now in the holder
                    return
                if err == errno.ENOENT:
                    continue  # removed meanwhile: place it again
            if err in (errno.ENOSYS, errno.EINVAL):
                self._put_renaming(folder.name)
                return
            raise OSError(err, os.strerror(err), str(self.out))
        raise BundleDestinationError(f"{self.out}: could not put the bundle in place (the path kept changing)")

    def _put_renaming(self, name: str) -> None:
        """Without renameat2: move the earlier bundle into the holder, then rename (OUT briefly missing)."""
        aside = f"{name}.old"
        with contextlib.suppress(FileNotFoundError):
            os.rename(self.out.name, aside, src_dir_fd=self.parent, dst_dir_fd=self.holder)
        os.rename(name, self.out.name, src_dir_fd=self.holder, dst_dir_fd=self.parent)
        _remove(self.holder, aside)

    def check_out(self) -> None:
        """Refuse an OUT that is neither missing nor an earlier bundle (a link, a file, other files)."""
        try:
            st = os.stat(self.out.name, dir_fd=self.parent, follow_symlinks=False)
        except FileNotFoundError:
            return
        what = f"{self.out}: expected a new folder or an earlier bundle to replace"
        if not stat.S_ISDIR(st.st_mode):
            raise BundleDestinationError(
                f"{what}, found {what_is(st.st_mode) if not stat.S_ISREG(st.st_mode) else 'a file'}"
            )
        try:
            fd = os.open(self.out.name, _DIR, dir_fd=self.parent)
            try:
                others = sorted(n for n in os.listdir(fd) if not self._replaceable(n))
            finally:
                os.close(fd)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise BundleDestinationError(f"{what}, found a folder that cannot be listed ({exc.strerror})") from None
        if others:
            raise BundleDestinationError(f"{what}, found a folder holding other files ({one_line(others[0])!s}, ...)")

    def close(self) -> None:
        """Remove the holder (and whatever is still in it), then let go of it."""
        if self.holder >= 0:
            _empty(self.holder)
            with contextlib.suppress(OSError):
                os.rmdir(self.holder_name, dir_fd=self.parent)  # gone if its name now holds another's
            os.close(self.holder)  # and its lock
            self.holder = -1
        if self.parent >= 0:
            os.close(self.parent)
            self.parent = -1


def _private_holder(parent: int, out: Path) -> tuple[str, int]:
    """Make ``.<OUT>.XXXXXXXX.tmp`` in ``parent``: (its name, its descriptor, locked). Checked after
    opening: a folder of ours (not a link, not another's), then made 0700, then empty."""
    for _ in range(16):
        name = f".{out.name}.{secrets.token_hex(4)}{HOLDER_SUFFIX}"
        try:
            os.mkdir(name, 0o700, dir_fd=parent)
        except FileExistsError:
            continue
        swapped = f"{out.parent}/{name}: expected the private folder just made, found another in its place"
        try:
            fd = os.open(name, _DIR, dir_fd=parent)
        except OSError as exc:
            raise BundleDestinationError(f"{swapped} ({exc.strerror})") from None
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise BundleDestinationError(f"{swapped} (of uid {os.fstat(fd).st_uid})")
            os.fchmod(fd, 0o700)  # from now on nobody else can add anything to it
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits only while another recovery's clean_stale looks at it
            if os.listdir(fd):
                raise BundleDestinationError(f"{swapped} (not empty)")
        except BaseException:
            os.close(fd)
            raise
        return name, fd
    raise BundleDestinationError(f"{out}: could not make a private folder beside it")


def clean_stale(parent: int, name: str) -> list[str]:
    """Remove the holders beside OUT (``name`` in ``parent``) that recoveries which were killed left:
    this user's, unlocked, and not empty (or empty for over a minute). Returns their names."""
    prefix = f".{name}."
    removed = []
    for entry in os.listdir(parent):
        if not (entry.startswith(prefix) and entry.endswith(HOLDER_SUFFIX)) or len(entry) != len(prefix) + 12:
            continue  # .<OUT>.XXXXXXXX.tmp only (mkdtemp's names were 8 characters too)
        try:
            fd = os.open(entry, _DIR, dir_fd=parent)
        except OSError:
            continue  # gone, a link, not a folder
        try:
            st = os.fstat(fd)
            if st.st_uid != os.geteuid():
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its recovery is still at work
            if not os.listdir(fd) and time.time() - st.st_mtime < EMPTY_HOLDER_STALE_S:
                continue  # perhaps just made, its lock not taken yet
            _empty(fd)
            with contextlib.suppress(OSError):
                os.rmdir(entry, dir_fd=parent)
            removed.append(entry)
        finally:
            os.close(fd)
    return removed


def _renameat2(src_dir: int, src: str, dst_dir: int, dst: str, flags: int) -> int:
    """renameat2(2): 0, or the errno (ENOSYS/EINVAL where the libc or the filesystem lacks it)."""
    try:
        call = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return errno.ENOSYS
    if call(src_dir, os.fsencode(src), dst_dir, os.fsencode(dst), ctypes.c_uint(flags)) == 0:
        return 0
    return ctypes.get_errno()
