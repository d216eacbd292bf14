"""Reading a ring file as untrusted input: bounded reads, no pickle, no eval.

:func:`read_ring` salvages every record that passes the commit rule, even from
a truncated file, and counts what it had to drop. It raises a BlackboxError
subclass only when there is nothing trustworthy to read (no file, no magic, an
unknown version, a header whose checksum fails).
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .._errors import BlackboxError, RingNotFoundError, UnsafeInputError, one_line
from . import columns
from . import format as fmt
from .header import CRASH_SUFFIX as CRASH_SUFFIX
from .header import RING_SUFFIX as RING_SUFFIX
from .header import folder_of
from .header import header_of as header_of
from .header import parent as _parent
from .header import probe as probe
from .header import read_header as read_header
from .heap import HeapScan, read_heap
from .inputs import Folder, nonzero_spans, open_folder, open_input, read_at, what_is
from .liveness import lock_held
from .packed import PACKED_SUFFIX, Unpacking
from .scan import StackScan, scan_stack_spans, scan_string_spans
from .slots import read_slots

MAX_STRINGS_SIZE = 1 << 30
MAX_STACKS_SIZE = 1 << 30
MAX_CRASH_BYTES = fmt.CRASH_TEXT_MAX  # faulthandler's output for up to 100 threads fits easily
RING_SUFFIXES = (RING_SUFFIX, RING_SUFFIX + PACKED_SUFFIX)  # a ring, and one a bundle keeps (rings/*.ring.zst)


@dataclass
class Recovery:
    """Counts that say how complete a recovered ring is."""

    slots: int  # capacity declared by the header
    slots_read: int  # slots present in the file (fewer if it was truncated)
    valid: int
    empty: int
    torn: int
    stale: int
    first_seq: int | None
    last_seq: int | None
    overwritten: int  # events older than the window, overwritten by wrap-around
    holes: int  # seqs inside the window with no valid record (torn, or a ticket never written)
    strings: int
    strings_damaged: int
    sidecars_refused: int = 0  # files beside the ring not read: a link, a special file, another owner's
    labels_lost: int = 0  # events whose label string was lost (region full or entry damaged)
    time_clamped: int = 0  # events whose stamp was raised to keep time non-decreasing
    heap_live: int = 0  # version 4: valid heap-table slots (sampled blocks live at the end)
    heap_torn: int = 0  # version 4: heap-table slots cut mid-write or damaged

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Ring:
    """A ring read back: header, the valid records in seq order, and the strings."""

    path: Path
    header: fmt.Header
    words: columns.Words  # the valid records in seq order, column-major: words[w] is word w of each
    strings: dict[int, str]
    recovery: Recovery
    file_size: int
    stacks: StackScan | None = None  # version 3: the stack table
    crash: str | None = None  # faulthandler's output: the crash region (version 3) or the ``.crash`` sidecar
    owner: int = -1  # uid of the ring file's owner
    signal_stacks: dict[str, str] = field(default_factory=dict)  # signal -> its stack, from its slot (no C)
    strings_cut: int = 0  # bytes of the string region not read: its labels would cost more than scan.MAX_STRING_TEXT
    heap: HeapScan | None = None  # version 4: the heap table's valid slots
    writer_locked: bool | None = None  # a writer held its lock on the file when it was read (None: cannot tell)

    @property
    def meta(self) -> dict[str, Any]:
        """The header's metadata JSON (identity, clock, versions)."""
        return self.header.meta

    @property
    def count(self) -> int:
        """How many valid records."""
        return columns.count(self.words)

    def field(self, name: str) -> np.ndarray:
        """One field of every valid record (``columns.field``)."""
        return columns.field(self.words, name)

    @property
    def records(self) -> np.ndarray:
        """The valid records as the ring's structured dtype: a copy, made on each call. A payload word
        that a record's kind does not use (``format.payload_columns``) reads as zero (``columns.plan``)."""
        return columns.records(self.words)

    def release(self) -> None:
        """Drop the records but the last few once a timeline holds them (a big ring's slots are most of
        the memory recovery uses); ``clean`` still answers."""
        self.words = [row[-8:].copy() for row in self.words]

    @functools.cached_property
    def clean(self) -> bool:
        """True when the writer recorded a clean end (disarm); a signal that landed while the job shut
        down may be recorded after it. Worked out once (``release`` keeps the last records it reads)."""
        kinds = self.field("kind")
        return bool((kinds[-8:] == fmt.KIND_CODES["disarm"]).any()) or self.header.state == fmt.STATE_CLEAN


