"""A ring kept zstd-compressed (``<name>.ring.zst``, in a bundle's ``rings/``), and read back.

:func:`pack` streams a ring open at a descriptor into one zstd frame, a chunk at a time: memory is a
chunk and the compressor's window, whatever the ring's size. :class:`KeptRings` holds the descriptors
of the rings a recovery read (never a path opened again by name: the rings are untrusted and recovery
may run as root), up to ``MAX_KEPT_RINGS`` rings and ``MAX_KEPT_BYTES`` bytes.

:func:`unpack` decompresses an untrusted ``.zst`` into a new private file (``O_EXCL``, mode 0600, in
a private folder, both unlinked at once: only the descriptor remains) that the reader then reads as
any ring. A decompression bomb is refused: decompressing stops past the file size the ring's own
header declares, and never goes past ``MAX_UNPACKED_BYTES``; runs of zeros are left as holes.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, cast

import zstandard

from .._errors import NotARingError
from . import format as fmt

PACKED_SUFFIX = ".zst"
LEVEL = 1  # a full default ring: 1.81 MiB (level 3: 1.86 MiB), in about 50 ms either way
CHUNK = 1 << 20  # bytes compressed or decompressed at a time
MAX_UNPACKED_BYTES = 4 << 30  # the largest ring read back from a .zst, whatever its header declares
MAX_WINDOW = 1 << 25  # a frame asking the decompressor for a larger window is refused (LEVEL uses 512 KiB)
MAX_KEPT_RINGS = 64  # rings one bundle keeps raw (their descriptors are held until the bundle is written)
MAX_KEPT_BYTES = 2 << 30  # raw bytes one bundle keeps (some 60 default rings); the rest are skipped, and named
MAX_AHEAD_BYTES = 16 << 20  # compressed bytes held in memory by the compression ahead (a full default ring: 1.8 MiB)
_ZEROS = bytes(CHUNK)


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


def unpack(fd: int, name: str) -> tuple[int, int]:
    """Decompress the zstd-compressed ring open at ``fd`` into a new private file: (its descriptor, its
    size). Raises NotARingError (one line naming ``name``) for what is not zstd, or not a ring, and for
    a ring that decompresses past the size its header declares (or ``MAX_UNPACKED_BYTES``)."""
    out = _private_file()
    try:
        return out, _decompress(fd, out, name)
    except BaseException:
        os.close(out)
        raise


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


def _decompress(src: int, dst: int, name: str) -> int:
    """Decompress ``src`` into ``dst`` (zero chunks left as holes), stopping past the limit that the
    ring's header, in the first MiB, sets. Returns the bytes decompressed."""
    head = b""
    limit = -1  # until the header is read
    written = 0
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
                break  # damaged past the header: the ring is salvaged as far as it was decompressed
            if limit < 0:
                head += chunk
                if chunk and len(head) < fmt.MAX_HEADER_SIZE:
                    continue
                header = _header(head, name)
                limit = min(header.file_size, MAX_UNPACKED_BYTES)
                chunk, head = head, b""
            if written + len(chunk) > limit:
                raise NotARingError(
                    f"{name}: expected at most {limit} bytes once decompressed (the size its ring header "
                    f"declares, at most {MAX_UNPACKED_BYTES}), found more (not read further)"
                )
            if chunk != _ZEROS[: len(chunk)]:
                os.pwrite(dst, chunk, written)
            written += len(chunk)
            if not chunk:
                break
    os.ftruncate(dst, written)
    return written


def _header(head: bytes, name: str) -> fmt.Header:
    """The header at the start of the decompressed bytes ``head`` (raises NotARingError and its kin)."""
    return fmt.decode_header(head, len(head), f"{name} (decompressed)")
