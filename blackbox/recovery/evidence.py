"""Facts about a death that live outside the ring, gathered once at recovery time.

The diagnosis itself (``diagnosis``) is a pure function; this module is the part
that looks at the machine: is the writer still alive (by its lock, see
``ring.liveness``), which OOM kills did the kernel log (read once for every
ring: ``kernel_oom_kills``), what does the job's memory cgroup's ``oom_kill``
counter say now, did faulthandler leave a native crash's tracebacks. Each fact
is only used when it can belong to the ring: same host, same boot, and for a
kernel kill, a time inside the ring's life (the kernel stamps its log with the
monotonic clock the ring uses), so a pid reused by a later job is never
blamed for an earlier kill. Every read is bounded and failure-tolerant.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..collect.host import CgroupPaths, effective_limit_file, oom_counter_file, oom_kill_count
from ..ring.file import filesystem_type
from ..ring.liveness import boot_id, same_machine, writer_alive
from .slurm import slurm_account

MAX_KMSG_BYTES = 8 << 20
MAX_REPORT_LINES = 400
# The kernel stamps a kill just after sending SIGKILL; the victim's other threads may write for a moment
# more. Measured here: the kernel log's stamps and CLOCK_MONOTONIC agree to well under a millisecond.
SLACK_NS = 100_000_000
CGROUP_FS = ("cgroup", "cgroup2")


@dataclass
class KernelKill:
    """One OOM kill in the kernel log: when (monotonic ns, the ring's clock), whom, and the report."""

    time_ns: int
    pid: int
    name: str
    line: str  # "Memory cgroup out of memory: Killed process <pid> (<name>) total-vm:... anon-rss:..."
    report: list[str] = field(default_factory=list)  # from "invoked oom-killer" to the kill line
    tasks: list[dict[str, Any]] = field(default_factory=list)  # the report's task table

    @property
    def rss(self) -> dict[str, int]:
        """anon-rss, file-rss, shmem-rss of the victim at the kill, bytes."""
        return {k.replace("-", "_"): int(v) << 10 for k, v in re.findall(r"(\w+-rss):(\d+)kB", self.line)}


@dataclass
class Evidence:
    """What recovery could learn beyond the ring (None where it could not tell)."""

    same_host: bool = False
    same_boot: bool | None = None
    writer_alive: bool | None = None
    kernel_kills: list[KernelKill] = field(default_factory=list)  # in the ring's life, of its pid or children
    # the pids among them matched by the job's memory cgroup alone (a DataLoader worker no process sampled)
    cgroup_matched: set[int] = field(default_factory=set)
    cgroup_oom_kills_now: int | None = None
    # the kernel log's OOM kills of other processes in the ring's own memory cgroup, after its last event: what a
    # rise of that cgroup's counter since then may be (another process of the cgroup, killed later)
    others_killed: list[KernelKill] = field(default_factory=list)
    exit_status: int | None = None  # as a shell reports it (128 + signal), from `blackbox run`
    crash: str | None = None  # faulthandler's tracebacks left beside the ring (a native crash)
    signal_stacks: dict[str, str] = field(default_factory=dict)  # a signal that ended it -> its stack (no C)
    now_ns: int | None = None  # the monotonic clock at recovery
    slurm: str | None = None  # why Slurm ended the job, from its own account (``slurm``), where readable
    slurm_mem_limit: int | None = None  # the job's memory limit per node in Slurm's account (bytes)
    flight: dict[str, Any] | None = None  # the rank's flight recorder dump, summed up (``flight``)
    flight_note: str | None = None  # why a dump that should be there was not read
    notes: list[str] = field(default_factory=list)
    exec_into: str | None = None  # the command line its process replaced itself with (exec), where a ring shows it
    exec_mark: str | None = None  # ...where its own last exec mark says so (collect.execs), no later ring of it

    @property
    def others_said(self) -> list[str]:
        """The last 3 of ``others_killed``, as evidence says them."""
        return [f"the kernel OOM-killed another process of its memory cgroup after its last record: pid {k.pid} "
                f"`{k.name}` ({k.line})" for k in self.others_killed[-3:]]  # fmt: skip

    @property
    def kernel_oom_line(self) -> str | None:
        return self.kernel_kills[-1].line if self.kernel_kills else None


def gather(
    locked: bool | None,
    meta: dict[str, Any],
    exit_status: int | None = None,
    kills: list[KernelKill] | None = None,
    crash: str | None = None,
    window: tuple[int, int] | None = None,
    pids: set[int] | None = None,
    cgroups: CgroupCounters | None = None,
    sees_workers: Callable[[], bool] | None = None,
) -> Evidence:
    """Evidence for one ring: a native crash's tracebacks (``crash``: the ring's crash region, or the
    ``.crash`` sidecar older rings left, as the reader found them), and what this machine says of its
    writer (``locked``: whether it held its lock, asked through the descriptor the ring was read by,
    ``Ring.writer_locked``).

    ``kills``: the kernel log's OOM kills (``kernel_oom_kills``, read once for all rings; None reads it
    here). ``window``: (first, last) monotonic ns of the ring's events; ``pids``: the ring's own pid, the
    children it sampled and the DataLoader workers its job's errors name as dead. A kill counts when its
    victim is one of ``pids`` and it happened after the ring started and, for the ring's own pid, not
    before its last event (less SLACK_NS). ``cgroups``: the ``oom_kill`` counters read so far in this
    recovery (:class:`CgroupCounters`): each cgroup's is read once for all its rings (None: read here).
    A DataLoader worker's kill in the ring's own memory cgroup (``worker_in_cgroup``) counts too, unless
    ``sees_workers()`` says the ring sampled DataLoader workers of its own (then it is another process's:
    a DDP rank beside it in the cgroup); asked only where such a kill is in the ring's life.
    """
    ident = meta.get("identity") or {}
    ev = Evidence(exit_status=exit_status, crash=crash)
    ev.slurm, ev.slurm_mem_limit = slurm_account(ident)
    ring_boot, now_boot = ident.get("boot_id"), boot_id()
    ev.same_host = same_machine(ident) or ident.get("host") == socket.gethostname()
    if not ev.same_host:
        ev.notes.append("recovered on another host: no kernel log, cgroup or process evidence")
        return ev
    ev.same_boot = None if not ring_boot or not now_boot else ring_boot == now_boot
    pid = ident.get("pid")
    if ev.same_boot is False or not isinstance(pid, int):
        return ev
    ev.writer_alive = writer_alive(locked, meta)
    ev.now_ns = _monotonic_ns()
    kills = kernel_oom_kills() if kills is None else kills
    cg = meta.get("cgroup") or {}
    if window is not None:
        first, last = window
        targets = (pids or set()) | {pid}
        cg_path = cg.get("path")
        inside = [k for k in kills if first - SLACK_NS <= k.time_ns <= ev.now_ns]
        ev.kernel_kills = [k for k in inside if k.pid in targets and (k.pid != pid or k.time_ns >= last - SLACK_NS)]
        matched = [k for k in inside if k.pid not in targets and isinstance(cg_path, str)
                   and worker_in_cgroup(k, cg_path)]  # fmt: skip
        if matched and not (sees_workers is not None and sees_workers()):
            ev.kernel_kills = sorted(ev.kernel_kills + matched, key=lambda k: k.time_ns)
            ev.cgroup_matched = {k.pid for k in matched}
        ev.others_killed = [k for k in inside if k.pid not in targets and k.pid not in ev.cgroup_matched
                            and k.time_ns >= last - SLACK_NS and isinstance(cg_path, str)
                            and in_cgroup(k, cg_path)]  # fmt: skip
    if isinstance(cg.get("path"), str) and cg.get("version") in (1, 2):
        ev.cgroup_oom_kills_now = (cgroups or CgroupCounters()).read(cg["path"], int(cg["version"]))
    return ev


def worker_in_cgroup(kill: KernelKill, cgroup_path: str) -> bool:
    """The kill's victim is a DataLoader worker (``pt_data*``) in the ring's own memory cgroup, by the
    report's ``oom-kill:...,task_memcg=/x,...`` line: a worker forked by a forkserver is the job's
    grandchild, which no sampler sees and whose death the job's error may not name (a
    ``ConnectionResetError``). The cgroup must be a real one, not the root (every process is there):
    ``cgroup_path`` is the mount of a cgroup filesystem followed by ``task_memcg``."""
    return kill.name.startswith("pt_data") and in_cgroup(kill, cgroup_path)


def in_cgroup(kill: KernelKill, cgroup_path: str) -> bool:
    """The kill's victim was in the memory cgroup ``cgroup_path`` (a real one, not the root), by its report."""
    memcg = next((m.group(1) for line in kill.report if (m := _TASK_MEMCG.search(line))), None)
    if memcg is None or memcg in ("", "/") or not cgroup_path.endswith(memcg):
        return False
    mount = cgroup_path[: len(cgroup_path) - len(memcg)]
    return _is_cgroup_mount(mount)


def _is_cgroup_mount(path: str) -> bool:
    """``path`` is where a cgroup filesystem is mounted (reached without links)."""
    return bool(path) and os.path.ismount(path) and on_cgroupfs(path)


class CgroupCounters:
    """Each memory cgroup's ``oom_kill`` counter, read once in a recovery (mountinfo and the counter: two
    reads of /proc and /sys per cgroup, not per ring), shared by the threads that decode rings."""

    def __init__(self) -> None:
        self._read: dict[tuple[str, int], int | None] = {}
        self._lock = threading.Lock()

    def read(self, path: str, version: int) -> int | None:
        with self._lock:  # two rings of one cgroup decoded at once: one read, not two
            key = (path, version)
            if key not in self._read:
                self._read[key] = cgroup_oom_kills(Path(path), version) if on_cgroupfs(path) else None
            return self._read[key]


def on_cgroupfs(path: str) -> bool:
    """A ring names its cgroup's path; recovery reads it only where that is really a cgroup filesystem,
    reached without links: a hostile ring could name a folder holding a FIFO or a link to any file."""
    return os.path.isabs(path) and os.path.realpath(path) == path and filesystem_type(Path(path)) in CGROUP_FS


def _monotonic_ns() -> int:
    import time

    return time.monotonic_ns()


_RECORD = re.compile(rb"^(\d+),(\d+),(\d+),[^;]*;(.*)$", re.DOTALL)
_TASK_MEMCG = re.compile(r"oom-kill:.*[:,]task_memcg=([^,\s]*)")
_KILLED = re.compile(r"(?:Memory cgroup out of memory|Out of memory|oom-kill).*?Killed process (\d+) \(([^)]*)\)")
_TASK = re.compile(
    r"^\[\s*(\d+)\]\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(-?\d+)\s+(.+)$"
)


def kernel_oom_kills(kmsg: str = "/dev/kmsg") -> list[KernelKill]:
    """Every OOM kill the kernel log still holds (one bounded pass), with its report, oldest first;
    [] where the log cannot be read (not root, ``dmesg_restrict``, a container)."""
    try:
        fd = os.open(kmsg, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return []
    lines: list[tuple[int, str]] = []  # (monotonic ns, text)
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
            m = _RECORD.match(record)
            if m:
                text = m.group(4).split(b"\n", 1)[0].decode("utf-8", "replace")
                lines.append((int(m.group(3)) * 1000, text))
    finally:
        os.close(fd)
    return _kills(lines)


def _kills(lines: list[tuple[int, str]]) -> list[KernelKill]:
    out: list[KernelKill] = []
    start = 0
    for i, (t, text) in enumerate(lines):
        if "invoked oom-killer" in text:
            start = i
        m = _KILLED.search(text)
        if m:
            report = [s for _, s in lines[start : i + 1]][-MAX_REPORT_LINES:]
            out.append(KernelKill(t, int(m.group(1)), m.group(2), text.strip(), report, _tasks(report)))
            start = i + 1
    return out


def _tasks(report: list[str]) -> list[dict[str, Any]]:
    """The report's task table: pid, name, and memory in bytes (rss split into anon, file, shmem)."""
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
    out = []
    for line in report:
        m = _TASK.match(line.strip())
        if m:
            pid, _uid, _tgid, total_vm, rss, anon, file, shmem, _pt, _swap, score, name = m.groups()
            out.append({"pid": int(pid), "name": name.strip(), "rss": int(rss) * page, "rss_anon": int(anon) * page,
                        "rss_file": int(file) * page, "rss_shmem": int(shmem) * page,
                        "total_vm": int(total_vm) * page, "oom_score_adj": int(score)})  # fmt: skip
    return out


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
