"""The Recorder: one armed ring, its sampler thread, and its clean end.

A Recorder never raises into the job. Arming failures (a full disk, a
read-only folder, a path that exists) become one :class:`BlackboxWarning` and a
disarmed Recorder whose methods do nothing.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from ._errors import BlackboxWarning
from ._version import __version__
from .collect.exceptions import ExceptionRecorder
from .collect.gpu import GpuProbe
from .collect.host import HostProbe
from .collect.signals import CrashFile, SignalRecorder
from .collect.torch_hooks import DEFAULT_HISTORY_ENTRIES, TorchHooks
from .ring import format as fmt
from .ring.file import (
    SNAPSHOT_SUFFIX,
    boot_id,
    create_ring,
    default_dir,
    hostname,
    is_diskless,
    lock_pages,
    ring_name,
    sidecar,
)
from .ring.retention import KEEP_ENV, prune_ring_folder
from .ring.writer import RingWriter, c_writer_module

DEFAULT_CAPACITY = 1 << 18  # 262,144 slots: 32 MiB of records
DEFAULT_SAMPLE_INTERVAL = 0.1  # seconds
DEFAULT_STRINGS_SIZE = 1 << 20  # 1 MiB of interned strings
MIN_CAPACITY = 16
MAX_ARGV_CHARS = 16384
_KIND_PHASE_BEGIN = fmt.KIND_CODES["phase_begin"]
_KIND_PHASE_END = fmt.KIND_CODES["phase_end"]
_KIND_GPU_SAMPLE = fmt.KIND_CODES["gpu_sample"]
_KIND_MARK = fmt.KIND_CODES["mark"]


def warn(message: str) -> None:
    """One warning, never an exception (even under ``-W error``)."""
    try:
        warnings.warn(message, BlackboxWarning, stacklevel=3)
    except Exception:
        try:
            sys.stderr.write(f"BlackboxWarning: {message}\n")
        except Exception:
            pass


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _argv() -> list[str]:
    out, used = [], 0
    for arg in sys.argv:
        if used + len(arg) > MAX_ARGV_CHARS:
            out.append("...")
            break
        out.append(arg)
        used += len(arg)
    return out


def _clock_pair() -> tuple[int, int]:
    """(wall ns, monotonic ns) read as close together as Python allows."""
    m0 = time.monotonic_ns()
    wall = time.time_ns()
    m1 = time.monotonic_ns()
    return wall, (m0 + m1) // 2


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


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


def _null_event(*_args: Any, **_kwargs: Any) -> int:
    return 0


class Recorder:
    """An armed (or, after a failure or ``disarm()``, inert) flight recorder.

    Attributes:
        path: the ring file, or None if arming failed before one was made.
        armed: True while events are being written.
        capacity: number of record slots in the ring.
        sample_interval: seconds between host-memory samples.
        writer_backend: ``"c"`` (the compiled write path) or ``"python"``; None until armed.
    """

    mark: Callable[..., None]
    step: Callable[..., None]

    def __init__(self) -> None:
        self.path: Path | None = None
        self.armed = False
        self.capacity = 0
        self.sample_interval = 0.0
        self.on_fork = "disarm"
        self.pages_locked = False
        self.writer_backend: str | None = None
        self.sync_interval: float | None = None
        self.syncs = 0
        self.sync_seconds = 0.0
        self.mark = _noop
        self.step = _noop
        self._event: Callable[..., int] = _null_event
        self._writer: RingWriter | None = None
        self._map: Any = None
        self._fd = -1
        self._probe: HostProbe | None = None
        self._gpu: GpuProbe | None = None
        self._torch: TorchHooks | None = None
        self._exceptions: ExceptionRecorder | None = None
        self._signals: SignalRecorder | None = None
        self._crash: CrashFile | None = None
        self.notes: list[str] = []
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None
        self._warned = False
        self._lock = threading.Lock()

    # ------------------------------------------------------------ arming
    @classmethod
    def arm(
        cls,
        path: str | os.PathLike[str] | None = None,
        *,
        capacity: int = DEFAULT_CAPACITY,
        sample_interval: float = DEFAULT_SAMPLE_INTERVAL,
        strings_size: int = DEFAULT_STRINGS_SIZE,
        on_fork: str = "disarm",
        allocator_history: bool | int = False,
        modules: bool = False,
        sync_interval: float | None = None,
    ) -> Recorder:
        rec = cls()
        rec.on_fork = on_fork
        try:
            history = DEFAULT_HISTORY_ENTRIES if allocator_history is True else int(allocator_history)
            if sync_interval is not None and not float(sync_interval) > 0:
                raise ValueError(f"sync_interval must be > 0 seconds or None, got {sync_interval}")
            rec.sync_interval = None if sync_interval is None else float(sync_interval)
            rec._arm(path, int(capacity), float(sample_interval), int(strings_size), on_fork, history, bool(modules))
        except Exception as exc:
            rec._teardown(flush=False)  # create_ring removed any partial file
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
        host, pid, rank = hostname(), os.getpid(), _env_int("RANK")
        target = Path(path) if path is not None else default_dir()
        if path is None or target.is_dir():
            target.mkdir(mode=0o700, parents=True, exist_ok=True)
            keep = os.environ.get(KEEP_ENV)
            if keep:  # the oldest rings go; never one still being written. A bad setting never stops arming.
                try:
                    prune_ring_folder(target, keep)
                except Exception as exc:
                    warn(f"{KEEP_ENV} not applied: {exc}")
            target = target / ring_name(host, pid, rank, wall)
        self.path = target
        if is_diskless(target.parent):
            warn(
                f"the ring folder {target.parent} is on a RAM filesystem (tmpfs): its pages count "
                "against the memory limit that kills the job; set BLACKBOX_DIR to a disk-backed folder"
            )
        self._probe = HostProbe()
        cg = self._probe.cgroup
        backend = "c" if c_writer_module() is not None else "python"
        meta = {
            "format_version": fmt.FORMAT_VERSION,
            "writer": {"package": "blackbox", "version": __version__, "backend": backend},
            "identity": {
                "host": host,
                "pid": pid,
                "ppid": os.getppid(),
                "rank": rank,
                "local_rank": _env_int("LOCAL_RANK"),
                "world_size": _env_int("WORLD_SIZE"),
                "argv": _argv(),
                "boot_id": boot_id(),
            },
            "clock": {"wall_ns": wall, "monotonic_ns": mono},
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(wall / 1e9))
            + f".{(wall // 1000) % 1_000_000:06d}Z",
            "versions": _versions(),
            "sample_interval_s": interval,
            "options": {
                "allocator_history": history,
                "modules": modules,
                "on_fork": on_fork,
                "sync_interval_s": self.sync_interval,
            },
            "cgroup": {"version": cg.version, "path": str(cg.directory)} if cg else None,
        }
        header = fmt.encode_header(capacity, strings, meta)
        hdr = fmt.decode_header(header, len(header))
        self._fd, self._map = create_ring(target, header, hdr.file_size)
        self.pages_locked = lock_pages(self._map)
        self._writer = RingWriter(
            self._map,
            hdr.records_offset,
            capacity,
            hdr.strings_offset,
            hdr.strings_size,
            self._on_error,
            backend=backend,
        )
        self.writer_backend = backend
        self.capacity, self.sample_interval, self.armed = capacity, interval, True
        w = self._writer
        self.mark, self.step, self._event = w.mark, w.step, w.event
        w.event(fmt.KIND_CODES["arm"], None, capacity)
        self._install_collectors(target, history, modules)
        self.sample_now()
        self._sampler = threading.Thread(target=self._sample_loop, name="blackbox-sampler", daemon=True)
        self._sampler.start()

    def _install_collectors(self, ring: Path, history: int, modules: bool) -> None:
        """Exceptions, signals, crash file, GPU and torch hooks: each one that fails is noted, not fatal."""
        w = self._writer
        assert w is not None and self._probe is not None
        self._exceptions = ExceptionRecorder(w.event, w.intern)
        self._signals = SignalRecorder(w.event, w.intern)
        self._crash = CrashFile(ring)
        self._gpu = GpuProbe()
        self._torch = TorchHooks(
            w,
            modules=modules,
            allocator_history=history,
            snapshot_path=sidecar(ring, SNAPSHOT_SUFFIX),
            rss=self._probe.rss,
            note=self.note,
        )
        for what, install in (
            ("exception hooks", self._exceptions.install),
            ("signal handlers", self._signals.install),
            ("crash file", self._crash.enable),
            ("torch hooks", self._torch.poll),
        ):
            try:
                why = install()
                if why:
                    self.note(f"{what} not installed: {why}")
            except Exception as exc:
                self.note(f"{what} not installed: {type(exc).__name__}: {exc}")
        if self._crash.note:
            self.notes.append(self._crash.note)  # the job's own choice, not a failure: no event

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
        w.sample(probe.read() + (fmt.NULL,))
        if gpu is not None:
            for device, payload in gpu.poll():
                w.event(_KIND_GPU_SAMPLE, None, None, device, payload)

    @property
    def exception_recorder(self) -> ExceptionRecorder | None:
        return self._exceptions if self.armed else None

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
                    hooks = self._torch
                    if hooks is not None:
                        hooks.poll()
                if now >= next_sync - 1e-4:
                    next_sync = now + (sync or 0.0)
                    self.sync()
        except Exception as exc:  # a probe that breaks stops sampling, never the job
            self._on_error(exc)

    def sync(self) -> None:
        """msync the ring: what is written so far survives a kernel crash or power loss too.

        With ``sync_interval`` the sampler does this periodically, so such a crash
        loses at most the last ``sync_interval`` seconds (plus one msync's duration).
        """
        m = self._map
        if m is None or not self.armed:
            return
        t0 = time.perf_counter()
        try:
            m.flush()
        except (OSError, ValueError) as exc:
            self._on_error(exc)
            return
        self.syncs += 1
        self.sync_seconds += time.perf_counter() - t0

    def _on_error(self, exc: BaseException) -> None:
        if not self._warned:
            self._warned = True
            warn(f"blackbox dropped an event: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------ ending
    def disarm(self) -> None:
        """Record a clean end and release the ring. Safe to call twice."""
        with self._lock:
            if not self.armed:
                return
            self.armed = False
            self._stop.set()
            sampler = self._sampler
            if sampler is not None and sampler is not threading.current_thread():
                sampler.join(timeout=max(1.0, 2 * self.sample_interval))
            self._uninstall_collectors(in_child=False)
            try:
                self.sample_now()
                if self._writer is not None:
                    self._writer.event(fmt.KIND_CODES["disarm"])
                if self._map is not None:
                    fmt.STATE_STRUCT.pack_into(self._map, fmt.STATE_OFFSET, fmt.STATE_CLEAN)
            except Exception as exc:
                self._on_error(exc)
            self._teardown(flush=True)

    def abandon_after_fork(self) -> None:
        """In a forked child: stop writing into the parent's ring without touching it."""
        self.armed = False
        self._stop.set()
        self._sampler = None
        self._uninstall_collectors(in_child=True)
        self._teardown(flush=False)

    def _uninstall_collectors(self, *, in_child: bool) -> None:
        """Put back every hook this recorder installed (in a forked child: no torch/CUDA calls)."""
        torch, exceptions, signals, crash = self._torch, self._exceptions, self._signals, self._crash
        steps: list[Callable[[], None]] = []
        if torch is not None:
            steps.append(lambda: torch.detach(final_drain=not in_child, in_child=in_child))
        if exceptions is not None:
            steps.append(exceptions.uninstall)
        if signals is not None:
            steps.append(signals.uninstall)
        if crash is not None:
            steps.append(lambda: crash.disable(keep_if_empty=in_child))
        for step in steps:
            try:
                step()
            except Exception as exc:
                self._on_error(exc)

    def _teardown(self, *, flush: bool) -> None:
        self.mark, self.step, self._event = _noop, _noop, _null_event
        if self._writer is not None:
            self._writer.kill()
            self._writer = None
        if self._map is not None:
            try:
                if flush:
                    self._map.flush()
                self._map.close()
            except (OSError, ValueError, BufferError):
                pass
            self._map = None
        if self._fd >= 0:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = -1
        if self._probe is not None:
            self._probe.close()
            self._probe = None

    def __repr__(self) -> str:
        state = "armed" if self.armed else "disarmed"
        return f"<blackbox.Recorder {state} path={str(self.path)!r} capacity={self.capacity}>"


def _versions() -> dict[str, str | None]:
    import numpy

    torch = sys.modules.get("torch")  # never import torch ourselves
    return {
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "blackbox": __version__,
    }