def read_ring(
    path: str | os.PathLike[str],
    folder: Folder | None = None,
    *,
    hold: Callable[[int], None] | None = None,
    owners: Collection[int] | None = None,
    unpacking: Unpacking | None = None,
) -> Ring:
    """Read and validate one ring file, as untrusted input (see ``inputs``): never through a link,
    never blocking on a FIFO, memory and time bounded by the bytes the file really holds. A
    ``*.zst`` is decompressed first into a private file (``unpack``: its bundle's listing bounds it).

    ``folder``: the folder holding it, already open (``path``'s name is looked up in it).
    ``hold``: given a descriptor of the file read (the decompressed file of a ``.zst``), the callee's to close,
    once its header is valid and before its slots are read (so that it can be copied meanwhile).
    ``owners``: the only uids whose rings are read (Slurm's epilogue: the job's user); another's is refused.
    ``unpacking``: the recovery's reading back of kept rings (``unpack``: a ``.zst`` is read only as its
    bundle lists it, within the recovery's budget); None: one of its own.
    """
    p = Path(path)
    name = str(p)
    with _parent(p, folder) as where:
        fd, st = open_input(where, p.name, None, "a ring file")
        try:
            if owners is not None and st.st_uid not in owners:
                raise UnsafeInputError(f"{name}: expected a ring of uid {', '.join(map(str, sorted(owners)))}, "
                                       f"found one of uid {st.st_uid} (not read)")  # fmt: skip
            locked = lock_held(fd)
            size = st.st_size
            if p.name.endswith(PACKED_SUFFIX):
                packed, fd = fd, -1
                try:
                    fd, size = (unpacking or Unpacking()).unpack(packed, where, p.name, name)
                finally:
                    os.close(packed)
            header = header_of(fd, size, name)
            if hold is not None:
                hold(os.dup(fd))
            region = max(0, min(header.strings_size, size - header.strings_offset, MAX_STRINGS_SIZE))
            scan = scan_string_spans(nonzero_spans(fd, header.strings_offset, region))
            stacks = crash = None
            if header.version >= 3:
                n = max(0, min(header.stacks_size, size - header.stacks_offset, MAX_STACKS_SIZE))
                stacks = scan_stack_spans(nonzero_spans(fd, header.stacks_offset, n), header.stacks_size)
                n = max(0, min(size - header.crash_offset, MAX_CRASH_BYTES))
                crash = _text(read_at(fd, n, header.crash_offset) if n else b"")
            heap = read_heap(fd, header, size)
            signal_stacks = _signal_slots(fd, header) if without_c_extension(header.meta) else {}
            slots = read_slots(fd, header, size)
        finally:
            if fd >= 0:
                os.close(fd)
        refused = 0
        if crash is None:
            crash, refused = _sidecar_crash(where, p.name, st.st_uid)
    seqs = columns.field(slots.words, "seq")
    first = int(seqs[0]) if len(seqs) else None
    last = int(seqs[-1]) if len(seqs) else None
    holes = (last - first + 1 - len(seqs)) if first is not None and last is not None else 0
    recovery = Recovery(
        slots=header.capacity,
        slots_read=slots.read,
        valid=len(seqs),
        empty=slots.empty,
        torn=slots.torn,
        stale=slots.stale,
        first_seq=first,
        last_seq=last,
        overwritten=(first - 1) if first is not None else 0,
        holes=holes,
        strings=scan.entries,
        strings_damaged=scan.damaged,
        sidecars_refused=refused,
        heap_live=len(heap.slots) if heap is not None else 0,
        heap_torn=heap.torn if heap is not None else 0,
    )
    return Ring(
        p, header, slots.words, scan.strings, recovery, size, stacks, crash, st.st_uid,
        signal_stacks=signal_stacks, strings_cut=scan.cut, heap=heap, writer_locked=locked,
    )  # fmt: skip


def _text(data: bytes) -> str | None:
    text = data.rstrip(b"\0")
    return text.decode("utf-8", "replace") if text.strip() else None


def _sidecar_crash(folder: Folder, ring_name: str, owner: int) -> tuple[str | None, int]:
    """(faulthandler's output that a version-1/2 writer left in ``<ring>.crash``, 1 if that file was
    refused: a link, a FIFO, a file of another owner)."""
    try:
        fd, _ = open_input(folder, ring_name + CRASH_SUFFIX, {owner}, "a crash report of the ring's owner")
    except RingNotFoundError:
        return None, 0
    except UnsafeInputError:
        return None, 1
    try:
        return _text(read_at(fd, MAX_CRASH_BYTES, 0)), 0
    finally:
        os.close(fd)


def without_c_extension(meta: dict[str, Any]) -> bool:
    """The writer said it ran without the C extension (``writer.c_extension`` false): it recorded a signal
    only where its default action ended the process, in its slot past the ring's end, and no exit record."""
    writer = meta.get("writer")
    return isinstance(writer, dict) and writer.get("c_extension") is False


def _signal_slots(fd: int, header: fmt.Header) -> dict[str, str]:
    """{signal: the stack faulthandler wrote in its slot} (a version-3 ring without the C extension)."""
    if header.version < 3:
        return {}
    slots = {n: _text(read_at(fd, fmt.SIGNAL_SLOT_SIZE, fmt.signal_slot_offset(header, i)))
             for i, n in enumerate(fmt.SIGNAL_SLOTS)}  # fmt: skip
    return {name: text for name, text in slots.items() if text is not None}



