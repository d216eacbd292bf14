"""Opening what recovery reads, as untrusted input that may belong to another user.

Recovery often runs as root (a Slurm epilogue, a clean-up job) over folders that
users wrote. Every file it reads (a ring, the ``.crash`` sidecar of a version-1
or 2 ring, ``folded.jsonl``, a bundle's files) is opened relative to its
folder's descriptor with ``O_NOFOLLOW|O_NONBLOCK`` and checked after opening
(``fstat``): a regular file, owned by whom it should be. So a symbolic link is
never followed, a FIFO or a device never blocks and is never read, a folder
swapped for a link halfway changes nothing, and a file another user planted (a
link to ``/etc/shadow``) is refused unread. A refusal is an
:class:`UnsafeInputError`: one line naming the path and what was found there,
never the file's bytes.

Owners: a ring may belong to anyone, but one with more than one name (a hard
link) only to the folder's owner; the files beside a ring must belong to the
ring's owner. The invoking user's own files are accepted too, unless they have
more than one name: where ``fs.protected_hardlinks`` is off, another user can
link a file they cannot read (``/etc/shadow``) into their own folder.

Reads are bounded by the bytes really there: :func:`nonzero_spans` skips holes
(``SEEK_DATA``) and pages of zeros, so a sparse file that declares gigabytes
costs what it holds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .._errors import NothingThereError, RingNotFoundError, UnsafeInputError

OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
PAGE = 4096
READ_CHUNK = 8 << 20  # bytes read at a time


def what_is(mode: int) -> str:
    """A file type, in words, for messages."""
    for test, words in (
        (stat.S_ISLNK, "a symbolic link (not followed)"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISDIR, "a folder"),
    ):
        if test(mode):
            return words
    return "a special file"


@dataclass
class Folder:
    """A folder held open: every input inside it is opened relative to ``fd``."""

    fd: int
    path: Path
    uid: int  # its owner

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> Folder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """Every entry (name, lstat), sorted by name; entries that vanish meanwhile are left out."""
        out = []
        for name in sorted(os.listdir(self.fd)):
            try:
                out.append((name, os.stat(name, dir_fd=self.fd, follow_symlinks=False)))
            except OSError:
                continue
        return out


class _Borrowed(contextlib.AbstractContextManager[Folder]):
    def __init__(self, folder: Folder) -> None:
        self.folder = folder

    def __enter__(self) -> Folder:
        return self.folder

    def __exit__(self, *exc: object) -> None:
        pass


def folder_at(where: Folder | Path) -> contextlib.AbstractContextManager[Folder]:
    """``where`` if it is a folder already open (left open), else the folder at that path, opened (and
    closed after)."""
    return _Borrowed(where) if isinstance(where, Folder) else open_folder(where)


def open_folder(path: Path) -> Folder:
    """Open a folder named by the invoking user (the one place a link is followed: the user named it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise RingNotFoundError(f"{path}: expected a folder, found nothing at that path") from None
    except NotADirectoryError:
        raise RingNotFoundError(f"{path}: expected a folder, found a file") from None
    except OSError as exc:
        raise RingNotFoundError(f"{path}: expected a readable folder, found {exc.strerror}") from None
    return Folder(fd, path, os.fstat(fd).st_uid)


FOLDER_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def open_child(parent: Folder, name: str, uid: int | None = None, what: str = "a folder") -> Folder:
    """Open the folder ``name`` inside ``parent`` as untrusted input: relative to the parent's descriptor,
    never through a link (``O_DIRECTORY|O_NOFOLLOW``), its owner checked on the descriptor (``uid``: the
    one owner accepted). Raises RingNotFoundError where nothing is there, UnsafeInputError for a link,
    anything but a folder, or another owner's folder. Whatever is done inside it afterwards goes through
    this descriptor: swapping the name for a link or another folder meanwhile changes nothing."""
    path = parent.path / name
    try:
        fd = os.open(name, FOLDER_FLAGS, dir_fd=parent.fd)
    except FileNotFoundError:
        raise RingNotFoundError(f"{path}: expected {what}, found nothing at that path") from None
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):  # O_DIRECTORY|O_NOFOLLOW on a link: ENOTDIR
            try:
                found = what_is(os.stat(name, dir_fd=parent.fd, follow_symlinks=False).st_mode)
            except OSError:
                found = "something that is not a folder"
            raise UnsafeInputError(f"{path}: expected {what}, found {'a file' if found == 'a special file' else found}"
                                   ) from None  # fmt: skip
        raise RingNotFoundError(f"{path}: expected a readable folder, found {exc.strerror}") from None
    owner = os.fstat(fd).st_uid
    if uid is not None and owner != uid:
        os.close(fd)
        raise UnsafeInputError(f"{path}: expected {what} of uid {uid}, found one of uid {owner}")
    return Folder(fd, path, owner)


