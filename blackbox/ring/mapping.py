"""The ring's shared mapping, made with libc's ``mmap`` so that it holds no descriptor.

Python's ``mmap.mmap`` keeps a ``dup()`` of the file descriptor (at the lowest
free number) and closes that number when the map is closed. A job that closed
every descriptor and opened its own files would then have one of them closed
by our disarm. This mapping keeps none: the kernel's mapping keeps the file
alive by itself. ``buffer`` is a writable buffer over the mapped bytes
(unsigned bytes, as ``bytearray``); every view of it must be released before
``close()`` unmaps it, which the recorder's teardown order guarantees (writer,
signal recorder, stack table, then the mapping).

Residency: the mapping is whole, but its pages are not kept in this process's
page tables. ``drop()`` unmaps a range's pages with ``MADV_DONTNEED``, which on a
``MAP_SHARED`` file mapping only zaps the page-table entries: what was written
stays in the page cache (it is the file), survives the process's death, and is
faulted back in by the next write. Pages mapped in count in the process's RSS,
and so in the kernel OOM killer's choice of victim; page cache does not.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from typing import Any

# libc from the symbols the interpreter already has (dlopen(NULL)): ctypes.util.find_library would run
# `ldconfig -p` (and gcc where that fails) in a child process at every import, inside the job being armed
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.msync.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
# madvise with the GIL held (PyDLL): close() clears ``addr`` under the GIL before it unmaps, so a
# drop() never runs on an address that another mapping may have taken since.
_madvise_held = ctypes.PyDLL(None, use_errno=True).madvise
_madvise_held.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_MAP_FAILED = ctypes.c_void_p(-1).value
_MS_SYNC = 4
_MAP_FIXED, _MAP_ANONYMOUS, _MAP_NORESERVE = 0x10, 0x20, 0x4000
MADV_DONTNEED = getattr(mmap, "MADV_DONTNEED", 4)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


class RingMap:
    """``size`` bytes of the file ``fd`` mapped shared, read-write. ``len()`` is its size."""

    def __init__(self, fd: int, size: int) -> None:
        addr = _libc.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == _MAP_FAILED:
            err = ctypes.get_errno()
            raise OSError(err, f"mmap: {os.strerror(err)}")
        self.addr: int | None = addr
        self.size = size
        self.buffer: Any = memoryview((ctypes.c_ubyte * size).from_address(addr)).cast("B")

    def __len__(self) -> int:
        return self.size

    def write(self, offset: int, data: bytes) -> None:
        self.buffer[offset : offset + len(data)] = data

    def drop(self, offset: int, length: int) -> None:
        """Unmap the pages of ``[offset, offset + length)`` from this process (rounded inwards to
        whole pages): they leave its RSS, their bytes stay in the file. Best effort, never raises."""
        addr = self.addr
        start = -(-offset // mmap.PAGESIZE) * mmap.PAGESIZE
        end = min(offset + length, self.size) // mmap.PAGESIZE * mmap.PAGESIZE
        if addr is not None and end > start:
            _madvise_held(addr + start, end - start, MADV_DONTNEED)

    def drop_idle(self, records_offset: int, records_end: int, sequence: Any) -> None:
        """Unmap every page this process no longer writes: the header, the strings and stack entries
        written since the last call, the crash region's pages that a fault next door mapped, and every
        record page outside the write window that ``sequence`` (the C seq counter) keeps; without it,
        all record pages. Between two calls the ring adds to the RSS the window (two chunks; without
        the C extension, the records written since) and what was written to strings and stacks."""
        self.drop(0, records_offset)
        self.drop(records_end, self.size - records_end)
        if sequence is None or not sequence.trim():
            self.drop(records_offset, records_end - records_offset)

    def flush(self) -> None:
        """msync: what is written so far reaches the disk (survives a kernel crash or power loss)."""
        if self.addr is not None:
            _check(_libc.msync(self.addr, self.size, _MS_SYNC), "msync")

    def close(self) -> None:
        """Unmap. Safe to call twice. Every view must have been released first; where a C-level
        export still holds the buffer, the file mapping is replaced in place by an anonymous one
        instead (address space only): nothing can then write to the file or fault."""
        addr, self.addr = self.addr, None
        if addr is None:
            return
        try:
            self.buffer.release()
        except BufferError:
            flags = mmap.MAP_PRIVATE | _MAP_FIXED | _MAP_ANONYMOUS | _MAP_NORESERVE
            _libc.mmap(addr, self.size, mmap.PROT_READ | mmap.PROT_WRITE, flags, -1, 0)
            return
        _check(_libc.munmap(addr, self.size), "munmap")
