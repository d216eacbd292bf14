"""A ring's header alone, read with two bounded reads: cheap enough to scan a folder of big rings, and all
that arming needs of the rings already there (retention, a ring at the requested path), without the
reader's imports (the packed rings' zstandard and its threads).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .._errors import NotARingError, RingNotFoundError
from . import format as fmt
from .inputs import Folder, folder_at, open_folder, open_input, read_at
from .liveness import lock_held

RING_SUFFIX = ".ring"
CRASH_SUFFIX = ".crash"  # faulthandler's tracebacks of a native crash, beside a version-1/2 ring


def read_header(path: str | os.PathLike[str], folder: Folder | None = None) -> fmt.Header:
    """Only the header of a ring (two bounded reads): cheap enough to scan a folder of big rings.
    Opened as untrusted input (never through a link, never blocking: see ``inputs``)."""
    p = Path(path)
    with parent(p, folder) as where:
        fd, st = open_input(where, p.name, None, "a ring file")
        try:
            return header_of(fd, st.st_size, str(p))
        finally:
            os.close(fd)


def probe(path: str | os.PathLike[str], folder: Folder | None = None) -> tuple[fmt.Header, bool | None]:
    """(the header, whether a writer holds its lock: ``liveness.lock_held``) of a ring, both through one
    descriptor (never the path opened again: another file may be there by then)."""
    p = Path(path)
    with parent(p, folder) as where:
        fd, st = open_input(where, p.name, None, "a ring file")
        try:
            return header_of(fd, st.st_size, str(p)), lock_held(fd)
        finally:
            os.close(fd)


def header_of(fd: int, size: int, name: str) -> fmt.Header:
    """The header of the ring open at ``fd`` (``size`` bytes), read with two bounded reads."""
    prefix = os.pread(fd, fmt.PREFIX_SIZE, 0)
    if prefix[:8] != fmt.MAGIC:
        return fmt.decode_header(prefix, size, name)  # raises, naming what it found
    if len(prefix) < fmt.PREFIX_SIZE:
        raise NotARingError(f"{name}: expected a ring header of {fmt.PREFIX_SIZE} bytes, found a {size}-byte file")
    meta_len = int.from_bytes(prefix[56:64], "little")
    head = read_at(fd, fmt.PREFIX_SIZE + min(meta_len, fmt.MAX_HEADER_SIZE), 0)
    return fmt.decode_header(head, size, name)


def parent(path: Path, folder: Folder | None) -> contextlib.AbstractContextManager[Folder]:
    """``folder`` (left open), or the folder holding ``path``, opened here and closed after."""
    return folder_at(folder) if folder is not None else folder_of(path)


def folder_of(path: Path) -> Folder:
    """The folder holding the ring file ``path``, opened by path (the invoking user named it)."""
    try:
        return open_folder(path.parent)
    except RingNotFoundError:
        raise RingNotFoundError(f"{path}: expected a ring file, found nothing at that path") from None
