"""A ring kept zstd-compressed (``<name>.ring.zst``, in a bundle's ``rings/``), and read back.

:func:`pack` streams a ring open at a descriptor into one zstd frame, a chunk at a time: memory is a
chunk and the compressor's window, whatever the ring's size. :class:`KeptRings` holds the descriptors
of the rings a recovery read (never a path opened again by name: the rings are untrusted and recovery
may run as root), up to ``MAX_KEPT_RINGS`` rings and ``MAX_KEPT_BYTES`` bytes.

Reading one back (:class:`Unpacking`): a kept ring is checked against its bundle and bounded in work.
A bundle is untrusted input like a ring: anyone who can write one can plant a ``.zst`` of a few KiB that
decompresses to gigabytes, and ``summary.md`` tells its readers to run ``blackbox recover BUNDLE/rings``.
So a ``.zst`` is read only as a ring its bundle kept, and what reading it costs is bounded three ways:

- **Its bundle's word**: ``metadata.json`` beside ``rings/`` (reached from the ``rings/`` folder's own
  descriptor, never a path) lists each kept ring's ``raw_bytes`` and ``sha256`` (``raw_rings.kept``). A
  ``.zst`` it does not list is refused (``zstd -dc`` gives the ring back, to read as any ring on disk);
  decompressing stops past ``raw_bytes`` (and past the size the ring's own header declares), and the
  ring is read only once its bytes hash to ``sha256``: a ring cut short, changed or padded is refused in
  one line, never half-used.
- **Its own size**: zero pages are left as holes, and the other pages it writes are at most
  ``MAX_RATIO`` times the ``.zst``'s size plus ``RATIO_FLOOR`` (a ring's string region and stack table, a
  MiB each, may hold text that compresses far better than its records, which compress 17 to 19 times:
  ``tools/raw_ring_ratio.py``). A 33 KB ``.zst`` declaring 1 GiB of non-zero bytes stops at 18 MiB.
- **The recovery's budget**: one recovery decompresses at most ``MAX_KEPT_BYTES`` (2 GiB: all a bundle
  ever keeps) in all, zeros included: each ``.zst`` takes its listed ``raw_bytes`` from it before it is
  read (and a refused one does not give them back); the rings beyond it are named unread. A bundle of 64
  planted ``.zst`` costs that much work at most, not 64 times 4 GiB.

The ring is decompressed into a new private file (``O_EXCL``, mode 0600, in a private folder, both unlinked
at once: only the descriptor remains) that the reader then reads as any ring.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import numpy as np
import zstandard

from .._errors import BlackboxError, NotARingError, UnsafeInputError, one_line
from . import format as fmt
from .inputs import FOLDER_FLAGS, Folder, open_input, read_at
from .tree import identity

PACKED_SUFFIX = ".zst"
LEVEL = 1  # a full default ring: 1.81 MiB (level 3: 1.86 MiB), in about 50 ms either way
CHUNK = 1 << 20  # bytes compressed or decompressed at a time
MAX_KEPT_RINGS = 64  # rings one bundle keeps raw (their descriptors are held until the bundle is written)
MAX_KEPT_BYTES = 2 << 30  # raw bytes one bundle keeps (some 60 default rings); the rest are skipped, and named
MAX_AHEAD_BYTES = 16 << 20  # compressed bytes held in memory by the compression ahead (a full default ring: 1.8 MiB)


@dataclass
class Packed:
    """What :func:`pack` wrote: the ring's bytes, the frame's, and the SHA-256 of the ring's bytes."""

    raw_bytes: int
    compressed_bytes: int
    sha256: str


def pack(fd: int, size: int, sink: BinaryIO) -> Packed:
    """Compress the first ``size`` bytes of the file open at ``fd`` (fewer where it shrank meanwhile)
    into ``sink`` as one zstd frame, CHUNK bytes at a time. zstd and hashlib let go of the GIL meanwhile."""
    digest = hashlib.sha256()
    compressor = zstandard.ZstdCompressor(level=LEVEL).compressobj()
    raw = written = 0
    while raw < size:
        chunk = os.pread(fd, min(CHUNK, size - raw), raw)
        if not chunk:
            break
        raw += len(chunk)
        digest.update(chunk)
        out = compressor.compress(chunk)
        sink.write(out)
        written += len(out)
    out = compressor.flush()
    sink.write(out)
    return Packed(raw, written + len(out), digest.hexdigest())


