"""A snapshot of a job that outlived the signal sent to end it, written while it still runs.

A job asked to end (SIGTERM from Slurm's time limit or ``scancel``, from Kubernetes, ``docker stop`` or
``timeout``; a terminal's Ctrl-C) whose process, or a process it left (a shell wrapper's python, the shell
dead of the signal), still runs ``OUTLIVED_S`` later is either shutting down in its own
handler (saving a checkpoint) or hung, its handler setting a flag that the stuck loop never reads
(Lightning's). Whoever sent that signal then sends SIGKILL to every process (Slurm's KillWait, a pod's
grace period, ``timeout -k``), ``blackbox run`` included, which then writes no bundle and prints nothing.
So ``blackbox run`` writes a snapshot of the job's rings into its bundle folder at once (where each process
is, how long since its last step, the signal its handler took) and says it on stderr in one line; the
bundle of the job's end replaces it once the job's process ends.

The snapshot is written by a child process (forked: no interpreter to start), which must not slow the
job's shutdown nor take its memory. It runs at nice ``NICE``: beside a job that keeps every core busy it
gets about a tenth of one (``SCHED_IDLE`` gets none: under two busy loops on two cores it wrote nothing in
60 s). The kernel's OOM killer takes it first (``oom_score_adj`` 1000); it keeps no raw rings and draws no
plot; it dies with ``blackbox run`` (``PR_SET_PDEATHSIG``); and where the job's binding memory limit (its
cgroup's, the host's) leaves less than ``MIN_ROOM`` it reads nothing and says so: a job saving its
checkpoint near its limit must not be pushed over it (a pod's OOM kill takes the whole container). It is
never one of the job's processes: no signal is relayed to it and the end waits not for it (``launcher``),
which kills it once the job's process has ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

OUTLIVED_S = 1.0  # how long the job's process may outlive a signal meant to end it before the snapshot
ENDING = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT})
NICE = 10  # the writer's niceness: a weight of 110 against a busy thread's 1024
MIN_ROOM = 320 << 20  # bytes the binding memory limit must leave: a recovery of 8 full rings peaked at 239 MiB
_PR_SET_PDEATHSIG = 1


def start(rings: Path, bundle: Path, job: int, asked: str, prefix: str = "",
          ready: Callable[[], None] | None = None) -> int | None:  # fmt: skip
    """Fork the snapshot's writer; its pid, or None where no process could be made. ``asked``: the signal
    the job outlived, as said (``SIGTERM from timeout (pid 12)``); ``prefix``: the line's (a rank's);
    ``ready``: called in the writer before it reads (the CLI's ``own_process``)."""
    for stream in (sys.stdout, sys.stderr):  # nothing of ours buffered twice
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    launcher = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        return None
    if pid:
        return pid
    code = 1
    try:
        code = _write(rings, bundle, job, launcher, asked, prefix, ready)
    finally:
        os._exit(code)


def _write(rings: Path, bundle: Path, job: int, launcher: int, asked: str, prefix: str,
           ready: Callable[[], None] | None) -> int:  # fmt: skip
    """In the child: look at the room left (at once), yield to the job, recover its rings as they are, say
    where it is."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != launcher:  # blackbox run died before the above took effect
        return 1
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write("1000")
    from .._errors import one_line
    from .._units import human_bytes
    from .notice import SNAPSHOT, termination_message

    if not any(rings.glob("*.ring")):  # no process of the job armed yet (or none is Python): nothing to tell
        return 0
    if (left := room()) is not None and left[0] < MIN_ROOM:
        _say(f"{prefix}the job still runs {OUTLIVED_S:g} s after {asked}; no snapshot: {human_bytes(left[0])} left "
             f"under its {left[1]}, which reading its rings could take")  # fmt: skip
        return 1
    with contextlib.suppress(OSError):
        os.nice(NICE)
    from .._postmortem import write_postmortem

    if ready is not None:
        ready()

    def said(meta: dict[str, Any]) -> None:  # as soon as the verdict is in place: a SIGKILL may be near
        deaths = [r.get("death") for r in meta.get("rings") or () if isinstance(r, dict)] or [meta.get("death")]
        if not any(isinstance(d, dict) and d.get("alive") for d in deaths):  # it ended as it was read: the bundle
            return  # of its end comes next
        death = told(meta, job)
        headline = one_line(str(death.get("headline") or ""))  # the job's own text may be in it
        _say(f"{prefix}the job still runs {OUTLIVED_S:g} s after {asked}: {headline} A snapshot is in {bundle}/: "
             f"the bundle of its end replaces it, or, SIGKILLed first, `blackbox recover {rings}` tells that end")
        # What `kubectl describe pod` shows of a pod SIGKILLed after its grace; the verdict of its end replaces
        # it. Not a rank's (torchrun's error file tells the ranks); not the Slurm job's comment: once Slurm has
        # signalled a job to end it, slurmctld refuses it ("Job has already finished", Slurm 22.05, tried)
        if not prefix:
            termination_message(one_line(f"{SNAPSHOT} {OUTLIVED_S:g} s after {asked}: {headline} Snapshot: {bundle}"))

    try:
        write_postmortem([rings], bundle, None, plot=False, raw=False, launcher_pid=launcher, job_pid=job,
                         on_verdict=said)  # fmt: skip
    except Exception as exc:  # the bundle of the end is still to come: a line, no traceback
        _say(one_line(f"{prefix}the job still runs {OUTLIVED_S:g} s after {asked}; no snapshot ({type(exc).__name__}: "
                      f"{exc})"))  # fmt: skip
        return 1
    return 0


def told(meta: dict[str, Any], job: int) -> dict[str, Any]:
    """The death a snapshot's line tells: a rank's, where an attempt's account names one first (the stuck rank, or
    one that died); else the job's own process (its pid, else the main process: a shell wrapper's python) where
    it runs still, never a helper beside it (a DataLoader's worker, running or ended by the same signal)."""
    first = meta.get("first_death") or {}
    if first.get("rank") is not None:
        return dict(first)
    rings = [r for r in meta.get("rings") or () if isinstance(r, dict) and isinstance(r.get("death"), dict)]
    own = next((r for r in rings if r.get("pid") == job and r["death"].get("alive")), None) or next(
        (r for r in rings if r.get("role") == "main" and r["death"].get("alive")), None)  # fmt: skip
    return dict(own["death"]) if own else dict(first or meta.get("death") or {})


def room() -> tuple[int, str] | None:
    """(bytes left, the limit named) under the memory limit with the least room: the cgroup's (its usage less
    its page cache, as the alerts count it), or the host's; None where none is known."""
    from .._units import human_bytes
    from ..collect.host import HostProbe
    from ..collect.limits import CGROUP, binding, host_uses

    probe = HostProbe()
    try:
        use = binding(host_uses(probe, probe.read(), None))
    finally:
        probe.close()
    if use is None:
        return None
    kind, used, limit = use
    return limit - used, f"{'cgroup' if kind == CGROUP else 'host'}'s memory limit of {human_bytes(limit)}"


def _say(text: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"blackbox run: {text}", file=sys.stderr, flush=True)


def stop(pid: int) -> None:
    """Kill the snapshot's writer (the job's process has ended: the bundle of its end comes next) and reap it.
    Never reaped before, its pid is no other process's."""
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ChildProcessError, InterruptedError):
        os.waitpid(pid, 0)
