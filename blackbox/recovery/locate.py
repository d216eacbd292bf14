"""Where node bundles are: found under what the user named (a bundle folder, a folder of bundles, a URI
prefix: ``s3://``, ``gs://``, ``hdfs://``, ``file://``), and what kind of thing was named (one bundle,
bundles, or rings still to recover).

A local folder is opened once and held (``Held``); every bundle below it is then reached from that
descriptor, each folder entered without following a link (``Place.folder``), and each file read bounded
(``Place.read``). Bundles are untrusted input: a folder that cannot be entered is reported with its
reason, never guessed at (recovery/job.py reads what is found here).
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from .._errors import BlackboxError, BundleDestinationError, RingNotFoundError, one_line
from ..ring.inputs import Folder, open_folder, open_input
from .bundle import METADATA, SUMMARY, Destination

MAX_BUNDLES = 100_000
MAX_DEPTH = 3  # job/host/run-*/bundle: how deep below a named folder bundles are looked for
RING_SUFFIXES = (".ring", ".ring.zst")  # a ring, and one a bundle keeps in rings/
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class Held:
    """A folder the user named, opened once and shared by the bundles found below it (closed when the last
    of them is dropped): every later read starts from this descriptor, never from the path again."""

    def __init__(self, folder: Folder) -> None:
        self.folder = folder

    def __del__(self) -> None:
        self.folder.close()


@dataclass(frozen=True)
class Place:
    """Where a bundle is: a local folder (``root`` as the user named it, held open in ``top``, then ``parts``
    below it, each entered without following a link) or a path on a pyarrow filesystem (``scheme://`` +
    ``root``)."""

    root: str
    parts: tuple[str, ...] = ()
    fs: pafs.FileSystem | None = None  # None: local
    scheme: str = ""
    top: Held | None = field(default=None, compare=False, hash=False, repr=False)

    def __str__(self) -> str:
        path = "/".join([self.root.rstrip("/") or "/", *self.parts]) if self.parts else self.root
        return f"{self.scheme}://{path}" if self.fs is not None else path

    def read(self, name: str, limit: int) -> bytes:
        """The bytes of one of its files, at most ``limit`` (more is refused, not cut)."""
        if self.fs is not None:
            path = f"{self.root.rstrip('/')}/{name}"
            try:
                with self.fs.open_input_file(path) as f:
                    size = f.size()
                    if size > limit:
                        raise BundleDestinationError(f"{self}/{name}: expected at most {limit} bytes, found {size}")
                    return bytes(f.read(limit))
            except FileNotFoundError:
                raise RingNotFoundError(f"{self}/{name}: expected {name}, found nothing") from None
            except OSError as exc:
                found = one_line(str(exc))
                raise RingNotFoundError(f"{self}/{name}: expected a readable {name}, found {found}") from None
        with self.folder() as folder:
            fd, st = open_input(folder, name, {folder.uid}, name)
        with os.fdopen(fd, "rb") as f:
            if st.st_size > limit:
                raise BundleDestinationError(f"{self}/{name}: expected at most {limit} bytes, found {st.st_size}")
            return f.read(limit)

    def folder(self) -> Folder:
        """The local bundle's folder, opened from the folder the user named (held since the bundle was found),
        each part below it entered without following a link; the caller's to close."""
        top = self.top.folder if self.top is not None else None
        folder = Folder(os.dup(top.fd), top.path, top.uid) if top is not None else open_folder(Path(self.root))
        for part in self.parts:
            try:
                fd = os.open(part, _DIR_FLAGS, dir_fd=folder.fd)
            except OSError as exc:
                folder.close()
                raise RingNotFoundError(f"{self}: expected a bundle folder, found {exc.strerror}") from None
            folder.close()
            folder = Folder(fd, folder.path / part, os.fstat(fd).st_uid)
        return folder


def is_uri(target: str) -> bool:
    return "://" in target


def find_bundles(target: str, problems: list[dict[str, str]] | None = None) -> list[Place]:
    """The bundles at ``target``: itself where it holds a metadata.json, else every bundle below it
    (local folders down to MAX_DEPTH, links never followed; a URI prefix listed recursively)."""
    dest = Destination(target)  # a URI parsed once, the way a bundle's destination is; file:// is local
    if dest.local is None:
        return _find_remote(target, dest.fs, dest.root)
    root = dest.root if is_uri(target) else target
    top = Held(open_folder(Path(root)))  # opened once: every bundle below is read from this descriptor
    return [Place(root, parts, top=top) for parts in _find_local(top.folder, [] if problems is None else problems)]