@dataclass
class Compressed:
    """A ring compressed ahead, in memory: its frame's pieces, and what :func:`pack` said."""

    pieces: list[bytes]
    packed: Packed


class _NoRoom(Exception):
    pass


class _Pieces:
    """A sink for :func:`pack` that keeps what it is given, up to ``room`` bytes."""

    def __init__(self, room: int) -> None:
        self.pieces: list[bytes] = []
        self.room = room

    def write(self, piece: bytes) -> None:
        self.room -= len(piece)
        if self.room < 0:
            raise _NoRoom
        self.pieces.append(piece)


def compress(fd: int, size: int, room: int) -> Compressed | None:
    """:func:`pack` into memory; None (nothing kept) once the frame passes ``room`` bytes."""
    sink = _Pieces(room)
    try:
        packed = pack(fd, size, cast(BinaryIO, sink))
    except _NoRoom:
        return None
    return Compressed(sink.pieces, packed)


def stored_name(path: Path, taken: set[str]) -> str:
    """The name of a ring's ``.zst`` in ``rings/``: its own (``.ring`` added where it lacks it), or
    ``ring-<n>.ring`` where that is not printable ASCII or is long; unique among ``taken``, and added to it."""
    name = path.name.removesuffix(PACKED_SUFFIX)
    name = name if name.endswith(".ring") else f"{name}.ring"
    if not (name.isascii() and name.isprintable()) or len(name) > 200 or name.startswith("."):
        name = f"ring-{len(taken)}.ring"
    stem, n = name.removesuffix(".ring"), 1
    while name in taken:
        n += 1
        name = f"{stem}.{n}.ring"
    taken.add(name)
    return name + PACKED_SUFFIX


