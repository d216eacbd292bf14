"""The collectors a Recorder starts as it arms, keeps up once a sample, and puts back as it ends.

Each collector that fails to start is noted (``Recorder.notes`` and a ``blackbox: ...`` mark), never
fatal: the ring records what the others see. Functions over the Recorder, moved out of ``_recorder.py``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ._fds import OwnedFd
from ._jobsignal import the_jobs
from ._warn import warn
from .collect.alert_actions import AlertActions
from .collect.alerts import AlertEngine
from .collect.allocs import start_allocs
from .collect.cells import CellNames
from .collect.dist_rank import DistRank
from .collect.exceptions import ExceptionRecorder, exit_status_unrecorded
from .collect.execs import ExecWatch
from .collect.gpu import GpuProbe
from .collect.signals import (
    CrashRegion,
    SignalRecorder,
    follow_faulthandler,
    follow_faulthandler_register,
    follow_torch_worker_handlers,
)
from .collect.stacks import StackSampler
from .collect.torch_hooks import TorchHooks
from .ring.file import SNAPSHOT_SUFFIX, sidecar
from .ring.liveness import lock_ring
from .ring.writer import built_module, c_writer_module

if TYPE_CHECKING:
    from ._recorder import Recorder


def install_collectors(rec: Recorder, ring: Path, history: int, modules: bool) -> None:
    """Exceptions, signals, crash region, GPU and torch hooks: each one that fails is noted, not fatal."""
    w, hdr = rec._writer, rec._header
    assert w is not None and rec._probe is not None and hdr is not None and rec._ring is not None
    rec._exceptions = ExceptionRecorder(w.event, w.intern)
    rec._execs = ExecWatch(w.mark)
    rec._signals = SignalRecorder(built_module(), w.intern, (ring, hdr))
    rec._crash = CrashRegion(ring, hdr.crash_offset)
    rec._gpu = GpuProbe()
    if rec._stack_threads is not None:
        try:
            region = rec._ring.map.buffer[hdr.stacks_offset : hdr.stacks_offset + hdr.stacks_size]
            rec._stacks = StackSampler(region, w.event, rec._stack_threads, c_writer_module())
        except Exception as exc:
            rec.note(f"stacks not sampled: {type(exc).__name__}: {exc}")
            warn(rec.notes[-1])
    rec._allocs = start_allocs(rec._ring.map.buffer, hdr, w.sequence, rec.allocations,
                               rec._stack_threads is None, lambda: rec._stacks, rec.note)  # fmt: skip
    if rec._allocs_why:
        rec.note(f"allocations not sampled: {rec._allocs_why}")
    rec._torch = TorchHooks(
        w,
        modules=modules,
        allocator_history=history,
        snapshot_path=sidecar(ring, SNAPSHOT_SUFFIX),
        rss=rec._probe.rss,
        note=rec.note,
        gpu_blocks=rec._allocs.gpu_block if rec._allocs is not None else None,
    )
    rec._dist_rank = DistRank(rec._identity.get("rank") is not None, lambda label: rec.mark(label))
    rec._cells = CellNames(lambda label: rec.mark(label))
    mapping, sequence = rec._ring.map.buffer, w.sequence
    signals = rec._signals
    for what, install in (
        ("exception hooks", rec._exceptions.install),
        ("exec watch", rec._execs.install),
        ("signal recorder", lambda: signals.install(mapping, hdr.records_offset, hdr.capacity, sequence)),
        ("crash region", rec._crash.enable),
        ("torch hooks", rec._torch.poll),
    ):
        try:
            why = install()
            if why:
                rec.note(f"{what} not installed: {why}")
        except Exception as exc:
            rec.note(f"{what} not installed: {type(exc).__name__}: {exc}")
    start_alerts(rec)
    if rec._crash.note:
        rec.notes.append(rec._crash.note)  # the job's own choice, not a failure: no event
    _faulthandler_changed(rec)
    follow_faulthandler(lambda: _faulthandler_changed(active_recorder()))
    follow_faulthandler_register(built_module())
    follow_torch_worker_handlers(_record_crashes_of_the_active)
    if exit_status_unrecorded(built_module()):
        rec.note(exit_status_unrecorded(built_module()))


def start_alerts(rec: Recorder) -> None:
    """Alerts, in the job's main process (one per rank): a helper's would repeat its cgroup's."""
    settings, w = rec.alert_settings, rec._writer
    if settings is None or rec.role != "main" or w is None:
        return
    allocs = rec._allocs
    rec.alert_actions = actions = AlertActions(w.event, w.intern, _signum(settings["signal"]), settings["watchdog"],
                                               allocs.top_site if allocs is not None else None, warn)  # fmt: skip
    levels = settings["levels"]
    rec._alerts = AlertEngine(w.event, rec.sample_interval or 0.1, (levels[0], levels[1]), settings["before_s"],
                              actions.alerted)  # fmt: skip


def _signum(name: str | None) -> int | None:
    import signal

    return None if name is None else int(signal.Signals[name])


