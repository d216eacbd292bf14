"""Facts about a death that live outside the ring, gathered at recovery time.

The diagnosis itself (``diagnosis``) is a pure function; this module is the
part that looks at the machine: is the writer still alive, did the kernel log
an OOM kill of its pid, what does the job's memory cgroup's ``oom_kill``
counter say now, did faulthandler leave a native crash's tracebacks beside it.
Each fact is only used when it can belong to the ring: same host, same boot.
Every read is bounded and failure-tolerant (None = unknown).
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..collect.host import CgroupPaths, effective_limit_file, oom_counter_file, oom_kill_count
from ..ring.file import CRASH_SUFFIX, sidecar
from ..ring.liveness import boot_id, writer_alive

MAX_KMSG_BYTES = 8 << 20
MAX_CRASH_BYTES = 1 << 20


@dataclass
class Evidence:
    """What recovery could learn beyond the ring (None where it could not tell)."""

    same_host: bool = False
    same_boot: bool | None = None
    writer_alive: bool | None = None
    kernel_oom_line: str | None = None  # the kernel's "Killed process <pid>" line for this pid
    cgroup_oom_kills_now: int | None = None
    exit_status: int | None = None  # as a shell reports it (128 + signal), from `blackbox run`
    crash: str | None = None  # faulthandler's tracebacks left beside the ring (a native crash)
    notes: list[str] = field(default_factory=list)


def gather(
    ring: Path,
    meta: dict[str, Any],
    exit_status: int | None = None,
    kernel: dict[int, str] | None = None,
    crash: str | None = None,
) -> Evidence:
    """Evidence for one ring: a native crash's tracebacks (``crash``, from the ring's crash region;
    else the ``.crash`` sidecar older rings left), and what this machine says of its writer
    (from the header metadata's identity and cgroup).

    ``kernel``: the kernel's OOM-kill lines by pid, when the caller scanned the log once for
    several rings; None scans it for this ring's pid.
    """
    ident = meta.get("identity") or {}
    ev = Evidence(exit_status=exit_status, crash=crash if crash is not None else read_crash_file(ring))
    ev.same_host = ident.get("host") == socket.gethostname()
    if not ev.same_host:
        ev.notes.append("recovered on another host: no kernel log, cgroup or process evidence")
        return ev
    ring_boot, now_boot = ident.get("boot_id"), boot_id()
    ev.same_boot = None if not ring_boot or not now_boot else ring_boot == now_boot
    pid = ident.get("pid")
    if ev.same_boot is False or not isinstance(pid, int):
        return ev
    ev.writer_alive = writer_alive(ring, meta)
    ev.kernel_oom_line = (kernel if kernel is not None else kernel_oom_kills({pid})).get(pid)
    cg = meta.get("cgroup") or {}
    if isinstance(cg.get("path"), str) and cg.get("version") in (1, 2):
        ev.cgroup_oom_kills_now = cgroup_oom_kills(Path(cg["path"]), int(cg["version"]))
    return ev


_KILLED = re.compile(r"(?:Memory cgroup out of memory|Out of memory|oom-kill).*?Killed process (\d+) \(")


def kernel_oom_kills(pids: set[int], kmsg: str = "/dev/kmsg") -> dict[int, str]:
    """The kernel log lines reporting OOM kills of these pids (one bounded pass over the log),
    where the log is readable."""
    found: dict[int, str] = {}
    if not pids:
        return found
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return found
    read = 0
    try:
        while read < MAX_KMSG_BYTES:
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                break  # the end of the buffer
            except OSError:
                continue  # EPIPE: records were overwritten while reading; go on
            if not record:
                break
            read += len(record)
            text = record.decode("utf-8", "replace")
            m = _KILLED.search(text)
            if m and int(m.group(1)) in pids:
                found[int(m.group(1))] = text.split(";", 1)[-1].strip()
    finally:
        os.close(fd)
    return found


def cgroup_oom_kills(directory: Path, version: int) -> int | None:
    """The ``oom_kill`` counter where the job's memory limit is (the cgroup or the ancestor that limits it)."""
    limit_name = "memory.max" if version == 2 else "memory.limit_in_bytes"
    usage_name = "memory.current" if version == 2 else "memory.usage_in_bytes"
    if not directory.is_dir():
        return None
    cg = CgroupPaths(version, directory, directory / usage_name, directory / limit_name)
    try:
        text = oom_counter_file(cg, effective_limit_file(cg)).read_text()
    except OSError:
        return None
    return oom_kill_count(text)


def read_crash_file(ring: Path) -> str | None:
    """The faulthandler output left beside a ring, bounded; None if there is none."""
    try:
        with open(sidecar(ring, CRASH_SUFFIX), "rb") as f:
            data = f.read(MAX_CRASH_BYTES)
    except OSError:
        return None
    return data.decode("utf-8", "replace") if data.strip() else None