class KeptRings:
    """The rings a recovery keeps raw, each held by a descriptor from its reading until the bundle
    packs it: the first ``MAX_KEPT_RINGS`` rings read, within ``MAX_KEPT_BYTES`` bytes; the others
    closed and listed in ``skipped`` with the reason. ``close()`` closes every descriptor it was given.

    While the rings are decoded, one thread compresses them ahead into memory (at most ``MAX_AHEAD_BYTES``
    of compressed bytes in all): the bundle then only writes them, after its timeline as before, where a
    full disk still takes the raw rings before the rest. Once a ring does not fit (or would not, at the
    ratio seen so far), no more are compressed ahead: the rest are packed as they are written, none twice."""

    def __init__(self) -> None:
        self.held: list[tuple[Path, int, int]] = []  # (the ring, its descriptor, its size)
        self.skipped: list[dict[str, Any]] = []
        self.bytes = 0
        self.max_rings, self.max_bytes = MAX_KEPT_RINGS, MAX_KEPT_BYTES
        self._read: dict[Path, list[int]] = {}  # descriptors of rings read, not yet offered (from threads)
        self._lock = threading.Lock()
        self._ahead: dict[int, Future[Compressed | None]] = {}  # descriptor -> its compression ahead
        self._ahead_rings = self._ahead_bytes = 0  # rings (and their bytes) ever sent to be compressed ahead
        self._room = MAX_AHEAD_BYTES  # compressed bytes the compression ahead may still hold
        self._seen = [0, 0]  # raw and compressed bytes of the rings compressed ahead: the ratio to expect
        self._full = self._closed = False  # no more compressing ahead; no more descriptors taken
        self._pool: ThreadPoolExecutor | None = None

    def hold(self, path: Path, fd: int) -> None:
        """A descriptor of the ring being read at ``path``, from now on this object's to close."""
        with self._lock:
            if self._closed:  # a decode still running when the bundle gave up
                os.close(fd)
                return
            self._read.setdefault(path, []).append(fd)
            try:
                size = os.fstat(fd).st_size
            except OSError:
                return
            if not self._full and self._ahead_rings < self.max_rings and self._ahead_bytes + size <= self.max_bytes:
                self._ahead_rings += 1
                self._ahead_bytes += size
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(1, thread_name_prefix="blackbox-pack")
                self._ahead[fd] = self._pool.submit(self._compress, fd, size)

    def _compress(self, fd: int, size: int) -> Compressed | None:
        with self._lock:
            room, (raw, packed) = self._room, self._seen
            if self._full or room <= 0 or (raw and size * packed > room * raw):  # it would not fit
                self._full = True
                return None
        done = compress(fd, size, room)
        with self._lock:
            if done is None:
                self._full = True  # what it read is lost: no other ring is read twice
            else:
                self._room -= done.packed.compressed_bytes
                self._seen = [raw + done.packed.raw_bytes, packed + done.packed.compressed_bytes]
        return done

    def offer(self, path: Path) -> None:
        """Keep the ring at ``path`` (recovered: its descriptor was given to ``hold``), or skip it."""
        with self._lock:
            fd = self._read[path].pop(0)
        size = os.fstat(fd).st_size
        if len(self.held) >= self.max_rings:
            why = f"beyond the first {self.max_rings} rings"
        elif self.bytes + size > self.max_bytes:
            why = f"beyond {self.max_bytes} bytes of rings"
        else:
            self.held.append((path, fd, size))
            self.bytes += size
            return
        self.release(self.take(fd, size))  # (its compression ahead waited for, and dropped)
        os.close(fd)
        self.skipped.append({"ring": str(path), "raw_bytes": size, "reason": f"not kept: {why}"})

    def take(self, fd: int, size: int) -> Compressed | None:
        """The ring at ``fd`` compressed ahead, once that is done, where it holds ``size`` bytes: None where
        it was not compressed ahead, failed, did not fit in memory, or the ring's size changed since. Give
        it to ``release`` once written."""
        with self._lock:
            future = self._ahead.pop(fd, None)
        if future is None or future.cancel():
            return None
        try:
            done = future.result()
        except Exception:  # noqa: BLE001 (a read error: the ring is packed again, and says why there)
            return None
        if done is not None and done.packed.raw_bytes != size:
            self.release(done)
            return None
        return done

    def release(self, done: Compressed | None) -> None:
        """The memory of a ring compressed ahead, written (or dropped): room for the next."""
        if done is not None:
            with self._lock:
                self._room += done.packed.compressed_bytes
            done.pieces.clear()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            fds = [fd for _, fd, _ in self.held] + [fd for read in self._read.values() for fd in read]
            self.held, self._read = [], {}
            pool, self._pool = self._pool, None
        if pool is not None:  # no descriptor is closed under a compression still reading it
            pool.shutdown(wait=True, cancel_futures=True)
        self._ahead.clear()
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


MAX_UNPACKED_BYTES = MAX_KEPT_BYTES  # the largest ring read back (a bundle keeps none larger)
MAX_UNPACKED_TOTAL = MAX_KEPT_BYTES  # decompressed by one recovery in all
MAX_WINDOW = 1 << 25  # a frame asking the decompressor for a larger window is refused (level 1 uses 512 KiB)
MAX_RATIO = 64  # non-zero bytes written per byte of .zst, beyond RATIO_FLOOR
RATIO_FLOOR = 16 << 20
MAX_LISTING_BYTES = 32 << 20  # the bundle's metadata.json read for its raw_rings (as the job view reads it)
MAX_LISTING_VALUES = 4_000_000
RAW_RINGS = "rings/"
_PAGE = 4096
_HEX64 = re.compile(r"[0-9a-f]{64}")
_UNZIP = "`zstd -dc` gives the ring back, to recover as it is"


@dataclass(frozen=True)
class Listed:
    """What a bundle says of a ring it kept."""

    raw_bytes: int
    sha256: str