@dataclass
class Unread:
    """A ring (or a path given as one) that could not be read, and why, in one line."""

    path: Path
    error: BlackboxError

    @property
    def reason(self) -> str:
        return one_line(str(self.error))


def nothing_read(unread: list[Unread]) -> BlackboxError:
    """The error for a recovery that could read no ring at all: the first reason, and how many more."""
    first = unread[0].error
    if len(unread) == 1:
        return first
    return type(first)(f"{one_line(str(first))} (and {len(unread) - 1} more that could not be read)")


@dataclass
class Listing:
    """The rings named (ring files, or the ``*.ring`` and ``*.ring.zst`` entries of folders), each with the
    folder holding it, opened once and held open until :meth:`close`: every later read of a ring, its
    sidecars and its folder's files goes through that descriptor, never through the path again."""

    rings: list[Path] = field(default_factory=list)
    unread: list[Unread] = field(default_factory=list)
    folders: dict[Path, Folder] = field(default_factory=dict)  # each ring's folder
    stats: dict[Path, os.stat_result] = field(default_factory=dict)  # each ring as listed (lstat)
    named: list[Folder] = field(default_factory=list)  # the folders named, in order (their folded.jsonl)
    opened: list[Folder] = field(default_factory=list)  # the folders opened here (closed by close)

    def close(self) -> None:
        for folder in self.opened:
            folder.close()
        self.opened = []


def _open_named(p: Path) -> Folder | None:
    """The folder ``p`` (the invoking user named it: a link is followed), or None where ``p`` is no folder."""
    try:
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY | os.O_NONBLOCK | os.O_CLOEXEC)
    except NotADirectoryError:
        return None
    except FileNotFoundError:
        return None  # read as a ring file, which says what is there
    except OSError as exc:
        raise RingNotFoundError(f"{p}: expected a readable ring file or folder, found {exc.strerror}") from None
    return Folder(fd, p, os.fstat(fd).st_uid)


def list_rings(inputs: Sequence[Path | Folder], owners: Collection[int] | None = None) -> Listing:
    """The rings named: ring files, or folders, as paths (opened here) or as folders already open (Slurm's
    epilogue opens the job's folders itself), and those that cannot be read with their reason: a folder
    entry named ``*.ring`` that is a link or a special file, or (``owners``) a ring of another user, is
    reported, never opened. Each ring is then read with ``read_ring(path, listing.folders[path])``, which
    opens it as untrusted input again, relative to that folder."""
    out = Listing()
    for item in inputs:
        p = item.path if isinstance(item, Folder) else item
        try:
            folder = item if isinstance(item, Folder) else _open_named(item)
            if folder is None:  # a ring file named: its folder opened once, the ring looked up in it
                where = folder_of(p)
                out.opened.append(where)
                out.rings.append(p)
                out.folders[p] = where
                with contextlib.suppress(OSError):
                    out.stats[p] = os.stat(p.name, dir_fd=where.fd, follow_symlinks=False)
                continue
            if not isinstance(item, Folder):
                out.opened.append(folder)
            out.named.append(folder)
            names = [(n, st) for n, st in folder.entries() if n.endswith(RING_SUFFIXES)]
            if not names:
                raise RingNotFoundError(f"{p}: expected a folder holding *.ring (or *.ring.zst) files, found none")
            for n, st in sorted(names):
                error: BlackboxError | None = None
                if not stat.S_ISREG(st.st_mode):
                    error = UnsafeInputError(f"{p / n}: expected a ring file, found {what_is(st.st_mode)}")
                elif owners is not None and st.st_uid not in owners:
                    error = UnsafeInputError(f"{p / n}: expected a ring of uid {', '.join(map(str, sorted(owners)))}"
                                             f", found one of uid {st.st_uid} (not read)")  # fmt: skip
                if error is not None:
                    out.unread.append(Unread(p / n, error))
                    continue
                out.rings.append(p / n)
                out.folders[p / n] = folder
                out.stats[p / n] = st
        except BlackboxError as exc:
            out.unread.append(Unread(p, exc))
    return out


def find_rings(paths: list[Path]) -> list[Path]:
    """Expand folders to the regular ``*.ring`` files inside them (sorted; links and special files are
    left out); keep files as given."""
    out: list[Path] = []
    for p in paths:
        if p.is_dir():
            with open_folder(p) as folder:
                found = [p / n for n, st in folder.entries() if n.endswith(RING_SUFFIX) and stat.S_ISREG(st.st_mode)]
            if not found:
                raise RingNotFoundError(f"{p}: expected a folder holding *.ring files, found none")
            out.extend(found)
        elif p.exists() or p.is_symlink():
            out.append(p)
        else:
            raise RingNotFoundError(f"{p}: expected a ring file or a folder of rings, found nothing")
    return out