def tick_alerts(rec: Recorder, figures: tuple[int, ...], readings: list[tuple[int, tuple[int, ...]]]) -> None:
    """The sample's alerts; a failure turns alerts off with a note, never the recorder."""
    engine, probe, w = rec._alerts, rec._probe, rec._writer
    if engine is None or probe is None or w is None:
        return
    torch = rec._torch
    try:
        engine.tick(probe, figures, readings, w.current_step(), torch.oom_requests if torch is not None else None)
    except Exception as exc:
        if the_jobs(exc) is not None:  # the job's handler raised as disarm took the last sample: the job's
            raise
        rec._alerts = None
        rec.note(f"alerts off: {type(exc).__name__}: {exc}")


def active_recorder() -> Recorder:
    from ._api import active

    return active()


def _faulthandler_changed(rec: Recorder) -> None:
    """Where faulthandler is not ours (the job's, or disabled), the C handler records the crash signals and
    writes their tracebacks into the ring."""
    crash, signals = rec._crash, rec._signals
    if crash is None or signals is None or crash.busy:  # (its own enable or disable: not the job's)
        return
    ours = crash.ours()
    signals.faulthandler_ours(ours, crash.fd() if ours else -1)
    if not ours:
        signals.crash_text_to(crash.fd())
    elif signals.writes_crash_text():  # a DataLoader worker's: PyTorch's handlers sit over our faulthandler
        signals.crash_text_to(crash.fd())  # (-1 once the job closed it: its number may be the job's file)


def _record_crashes_of_the_active() -> None:
    """PyTorch's DataLoader worker handlers are in (``follow_torch_worker_handlers``): this process's
    recorder (the worker's own, armed after the fork) records the crash signals over them, at once."""
    from ._api import _name_helper, active

    rec = active()
    signals = rec._signals
    if signals is not None:
        signals.record_crashes()  # PyTorch's handlers take the signal from faulthandler: the C handler writes
        signals.crash_text_to(rec._crash.fd() if rec._crash is not None else -1)
        signals.watch()
    _name_helper()  # (a DataLoader worker's: said now, however soon it crashes)


def upkeep(rec: Recorder) -> None:
    """Once a sample: attach torch hooks as the job gets there, re-wrap signal handlers the job
    replaced, and take back descriptors the job closed (the crash region's, the lock's)."""
    follow_torch_worker_handlers(_record_crashes_of_the_active)
    dist, cells = rec._dist_rank, rec._cells
    for part in (rec._torch.poll if rec._torch else None, dist.poll if dist else None,
                 cells.poll if cells else None, rec._signals, rec._crash):
        if part is None:
            continue
        try:
            if isinstance(part, SignalRecorder):
                part.watch()
            elif isinstance(part, CrashRegion):
                part.check()
                _faulthandler_changed(rec)  # (a descriptor the job closed is new)
            else:
                part()
        except Exception as exc:
            rec._on_error(exc)
    ring = rec._ring
    if ring is not None and ring.locked and not ring.fd.intact():
        fd = OwnedFd.open(ring.path, os.O_RDWR | os.O_NOFOLLOW)  # the job closed ours: lock it again
        if fd is not None and os.fstat(fd.fd).st_size == len(ring.map) and lock_ring(fd.fd):
            ring.fd = fd


def uninstall_collectors(
    rec: Recorder,
    *,
    in_child: bool,
    signals: bool,
    run: Callable[[Callable[[], object]], None] | None = None,
    keep_late: bool = False,
) -> None:
    """Put back the hooks this recorder installed (in a forked child: no torch/CUDA calls): the
    signal recorder alone (``signals``; ``keep_late``: its handler stays for the shutdown, see
    ``SignalRecorder.uninstall``), or all the others, each step through ``run`` (by default: a failure
    is one warning). Releasing signals waits for a handler in flight on another thread, so nothing
    writes into the mapping once it is closed."""

    def each(step: Callable[[], object]) -> None:
        try:
            step()
        except Exception as exc:
            rec._on_error(exc)

    run = run or each
    if signals:
        if rec._signals is not None:
            sig, crash, ring = rec._signals, rec._crash, rec._ring
            text = functools.partial(crash.late_fd, ring.fd) if crash is not None and ring is not None else None
            run(sig.forget_after_fork if in_child else functools.partial(sig.uninstall, keep_late=keep_late,
                                                                         late_text=text))  # fmt: skip
        return
    torch, exceptions, crash, allocs = rec._torch, rec._exceptions, rec._crash, rec._allocs
    steps: list[Callable[[], None]] = [lambda: allocs.stop(in_child=in_child)] if allocs is not None else []
    if rec.alert_actions is not None:
        steps.append(rec.alert_actions.stop)
    if crash is not None:
        if rec._signals is not None:
            steps.append(functools.partial(rec._signals.crash_text_to, -1))  # before its descriptor closes
            steps.append(functools.partial(rec._signals.faulthandler_ours, False))  # (the same)
        steps.append(crash.disable)
    if torch is not None:
        steps.append(lambda: torch.detach(final_drain=not in_child, in_child=in_child))
    if exceptions is not None:
        steps.append(exceptions.uninstall)
    if rec._execs is not None:
        steps.append(rec._execs.uninstall)
    for step in steps:
        run(step)
