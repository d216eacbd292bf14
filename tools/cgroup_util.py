"""A child memory cgroup with a limit, for the tools that need a real kernel OOM kill (cgroup v1 or v2)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blackbox.collect.host import find_memory_cgroup  # noqa: E402


class CgroupRefused(Exception):
    """No child memory cgroup can be made here; the message says why."""


@contextmanager
def child_memory_cgroup(limit: int, name: str) -> Iterator[tuple[Path, int]]:
    """(directory, cgroup version) of a fresh child of this process's memory cgroup; removed after."""
    own = find_memory_cgroup()
    if own is None:
        raise CgroupRefused("no memory cgroup (cgroup v1 memory controller or v2 memory.current)")
    cg = own.directory / f"{name}-{os.getpid()}"
    try:
        cg.mkdir()
        (cg / ("memory.max" if own.version == 2 else "memory.limit_in_bytes")).write_text(str(limit))
    except OSError as exc:
        raise CgroupRefused(f"the kernel refused a child memory cgroup (cgroup v{own.version}): {exc}") from None
    try:
        yield cg, own.version
    finally:
        for _ in range(50):  # the killed task leaves the cgroup a moment after its parent reaps it
            try:
                cg.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def join(cg: Path) -> None:
    """In a child between fork and exec: move it into the cgroup."""
    (cg / "cgroup.procs").write_text(str(os.getpid()))
