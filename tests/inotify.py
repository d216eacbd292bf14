"""inotify(7) for race tests: an attacker who waits for root to touch a folder, then swaps it.

An attack on a check-then-use gap is won by luck when the attacker swaps at random; an attacker who is
told by the kernel the moment root opens or lists her folder (``IN_OPEN``, ``IN_ACCESS``: a listing
raises both on the folder itself) swaps inside the gap every time the gap is longer than a swap. The
tests widen the gap the way a real attacker would (many entries for root to list between the check and
the use), so that a swap of a few system calls lands in it whatever the machine's load.
"""

from __future__ import annotations

import ctypes
import os
import select
import struct
from pathlib import Path

IN_ACCESS = 0x00000001
IN_OPEN = 0x00000020
IN_CLOEXEC = 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


class Watch:
    """Events on the folders added with :meth:`add`, read with :meth:`wait`."""

    def __init__(self) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self.libc.inotify_init1(IN_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.names: dict[int, Path] = {}

    def add(self, path: Path, mask: int = IN_OPEN | IN_ACCESS) -> None:
        wd = self.libc.inotify_add_watch(self.fd, os.fsencode(path), mask)
        if wd < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch", str(path))
        self.names[wd] = path

    def wait(self, timeout: float) -> Path:
        """The folder of the first event to come (blocks up to ``timeout`` seconds; TimeoutError after)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            raise TimeoutError(f"no event on {sorted(map(str, self.names.values()))} in {timeout} s")
        data = os.read(self.fd, 64 * 1024)
        wd = _EVENT.unpack_from(data)[0]
        return self.names[wd]

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