class Unpacking:
    """One recovery's reading back of kept rings: each bundle's listing read once, and at most ``budget``
    bytes decompressed in all. Shared by the recovery's threads."""

    def __init__(self, budget: int | None = None) -> None:
        self.budget = MAX_UNPACKED_TOTAL if budget is None else budget
        self.left = self.budget
        self._lock = threading.Lock()
        self._listings: dict[tuple[int, int], dict[str, Listed] | BlackboxError] = {}

    def unpack(self, fd: int, rings: Folder, name: str, where: str) -> tuple[int, int]:
        """Decompress the ``.zst`` open at ``fd`` (``name`` in the folder ``rings``; ``where`` names it in
        messages) into a new private file once its bundle's listing, the ratio and the budget allow:
        (its descriptor, its size). Raises NotARingError or UnsafeInputError in one line."""
        listed = self._listed(rings, where).get(name)
        if listed is None:
            raise UnsafeInputError(f"{where}: expected a ring its bundle kept (listed in raw_rings of the "
                                   f"metadata.json beside rings/), found none listed; {_UNZIP}")  # fmt: skip
        if listed.raw_bytes > MAX_UNPACKED_BYTES:
            raise UnsafeInputError(f"{where}: expected a kept ring of at most {MAX_UNPACKED_BYTES} bytes, "
                                   f"found {listed.raw_bytes} listed (not read); {_UNZIP}")  # fmt: skip
        with self._lock:
            if listed.raw_bytes > self.left:
                raise UnsafeInputError(
                    f"{where}: not read, its {listed.raw_bytes} bytes beyond what one recovery decompresses "
                    f"({self.budget} bytes in all, {self.left} left); recover it alone"
                )
            self.left -= listed.raw_bytes
        out = _private_file()
        try:
            return out, _decompress(fd, out, where, listed, os.fstat(fd).st_size)
        except BaseException:  # what was reserved stays spent: a refused .zst is damaged or planted
            os.close(out)
            raise

    def _listed(self, rings: Folder, where: str) -> dict[str, Listed]:
        key = identity(os.fstat(rings.fd))
        with self._lock:
            if key not in self._listings:
                try:
                    self._listings[key] = listing(rings)
                except BlackboxError as exc:
                    self._listings[key] = exc
            found = self._listings[key]
        if isinstance(found, BlackboxError):
            raise type(found)(f"{where}: expected a ring its bundle kept, but {one_line(str(found))}; {_UNZIP}")
        return found


def listing(rings: Folder) -> dict[str, Listed]:
    """``raw_rings.kept`` of the bundle whose ``rings/`` folder is open as ``rings``: {file name in rings/:
    what the bundle says of it}. The bundle's folder is the real parent of that descriptor (``..``), its
    metadata.json a regular file of its owner's, read as untrusted input within bounds."""
    try:
        parent = os.open("..", FOLDER_FLAGS, dir_fd=rings.fd)
    except OSError as exc:
        raise UnsafeInputError(f"{rings.path}/..: expected the bundle's folder, found {exc.strerror}") from None
    with Folder(parent, rings.path.parent, os.fstat(parent).st_uid) as bundle:
        fd, _ = open_input(bundle, "metadata.json", {bundle.uid}, "the bundle's metadata.json")
    try:
        raw = read_at(fd, MAX_LISTING_BYTES + 1, 0)
    finally:
        os.close(fd)
    where = f"{bundle.path}/metadata.json"
    values = raw.count(b",") + raw.count(b":") + raw.count(b"{") + raw.count(b"[") + 1
    if len(raw) > MAX_LISTING_BYTES or values > MAX_LISTING_VALUES:
        raise UnsafeInputError(f"{where}: expected at most {MAX_LISTING_BYTES} bytes and {MAX_LISTING_VALUES} "
                               f"JSON values, found more (not read)")  # fmt: skip
    try:
        meta = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise UnsafeInputError(f"{where}: expected JSON, found {type(exc).__name__}") from None
    kept = (meta.get("raw_rings") or {}).get("kept") if isinstance(meta, dict) else None
    out: dict[str, Listed] = {}
    for entry in kept if isinstance(kept, list) else []:
        if not isinstance(entry, dict):
            continue
        file, size, sha = entry.get("file"), entry.get("raw_bytes"), entry.get("sha256")
        if (isinstance(file, str) and file.startswith(RAW_RINGS) and file.endswith(PACKED_SUFFIX)
                and type(size) is int and size >= 0 and isinstance(sha, str) and _HEX64.fullmatch(sha)):  # fmt: skip
            out[file[len(RAW_RINGS) :]] = Listed(size, sha)
    return out


