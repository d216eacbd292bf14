"""Module-level API: one active Recorder per process, fork and exit handling.

Fork policy: a forked child (a DataLoader worker, say) never writes into its
parent's ring. By default (``on_fork="disarm"``) the child's inherited recorder
is silently abandoned: the mapping is dropped without a record or a state
change, and ``blackbox.arm()`` in the child makes a fresh ring. With
``on_fork="rearm"`` the child arms its own ring at once, beside the parent's,
with the same settings and its own pid in the name.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from ._jobsignal import TRIES, the_jobs
from ._recorder import DEFAULT_SAMPLE_INTERVAL, DEFAULT_STRINGS_SIZE, Phase, Recorder
from ._warn import note_arm_site
from .collect.exceptions import capture, follow_worker_exception
from .collect.identity import helper_name
from .collect.signals import held_while_arming
from .ring import format as fmt
from .ring.writer import built_module

_lock = threading.Lock()
_arming: set[int] = set()  # threads inside arm(): a signal handler re-entering it never waits on itself
_active: Recorder = Recorder()  # inert until arm()
_settings: dict[str, Any] = {}
_atexit_registered = False


def arm(
    path: str | os.PathLike[str] | None = None,
    *,
    capacity: int | None = None,
    sample_interval: float = DEFAULT_SAMPLE_INTERVAL,
    strings_size: int = DEFAULT_STRINGS_SIZE,
    on_fork: str = "disarm",
    allocator_history: bool | int = False,
    modules: bool = False,
    sync_interval: float | None = None,
    stacks: bool = True,
    stack_threads: Iterable[str | threading.Thread] = (),
    allocations: bool | int | None = None,
    keep: str | None = None,
    alerts: bool = True,
    alert_levels: Any = None,
    alert_signal: Any = None,
    alert_before: float | None = None,
    watchdog: bool | None = None,
) -> Recorder:
    """Arm the flight recorder and return it; a second call returns the armed one.

    Args:
        path: the ring file to create, or a folder to create it in. None uses
            ``$BLACKBOX_DIR``, else ``/var/tmp/blackbox-<uid>``; the file is
            named ``blackbox-<host>-rank<RANK>-pid<pid>-<UTC start>.ring``.
        capacity: number of 128-byte event slots; the newest ``capacity``
            events survive.
        sample_interval: seconds between host-memory ``sample`` records.
        strings_size: bytes reserved for interned label strings.
        on_fork: ``"disarm"`` (a forked child writes nothing) or ``"rearm"``
            (a forked child arms its own ring).
        allocator_history: record PyTorch's CUDA allocator history into the
            ring (alloc / free / segment events) once the job uses CUDA; True
            keeps 10,000 entries in PyTorch's buffer, an int sets the number.
            On the first CUDA OOM its snapshot pickle is written beside the ring.
        modules: record ``module_begin`` / ``module_end`` events with memory
            at every module's forward, and ``forward`` phases.
        sync_interval: seconds between msyncs of the ring (None: never). The
            ring survives SIGKILL and the OOM killer without it (the page cache
            outlives the process); with it, a kernel crash or power loss loses
            at most the last ``sync_interval`` seconds of events.
        stacks: sample Python stacks at each sample: the main thread's, and
            those of ``stack_threads``, as ``stack_sample`` events whose
            stack (innermost 64 frames) lives in the ring's stack table, each
            distinct frame and stack stored once (a repeating stack costs one
            128-byte slot). A thread inside a C call shows the Python frame
            that made it. A few microseconds per tick with warm caches, under
            100 us cold (README, "Stacks"). Any failure turns stacks off
            with one warning.
        stack_threads: more threads to sample besides the main thread: thread
            names (every live thread of that name, looked up at each sample,
            so threads started later count) or ``threading.Thread`` objects;
            16 threads at most. (Every thread is sampled, once a second, while
            the main thread's stack stands still: a hang names the thread it
            waited for.)
        allocations: sample allocations by bytes (README, "Who holds the
            memory"): Python objects, numpy arrays, torch CPU tensors and any
            other malloc in the process, each with the Python stack that made
            it, in every thread; one sample per ``allocations`` bytes on average
            (True: 1 MiB), each weighted so live bytes per site are an unbiased
            estimate. Sampled blocks live at the end are in the ring's heap
            table, so they survive SIGKILL and the OOM killer. On by default:
            None reads ``BLACKBOX_ALLOCATIONS`` (``0`` off, ``1`` or unset on,
            or bytes); ``False`` turns it off. Without the C extension nothing
            is sampled and the bundle says "not recorded". Its cost is in
            docs/performance.md ("Allocation sampling").
        keep: the ring folder's retention, applied before the ring is made:
            ``"count=N,size=SIZE"`` (either part alone too) removes the oldest
            rings and ``blackbox run`` folders beyond N or SIZE in all, never
            one still in use (armed, or made in the last 5 minutes); ``"off"``
            keeps everything. None: ``$BLACKBOX_KEEP``, else ``count=64,size=2G``.
        alerts: alerts before the death (README, "Before the death"), in the job's main process: memory
            against the limit that will end it (the lowest cgroup limit, MemTotal, RLIMIT_AS, each
            GPU's total), a leak the fit says is real, GPU fragmentation, and the forecast of the time
            to the limit, each an ``alert`` record in the ring and a call of the ``on_alert`` callbacks.
        alert_levels: (warning, critical) fractions of the limit (None: ``$BLACKBOX_ALERT_LEVELS``,
            e.g. ``80,95``, else 0.80 and 0.95).
        alert_signal: a signal (``"USR1"``) sent once to this process at the first critical alert, where
            the job has a handler for it, so it can save its work (None: ``$BLACKBOX_ALERT_SIGNAL``,
            which ``blackbox run --alert-signal`` sets; unset: none).
        alert_before: seconds: the forecast under this is critical (None: ``$BLACKBOX_ALERT_BEFORE``,
            else 60).
        watchdog: free the CUDA cache (``torch.cuda.empty_cache()``) on a GPU fragmentation alert, at
            most once in 30 s (None: ``$BLACKBOX_WATCHDOG``; unset: off).

    Never raises: if the ring cannot be made, a BlackboxWarning is issued and
    the returned Recorder is disarmed (``recorder.armed`` is False).
    """
    global _active, _atexit_registered
    me = threading.get_ident()
    if me in _arming:
        return _active
    _arming.add(me)
    note_arm_site()
    try:
        with held_while_arming(), _lock:
            return _arm_locked(path, capacity, sample_interval, strings_size, on_fork, allocator_history, modules,
                                sync_interval, stacks, stack_threads, allocations, keep,
                                {"alerts": alerts, "alert_levels": alert_levels, "alert_signal": alert_signal,
                                 "alert_before": alert_before, "watchdog": watchdog})  # fmt: skip
    finally:
        _arming.discard(me)


def _arm_locked(
    path: str | os.PathLike[str] | None,
    capacity: int | None,
    sample_interval: float,
    strings_size: int,
    on_fork: str,
    allocator_history: bool | int,
    modules: bool,
    sync_interval: float | None,
    stacks: bool = True,
    stack_threads: Iterable[str | threading.Thread] = (),
    allocations: bool | int | None = None,
    keep: str | None = None,
    alerting: dict[str, Any] | None = None,
) -> Recorder:
    global _active, _atexit_registered
    if _active.armed:
        return _active
    _settings.update(
        path=path,
        capacity=capacity,
        sample_interval=sample_interval,
        strings_size=strings_size,
        on_fork=on_fork,
        allocator_history=allocator_history,
        modules=modules,
        sync_interval=sync_interval,
        stacks=stacks,
        stack_threads=stack_threads,
        allocations=allocations,
        keep=keep,
        **(alerting or {}),
    )
    _active = Recorder.arm(path, **{k: v for k, v in _settings.items() if k != "path"})
    if _active.armed:
        _bind(_active.mark, _active.step)
        if not _atexit_registered:
            atexit.register(_disarm_at_exit)  # again, run after: the job's exception landing as the one
            atexit.register(_disarm_at_exit)  # below is entered, before its first line, cuts it short
            _atexit_registered = True
        _at_worker_exit()
    return _active


class _Anchor:
    """A weakly referable object for multiprocessing's after-fork registry."""


_worker_exit_anchor = _Anchor()


def _at_worker_exit() -> None:
    """A multiprocessing worker ends with ``os._exit`` after its finalizers, skipping atexit: have
    those finalizers record the clean end (a worker that exits normally is not a death). A worker
    that armed while its main module was imported again (spawn, forkserver) has its finalizers
    cleared when it starts running; multiprocessing's after-fork hook, run just after, registers
    ours again."""
    mp = sys.modules.get("multiprocessing")
    if mp is None:
        return
    try:
        import multiprocessing.util as util

        def register(_anchor: object = None) -> None:
            util.Finalize(None, _disarm_at_exit, exitpriority=10)
            _name_helper()
            follow_worker_exception(_worker_exception)

        register()
        util.register_after_fork(_worker_exit_anchor, register)
    except Exception:
        pass


def _worker_exception(exc: BaseException | None) -> None:
    """The exception a multiprocessing worker's target raised, recorded as uncaught (``in_flight``)."""
    exceptions = _active._exceptions
    if exceptions is not None and _active.armed:
        exceptions.in_flight(exc)


_named: list[bool] = []


def _name_helper() -> None:
    """In a multiprocessing child, once its Process is known (a fork child at once, a spawn child when its
    bootstrap runs the after-fork hooks): a ``blackbox helper: NAME`` mark saying what it runs, once."""
    name = helper_name()
    if _named or name is None:
        return
    _named.append(True)
    _active.mark(fmt.HELPER_PREFIX + name)


def disarm() -> None:
    """Record a clean end and close the ring (also run at interpreter exit)."""
    _bind(_forward_mark, _forward_step)
    _active.disarm()


def active() -> Recorder:
    """The current Recorder (inert if none was armed)."""
    return _active


def mark(label: str, value: int | None = None) -> None:
    """Record a ``mark`` event with a label and an optional int64 value."""
    _active.mark(label, value)


def step(n: int | None = None) -> None:
    """Start step ``n`` (the next step when None); later events carry it."""
    _active.step(n)


def _forwarders() -> tuple[Any, Any]:
    """What ``blackbox.mark`` / ``blackbox.step`` are while nothing is armed (and what a reference taken
    before arm() keeps): the C extension's ``Forward`` objects where it is built (a call with no ring is
    one C call that returns at once; armed, it hands its arguments to the ring's function), else the
    two functions above."""
    cmod = built_module()
    forward = getattr(cmod, "Forward", None)
    if forward is None:
        return mark, step
    return forward(), forward()


_forward_mark, _forward_step = _forwarders()
_C_FORWARDERS = _forward_mark is not mark  # their target is set by _bind


def _bind(mark_fn: Any, step_fn: Any) -> None:
    """Point ``blackbox.mark`` / ``blackbox.step`` (and this module's) at these functions, and the
    forwarders taken before arm() at them too (at nothing when they are the forwarders)."""
    if _C_FORWARDERS:
        _forward_mark.target = None if mark_fn is _forward_mark else mark_fn
        _forward_step.target = None if step_fn is _forward_step else step_fn
    targets = [sys.modules[__name__]]
    package = sys.modules.get(__package__ or "blackbox")
    if package is not None:
        targets.append(package)
    for module in targets:
        module.__dict__["mark"] = mark_fn
        module.__dict__["step"] = step_fn


_bind(_forward_mark, _forward_step)


def phase(name: str) -> Phase:
    """``with blackbox.phase("forward"):`` records phase_begin and phase_end."""
    return _active.phase(name)


def capture_oom(context: str = "", **metadata: Any) -> AbstractContextManager[None]:
    """``with blackbox.capture_oom("eval", batch=64):`` records an exception raised inside
    (kind ``oom`` for any framework's out-of-memory, else ``exception``) and re-raises it.

    For code that catches its own exceptions, where ``sys.excepthook`` never sees them.
    The context and metadata go in the event's ``detail``.
    """
    return capture(lambda: _active.exception_recorder, context, metadata)


def recover(ring_or_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str], *, raw: bool = True) -> Path:
    """Turn a ring (or every ring in a folder) into a bundle folder; returns its path.

    The bundle holds ``timeline.parquet``, ``metadata.json`` and ``summary.md``, and (``raw``, within
    a cap) each ring read, zstd-compressed, in ``rings/``: ``recover`` reads a ``.ring.zst`` again.
    ``out_dir`` may also be a pyarrow filesystem URI (``s3://bucket/run1``).
    Raises a BlackboxError subclass for input that is not a readable ring.
    pyarrow is imported here, not when the recorder is armed.
    """
    from ._postmortem import write_postmortem

    write_postmortem([Path(ring_or_dir)], out_dir, raw=raw)
    return Path(out_dir)


def _disarm_at_exit() -> None:
    """The recording's end as the interpreter exits. The job's exception from its signal handler (or a
    KeyboardInterrupt, a SystemExit), held until the ring's end was written, is raised here, as unarmed it
    would be; one that landed before the disarm began (the recorder still armed) has the disarm run again."""
    job: BaseException | None = None
    for _ in range(TRIES):
        try:
            _active.disarm(at_exit=True)
        except BaseException as exc:  # noqa: BLE001 (the job's: re-raised below; blackbox's own: dropped)
            job = job or the_jobs(exc)
        if not _active.armed:
            break
    if job is not None:
        raise job


def _after_fork_in_child() -> None:
    global _active, _lock
    _named.clear()  # a child of a named worker names itself
    _lock = threading.Lock()  # the parent's lock may have been held by another thread
    parent = _active
    if not parent.armed:
        return
    parent.abandon_after_fork()
    _bind(_forward_mark, _forward_step)
    _active = Recorder()
    if parent.on_fork == "rearm":
        settings = dict(_settings)
        if parent.path is not None:
            settings["path"] = parent.path.parent
        arm(**settings)


os.register_at_fork(after_in_child=_after_fork_in_child)