def open_named(path: Path, follow: bool = True) -> Folder:
    """A folder named on a command line: the folder holding it opened by path (the invoking user named
    it), then the folder itself relative to it; ``follow=False`` (root over other users' folders) refuses
    it where it is a link."""
    whole = Path(os.path.abspath(path))
    if follow or not whole.name:
        return open_folder(path)
    with open_folder(whole.parent) as parent:
        folder = open_child(parent, whole.name)
    folder.path = path
    return folder


def trusted(st: os.stat_result, owners: Collection[int]) -> bool:
    """Owned by one of ``owners``, or the invoking user's own file with a single name."""
    return st.st_uid in owners or (st.st_uid == os.geteuid() and st.st_nlink == 1)


def open_input(folder: Folder, name: str, owners: Collection[int] | None, what: str) -> tuple[int, os.stat_result]:
    """Open ``name`` in ``folder`` as untrusted input: (descriptor, fstat). Raises NothingThereError (a
    RingNotFoundError) when nothing is there, UnsafeInputError for a link, a special file or a file of the wrong owner.

    ``owners``: uids whose files are accepted (see :func:`trusted`); None accepts a file of any owner
    with a single name, and the folder owner's with more.
    """
    path = folder.path / name
    try:
        fd = os.open(name, OPEN_FLAGS, dir_fd=folder.fd)
    except FileNotFoundError:
        raise NothingThereError(f"{path}: expected {what}, found nothing at that path") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise UnsafeInputError(f"{path}: expected {what}, found a symbolic link (not followed)") from None
        if exc.errno == errno.EISDIR:
            raise RingNotFoundError(f"{path}: expected {what}, found a folder") from None
        raise RingNotFoundError(f"{path}: expected a readable {what}, found {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeInputError(f"{path}: expected {what}, found {what_is(st.st_mode)} (not read)")
        ok = trusted(st, owners) if owners is not None else st.st_nlink == 1 or st.st_uid == folder.uid
        if not ok:
            links = f" with {st.st_nlink} names" if st.st_nlink > 1 else ""
            raise UnsafeInputError(
                f"{path}: expected {what} of uid {', '.join(map(str, sorted(owners or {folder.uid})))}, "
                f"found a file of uid {st.st_uid}{links} (not read)"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_at(fd: int, n: int, offset: int) -> bytes:
    """Up to ``n`` bytes at ``offset`` (fewer only at the end of the file)."""
    parts, got = [], 0
    while got < n:
        part = os.pread(fd, min(n - got, READ_CHUNK), offset + got)
        if not part:
            break
        parts.append(part)
        got += len(part)
    return b"".join(parts)


def data_ranges(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The parts of [start, end) that hold data (``SEEK_DATA``/``SEEK_HOLE``); the whole range where the
    filesystem cannot tell."""
    out: list[tuple[int, int]] = []
    pos = start
    try:
        while pos < end:
            try:
                lo = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError as exc:
                if exc.errno == errno.ENXIO:
                    break  # only a hole up to the end of the file
                raise
            if lo >= end:
                break
            hi = min(os.lseek(fd, lo, os.SEEK_HOLE), end)
            out.append((lo, hi))
            pos = hi
    except (OSError, AttributeError):
        return [(start, end)]
    return out


def nonzero_spans(fd: int, start: int, size: int) -> list[tuple[int, bytearray]]:
    """The region [start, start + size) as (offset in the region, bytes) spans of whole pages that are
    not all zero: memory and time follow the data in the file, not the size a header declares."""
    spans: list[tuple[int, bytearray]] = []
    for lo, hi in data_ranges(fd, start, start + size):
        lo -= (lo - start) % PAGE
        for at in range(lo, hi, READ_CHUNK):
            chunk = os.pread(fd, min(READ_CHUNK, hi - at), at)
            if not chunk:
                break
            n = -(-len(chunk) // PAGE)
            pages = np.frombuffer(chunk.ljust(n * PAGE, b"\0"), np.uint64).reshape(n, PAGE // 8)
            used = np.flatnonzero(pages.any(axis=1))
            if not len(used):
                continue
            breaks = np.flatnonzero(np.diff(used) != 1)
            firsts = [int(used[0]), *used[breaks + 1].tolist()]  # (np.r_ costs more than the rest of a small region)
            lasts = [*used[breaks].tolist(), int(used[-1])]
            for first, last in zip(firsts, lasts, strict=True):
                piece = chunk[first * PAGE : (last + 1) * PAGE]
                offset = at - start + first * PAGE
                if spans and spans[-1][0] + len(spans[-1][1]) == offset:
                    spans[-1][1].extend(piece)
                else:
                    spans.append((offset, bytearray(piece)))
    return spans