def _private_file() -> int:
    """A new file, 0600, made with O_EXCL in a new 0700 folder; both unlinked before it is written."""
    folder = tempfile.mkdtemp(prefix="blackbox-unpack-")
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open("ring", flags, 0o600, dir_fd=dir_fd)
            os.unlink("ring", dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
    finally:
        os.rmdir(folder)
    return fd


def _decompress(src: int, dst: int, name: str, listed: Listed, compressed: int) -> int:
    """Decompress ``src`` (``compressed`` bytes) into ``dst`` (zero pages left as holes), stopping past what
    ``listed`` and the ring's header (in the first MiB) allow, or once its non-zero pages pass the ratio;
    then check its sha256. Returns the bytes decompressed."""
    room = RATIO_FLOOR + MAX_RATIO * compressed
    head = b""
    limit = -1  # until the header is read
    written = stored = 0
    digest = hashlib.sha256()
    source = os.fdopen(os.dup(src), "rb")
    decompressor = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    with source, decompressor.stream_reader(source, read_size=CHUNK) as reader:
        while True:
            try:
                chunk = reader.read(CHUNK)
            except zstandard.ZstdError as exc:
                if limit < 0:
                    raise NotARingError(
                        f"{name}: expected a zstd-compressed ring (a window of at most {MAX_WINDOW >> 20} MiB), "
                        f"found data zstd refuses ({exc})"
                    ) from None
                break  # damaged past the header: its hash says so below
            if limit < 0:
                head += chunk
                if chunk and len(head) < fmt.MAX_HEADER_SIZE:
                    continue
                header = fmt.decode_header(head, len(head), f"{name} (decompressed)")
                limit = min(header.file_size, listed.raw_bytes)
                chunk, head = head, b""
            if written + len(chunk) > limit:
                raise UnsafeInputError(
                    f"{name}: expected at most {limit} bytes once decompressed (what its bundle lists and its "
                    f"ring header declares), found more (not read further)"
                )
            stored += _put(dst, chunk, written)
            if stored > room:
                raise UnsafeInputError(
                    f"{name}: expected at most {RATIO_FLOOR >> 20} MiB and {MAX_RATIO} times its {compressed} bytes "
                    f"once decompressed (zero pages aside), found more (not read further)"
                )
            digest.update(chunk)
            written += len(chunk)
            if not chunk:
                break
    os.ftruncate(dst, written)
    if written != listed.raw_bytes or digest.hexdigest() != listed.sha256:
        raise UnsafeInputError(
            f"{name}: expected the {listed.raw_bytes} bytes of sha256 {listed.sha256[:16]}... its bundle lists, "
            f"found {written} bytes of sha256 {digest.hexdigest()[:16]}... (not read); {_UNZIP}"
        )
    return written


def _put(fd: int, chunk: bytes, at: int) -> int:
    """Write the pages of ``chunk`` that are not all zero at ``at`` (the others stay holes); the bytes written."""
    if not chunk:
        return 0
    n = -(-len(chunk) // _PAGE)
    used = np.flatnonzero(np.frombuffer(chunk.ljust(n * _PAGE, b"\0"), np.uint64).reshape(n, _PAGE // 8).any(axis=1))
    if not len(used):
        return 0
    breaks = np.flatnonzero(np.diff(used) != 1)
    stored = 0
    for first, last in zip([int(used[0]), *used[breaks + 1].tolist()], [*used[breaks].tolist(), int(used[-1])],
                           strict=True):  # fmt: skip
        piece = chunk[first * _PAGE : (last + 1) * _PAGE]
        os.pwrite(fd, piece, at + first * _PAGE)
        stored += len(piece)
    return stored
