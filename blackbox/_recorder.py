"""The Recorder: one armed ring, its collectors, its sampler thread, and its clean end.

A Recorder never raises into the job. Arming failures (a full disk, a
read-only folder, a folder another user controls, bad settings) become one
:class:`BlackboxWarning` and a disarmed Recorder whose methods do nothing.

The collectors it starts, keeps up and puts back are in ``_recorder_collect.py``; how it stops (the
clean end, at exit too, and a forked child's abandoning of the parent's ring) in ``_recorder_end.py``.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from ._jobsignal import Latch, the_jobs
from ._recorder_collect import install_collectors, tick_alerts, upkeep
from ._recorder_end import _noop, _null_event, abandon_after_fork, disarm, teardown
from ._version import __version__
from ._warn import warn
from .collect.alert_actions import AlertActions, alert_settings
from .collect.alerts import AlertEngine
from .collect.allocs import AllocSampler, heap_bytes, mean_bytes, tail_bytes, unavailable
from .collect.cells import CellNames
from .collect.clock import clock_error_s
from .collect.dist_rank import DistRank
from .collect.exceptions import ExceptionRecorder
from .collect.execs import ExecWatch
from .collect.flight import flight_recorder
from .collect.gpu import GpuProbe
from .collect.host import HostProbe
from .collect.identity import identity, role, versions
from .collect.limits import SAMPLER_STACK, SMALL_CAPACITY, address_space, limits
from .collect.signals import CrashRegion, SignalRecorder
from .collect.stacks import StackSampler, thread_tuple
from .collect.torch_hooks import DEFAULT_HISTORY_ENTRIES, TorchHooks
from .ring import format as fmt
from .ring.file import CreatedRing, create_ring, is_diskless, resolve_target, ring_name, safe_folder
from .ring.liveness import LOCK_LIVENESS
from .ring.retention import keep_at_arm
from .ring.writer import NO_C_EXTENSION, NO_C_SAID_ENV, RingWriter, built_module, c_writer_module

DEFAULT_CAPACITY = 1 << 18  # 262,144 slots: 32 MiB of records
HELPER_CAPACITY = 1 << 13  # 8,192 slots (1 MiB): the default for a helper process (a multiprocessing worker)
DEFAULT_SAMPLE_INTERVAL = 0.1  # seconds
DEFAULT_STRINGS_SIZE = 1 << 20  # 1 MiB of interned strings
DEFAULT_STACKS_SIZE = 1 << 20  # 1 MiB of stack table, two halves
MIN_CAPACITY = 16
_KIND_PHASE_BEGIN = fmt.KIND_CODES["phase_begin"]
_KIND_PHASE_END = fmt.KIND_CODES["phase_end"]
_KIND_GPU_SAMPLE = fmt.KIND_CODES["gpu_sample"]
_KIND_MARK = fmt.KIND_CODES["mark"]
_KIND_CGROUP_SAMPLE = fmt.KIND_CODES["cgroup_sample"]
_KIND_CHILD_SAMPLE = fmt.KIND_CODES["child_sample"]


def start_thread(thread: threading.Thread, stack: int | None) -> None:
    """Start ``thread``, with a stack of ``stack`` bytes where given (threading's size is process-wide: set
    for this start alone, then put back)."""
    if stack is None:
        thread.start()
        return
    before = threading.stack_size(stack)
    try:
        thread.start()
    finally:
        threading.stack_size(before)


def _clock_pair() -> tuple[int, int]:
    """(wall ns, monotonic ns) read as close together as Python allows."""
    m0 = time.monotonic_ns()
    wall = time.time_ns()
    m1 = time.monotonic_ns()
    return wall, (m0 + m1) // 2


class Phase:
    """Context manager written by ``phase(name)``: a begin event and an end event.

    The end event's ``value`` is the phase's duration in nanoseconds.
    """

    __slots__ = ("_event", "_name", "_t0")

    def __init__(self, event: Callable[..., int], name: str) -> None:
        self._event, self._name, self._t0 = event, name, 0

    def __enter__(self) -> Phase:
        self._t0 = self._event(_KIND_PHASE_BEGIN, self._name)
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        t0 = self._t0
        self._event(_KIND_PHASE_END, self._name, time.monotonic_ns() - t0 if t0 else None)


_said = {"no_c": False}  # what the recorder has said once in this process

class Recorder:
    """An armed (or, after a failure or ``disarm()``, inert) flight recorder.

    Attributes:
        path: the ring file, or None if arming failed before one was made.
        armed: True while events are being written.
        capacity: number of record slots in the ring.
        sample_interval: seconds between host-memory samples.
        writer_backend: ``"c"`` (the compiled write path) or ``"python"``; None until armed.
        notes: what a collector could not do, and what arming did at the requested path.
    """

    mark: Callable[..., None]
    step: Callable[..., None]

    def __init__(self) -> None:
        self.path: Path | None = None
        self.armed = False
        self.capacity = 0
        self.sample_interval = 0.0
        self.on_fork = "disarm"
        self._keep: str | None = None  # arm's keep=: the ring folder's retention (None: $BLACKBOX_KEEP or the default)
        self.writer_backend: str | None = None
        self.sync_interval: float | None = None
        self.syncs = 0
        self.sync_seconds = 0.0
        self.mark = _noop
        self.step = _noop
        self.notes: list[str] = []
        self._event: Callable[..., int] = _null_event
        self._writer: RingWriter | None = None
        self._ring: CreatedRing | None = None
        self._header: fmt.Header | None = None
        self._probe: HostProbe | None = None
        self._gpu: GpuProbe | None = None
        self._torch: TorchHooks | None = None
        self._dist_rank: DistRank | None = None  # (collect/dist_rank.py)
        self._cells: CellNames | None = None  # a notebook's cells by IPython's names (collect/cells.py)
        self._exceptions: ExceptionRecorder | None = None
        self._execs: ExecWatch | None = None
        self._signals: SignalRecorder | None = None
        self._crash: CrashRegion | None = None
        self._stacks: StackSampler | None = None
        self._allocs: AllocSampler | None = None
        self._alerts: AlertEngine | None = None  # the job's main process only (collect/alerts.py)
        self.alert_actions: AlertActions | None = None
        self.alert_settings: dict[str, Any] | None = None
        self.allocations = 0  # the mean sampling interval in bytes (0: allocations not sampled)
        self._allocs_why: str | None = None  # why allocations asked for cannot be sampled (no C extension)
        self._fold_sites: list[dict[str, Any]] = []  # a folded helper's largest allocation sites (_recorder_end)
        self._stack_threads: tuple[str | threading.Thread, ...] | None = ()  # None: stacks off
        self._stop = Latch()  # (not threading.Event: see Latch)
        self._sampler: threading.Thread | None = None
        self._sampled = Latch()  # set as the sampler's loop ends: nothing of it writes after
        self._warned = False
        self._ending = threading.Lock()  # claimed without waiting: never re-entered, never waited on
        self._fold_clean = False  # under `blackbox run`, a helper's ring that ends cleanly is folded away
        self.peak_rss = -1
        self.role = "main"
        self._identity: dict[str, Any] = {}
        self._started_ns = 0

    # ------------------------------------------------------------ arming
    @classmethod
    def arm(
        cls,
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
        rec = cls()
        rec.on_fork, rec._keep = on_fork, keep
        try:
            rec.allocations = mean_bytes(allocations)
            rec.alert_settings = alert_settings(alerts, alert_levels, alert_signal, alert_before, watchdog)
            rec._allocs_why = unavailable() if rec.allocations else None  # no heap table where nothing can fill it
            rec.allocations = 0 if rec._allocs_why else rec.allocations
            rec._stack_threads = thread_tuple(stack_threads) if stacks else None
            if capacity is None:
                capacity = DEFAULT_CAPACITY if role() == "main" else HELPER_CAPACITY
                if address_space() is not None:  # every mapped byte counts against ulimit -v: the job's, first
                    capacity = min(capacity, SMALL_CAPACITY)
            history = DEFAULT_HISTORY_ENTRIES if allocator_history is True else int(allocator_history)
            if sync_interval is not None and not float(sync_interval) > 0:
                raise ValueError(f"sync_interval must be > 0 seconds or None, got {sync_interval}")
            rec.sync_interval = None if sync_interval is None else float(sync_interval)
            rec._arm(path, int(capacity), float(sample_interval), int(strings_size), on_fork, history, bool(modules))
        except Exception as exc:
            teardown(rec, flush=False)  # create_ring removed any partial file
            where = f" at {rec.path}" if rec.path else ""
            warn(f"blackbox is disarmed: could not arm the ring{where}: {exc}")
        return rec

    def _arm(
        self,
        path: str | os.PathLike[str] | None,
        capacity: int,
        interval: float,
        strings: int,
        on_fork: str,
        history: int,
        modules: bool,
    ) -> None:
        if capacity < MIN_CAPACITY:
            raise ValueError(f"capacity must be at least {MIN_CAPACITY} slots, got {capacity}")
        if not interval > 0:
            raise ValueError(f"sample_interval must be > 0 seconds, got {interval}")
        if on_fork not in ("disarm", "rearm"):
            raise ValueError(f"on_fork must be 'disarm' or 'rearm', got {on_fork!r}")
        if history < 0:
            raise ValueError(f"allocator_history must be True, False or a number of entries, got {history}")
        wall, mono = _clock_pair()
        ident = identity()
        self.role, self._identity, self._started_ns = ident["role"], ident, wall
        target, is_folder = resolve_target(path)
        folder = target if is_folder else target.parent
        if not is_folder and not target.suffix and not os.path.lexists(target):  # arm("rings"): a file or a folder?
            warn(f"made the ring file {target} (a path that does not exist names the ring file: end it with "
                 f"'/', or make the folder first, for a folder of rings)")  # fmt: skip
        if path is None:
            safe_folder(folder)  # the default folder: ours alone, or we do not arm
        else:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if (why := keep_at_arm(folder, self._keep)) is not None:  # the oldest rings and runs go, none in use
            warn(why)
        if is_folder:
            target = folder / ring_name(ident["host"], ident["pid"], ident["rank"], wall)
        self.path = target
        if is_diskless(folder):
            warn(
                f"the ring folder {folder} is on a RAM filesystem (tmpfs): its pages count "
                "against the memory limit that kills the job; set BLACKBOX_DIR to a disk-backed folder"
            )
        self._probe = HostProbe()
        cg = self._probe.cgroup
        backend, c_ext = "c" if c_writer_module() is not None else "python", built_module() is not None
        lim = limits()
        meta = {
            "format_version": fmt.FORMAT_VERSION,
            "writer": {"package": "blackbox", "version": __version__, "backend": backend, "c_extension": c_ext},
            "identity": ident,
            "clock": {"wall_ns": wall, "monotonic_ns": mono, "error_s": clock_error_s()},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall / 1e9))
            + f".{(wall // 1000) % 1_000_000:06d}Z",
            "versions": versions(__version__),
            "sample_interval_s": interval,
            "options": {
                "allocator_history": history,
                "modules": modules,
                "on_fork": on_fork,
                "sync_interval_s": self.sync_interval,
                "stack_threads": None
                if self._stack_threads is None
                else [str(getattr(t, "name", t)) for t in self._stack_threads],
                "allocations_mean_bytes": self.allocations,
                "alerts": self.alert_settings if self.role == "main" else None,
            },
            "cgroup": {"version": cg.version, "path": str(cg.directory)} if cg else None,
            "limits": lim,
        }
        if (fr := flight_recorder()) is not None:  # absent otherwise: older readers refuse a null object
            meta["flight_recorder"] = fr
        limited = lim["address_space"] is not None
        if limited:
            self.notes.append(f"an address-space limit (RLIMIT_AS, ulimit -v) of {lim['address_space']} bytes is "
                              "set: the ring and the sampler thread's stack and heap are small, to take little of it")

        def header_for(locked: bool) -> bytes:
            m = dict(meta, liveness=LOCK_LIVENESS if locked else "pid")
            heap = heap_bytes("helper" if limited else self.role, self.allocations)
            stacks = DEFAULT_STACKS_SIZE + tail_bytes(self.allocations)
            return fmt.encode_header(capacity, strings, m, stacks_size=stacks,
                                     crash_size=fmt.DEFAULT_CRASH_SIZE, heap_size=heap)  # fmt: skip

        ring = self._ring = create_ring(target, header_for)
        self.path = ring.path
        if ring.note:
            self.notes.append(ring.note)
            warn(ring.note)
        if built_module() is None and not os.environ.get(NO_C_SAID_ENV) and not _said["no_c"]:  # once a process
            _said["no_c"] = True  # (`blackbox run` says it once for the whole job)
            warn(NO_C_EXTENSION)
        hdr = self._header = ring.header
        self._writer = RingWriter(
            ring.map.buffer,
            hdr.records_offset,
            capacity,
            hdr.strings_offset,
            hdr.strings_size,
            self._on_error,
            backend=backend,
            file_mapped=True,
        )
        self.writer_backend = backend
        self.capacity, self.sample_interval, self.armed = capacity, interval, True
        w = self._writer
        self.mark, self.step, self._event = w.mark, w.step, w.event
        w.event(fmt.KIND_CODES["arm"], None, capacity)
        for text in self.notes:
            w.event(_KIND_MARK, fmt.NOTE_PREFIX + text)
        install_collectors(self, ring.path, history, modules)
        self.sample_now()
        self._sampler = threading.Thread(target=self._sample_loop, name="blackbox-sampler", daemon=True)
        if self._allocs is not None:
            self._allocs.adopt(self._sampler)
        start_thread(self._sampler, SAMPLER_STACK if limited else None)

    def note(self, text: str) -> None:
        """Something a collector could not do: kept in ``notes`` and written as a ``blackbox: ...`` mark."""
        self.notes.append(text)
        w = self._writer
        if w is not None:
            w.event(_KIND_MARK, fmt.NOTE_PREFIX + text)

    # ------------------------------------------------------------ the API
    def phase(self, name: str) -> Phase:
        """``with recorder.phase("forward"):`` writes phase_begin and phase_end events."""
        return Phase(self._event, name)

    def sample_now(self) -> None:
        """Write one ``sample`` record (host memory) and a ``gpu_sample`` per device in use."""
        w, probe, gpu = self._writer, self._probe, self._gpu
        if w is None or probe is None:
            return
        if self._allocs is not None:
            self._allocs.tick(w.current_step())
        if self._stacks is not None:  # before the memory sample: a tick's stacks precede its figures
            self._sample_stacks()
        figures = probe.read()
        self.peak_rss = max(self.peak_rss, figures[0])
        w.sample(figures)
        stat = probe.memory_stat()
        if stat is not None:
            w.event(_KIND_CGROUP_SAMPLE, None, None, -1, stat)
        for pid, rss, comm in probe.last_children:
            w.event(_KIND_CHILD_SAMPLE, comm or None, None, -1, (pid, rss))
        readings = gpu.poll() if gpu is not None else []
        for device, payload in readings:
            w.event(_KIND_GPU_SAMPLE, None, None, device, payload)
        if self._alerts is not None:
            tick_alerts(self, figures, readings)
        self._drop_ring_pages()

    def _drop_ring_pages(self) -> None:
        """Unmap the ring's pages this process no longer writes (mapping.py, "Residency")."""
        ring, w, hdr = self._ring, self._writer, self._header
        if ring is not None and w is not None and hdr is not None:
            ring.map.drop_idle(hdr.records_offset, hdr.records_offset + hdr.capacity * fmt.RECORD_SIZE, w.sequence)

    def _sample_stacks(self) -> None:
        """The tick's stack samples; a failure turns stacks off with one warning, never the recorder."""
        sampler = self._stacks
        try:
            if sampler is not None:
                sampler.sample()
        except Exception as exc:
            if the_jobs(exc) is not None:  # the job's handler raised as disarm took the last sample: the job's
                raise
            if sampler is not None and not sampler.closed:
                self._stacks = None
                sampler.close()
                warn(f"blackbox stopped sampling stacks: {type(exc).__name__}: {exc}")

    @property
    def exception_recorder(self) -> ExceptionRecorder | None:
        return self._exceptions if self.armed else None

    @property
    def signals_recorded(self) -> list[str]:
        """The signals whose handler is in place now (empty where the C extension is not built)."""
        return list(self._signals.installed) if self._signals is not None and self.armed else []

    def current_step(self) -> int | None:
        """The step in force (None before the first ``step()``)."""
        s = self._writer.current_step() if self._writer else -1
        return None if s < 0 else s

    def _sample_loop(self) -> None:
        stop, interval, sync = self._stop, self.sample_interval, self.sync_interval
        tick = min(interval, sync) if sync is not None else interval
        now = time.monotonic()
        next_sample, next_sync = now + interval, now + sync if sync is not None else float("inf")
        try:
            while not stop.wait(tick):
                now = time.monotonic()
                if now >= next_sample - 1e-4:
                    next_sample = now + interval
                    self.sample_now()
                    upkeep(self)
                if now >= next_sync - 1e-4:
                    next_sync = now + (sync or 0.0)
                    self.sync()
        except Exception as exc:  # a probe that breaks stops sampling, never the job
            self._on_error(exc)
        finally:
            self._sampled.set()

    def sync(self) -> None:
        """msync the ring: what is written so far survives a kernel crash or power loss too.

        With ``sync_interval`` the sampler does this periodically, so such a crash
        loses at most the last ``sync_interval`` seconds (plus one msync's duration).
        """
        ring = self._ring
        if ring is None or not self.armed:
            return
        t0 = time.perf_counter()
        try:
            ring.map.flush()
        except (OSError, ValueError) as exc:
            self._on_error(exc)
            return
        self.syncs += 1
        self.sync_seconds += time.perf_counter() - t0

    def _on_error(self, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            warn(f"blackbox dropped an event: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------ ending (_recorder_end.py)
    def disarm(self, *, at_exit: bool = False) -> None:
        """Record a clean end and release the ring. Safe to call twice, from any thread or handler.
        ``at_exit``: the interpreter is exiting; the process's exit status is then written as it exits."""
        disarm(self, at_exit=at_exit)

    def abandon_after_fork(self) -> None:
        """In a forked child: stop writing into the parent's ring without touching it."""
        abandon_after_fork(self)

    def __repr__(self) -> str:
        state = "armed" if self.armed else "disarmed"
        return f"<blackbox.Recorder {state} path={str(self.path)!r} capacity={self.capacity}>"