def _find_remote(target: str, fs: pafs.FileSystem, root: str) -> list[Place]:
    scheme = target.split("://", 1)[0]
    try:
        top = fs.get_file_info(f"{root.rstrip('/')}/{METADATA}")
        if top.type == pafs.FileType.File:
            return [Place(root, (), fs, scheme)]
        infos = fs.get_file_info(pafs.FileSelector(root.rstrip("/"), allow_not_found=True, recursive=True))
    except OSError as exc:
        found = one_line(str(exc))
        raise RingNotFoundError(f"{target}: expected a bundle or a prefix of bundles, found {found}") from None
    depth = root.rstrip("/").count("/") + MAX_DEPTH + 1  # as deep as a local search goes
    metadata = [i.path for i in infos if i.base_name == METADATA and i.path.count("/") <= depth]
    folders = sorted({p.rsplit("/", 1)[0] for p in metadata})
    if len(folders) > MAX_BUNDLES:
        raise BundleDestinationError(f"{target}: expected at most {MAX_BUNDLES} bundles, found {len(folders)}")
    return [Place(f, (), fs, scheme) for f in folders]


def _find_local(top: Folder, problems: list[dict[str, str]]) -> list[tuple[str, ...]]:
    """Bundle folders below ``target`` (as name parts); folders that could not be entered go to
    ``problems`` with their reason. Any entry named metadata.json (a link, a FIFO) marks a bundle, so
    that reading it says what is wrong instead of the bundle vanishing from the account."""
    found: list[tuple[str, ...]] = []

    def walk(folder: Folder, parts: tuple[str, ...]) -> None:
        entries = folder.entries()
        if any(n == METADATA for n, _ in entries):
            found.append(parts)
            return
        if len(parts) >= MAX_DEPTH:
            return
        for name, st in entries:
            if not stat.S_ISDIR(st.st_mode) or name.startswith("."):  # .tmp: a bundle being written
                continue
            try:
                fd = os.open(name, _DIR_FLAGS, dir_fd=folder.fd)
            except FileNotFoundError:
                continue  # vanished meanwhile
            except OSError as exc:
                where = one_line(str(folder.path / name))
                problems.append(
                    {
                        "bundle": where,
                        "reason": f"{where}: expected a readable folder, found "
                        f"{exc.strerror if exc.errno != errno.ELOOP else 'a symbolic link (not followed)'}",
                    }
                )
                continue
            with Folder(fd, folder.path / name, os.fstat(fd).st_uid) as inner:
                walk(inner, (*parts, name))
            if len(found) > MAX_BUNDLES:
                raise BundleDestinationError(f"{top.path}: expected at most {MAX_BUNDLES} bundles, found more")

    walk(top, ())
    return found


def holds_rings(target: str) -> bool:
    """A ring file, or a folder with ``*.ring`` (or ``*.ring.zst``) entries (what ring recovery reads, not bundles)."""
    if is_uri(target):
        return False
    try:
        st = os.stat(target)
        if stat.S_ISREG(st.st_mode):
            return True
        return stat.S_ISDIR(st.st_mode) and any(n.endswith(RING_SUFFIXES) for n in os.listdir(target))
    except OSError:
        return False


def is_one_bundle(target: str) -> bool:
    """``target`` is itself a bundle with its summary (a node bundle, or a job-wide one)."""
    if not is_uri(target):
        return os.path.lexists(os.path.join(target, SUMMARY))
    try:
        dest = Destination(target)
        return bool(dest.fs.get_file_info(dest.path(SUMMARY)).type == pafs.FileType.File)
    except (BlackboxError, OSError):
        return False


def kind_of(targets: list[str]) -> str:
    """What the user named: ``bundle`` (one bundle), ``rings`` (ring files and folders of rings) or
    ``bundles`` (several bundles, folders or URI prefixes of them)."""
    if len(targets) == 1 and is_one_bundle(targets[0]):
        return "bundle"
    rings = [holds_rings(t) for t in targets]
    if all(rings):
        return "rings"
    if any(rings):
        raise BundleDestinationError(
            f"{targets[rings.index(True)]}, {targets[rings.index(False)]}: expected ring files or bundles, "
            "found both (recover the rings first)"
        )
    return "bundles"
