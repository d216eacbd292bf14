"""What follows an alert (``collect.alerts``): the job's ``on_alert`` callbacks, a last chance to save the
work (the alert signal), and the watchdog. Each thing blackbox does is an ``alert_action`` record.

- **The alert signal** (opt-in: ``blackbox run --alert-signal USR1``, ``arm(alert_signal=...)``): at the
  first critical alert (use past the critical level, or the forecast under ``alert_before``), the signal
  goes once to this process, the job's main process (each rank's own, under torchrun), as a scheduler's
  ``--signal=USR1@90`` would: the signal Lightning and Slurm jobs checkpoint on. Only where the job has a
  handler for it: a signal whose default action ends the process is never sent (that would be blackbox
  ending the job), and the record says why not. The sending is written before the signal goes, so the
  signal record that follows is known as blackbox's, never taken for someone else's. Whether the job's
  handler ran before the kill: for this one delivery the handler is wrapped (``_in_main``), and the
  wrapper writes when it was entered and when it returned. The wrapper is set in the main thread (only
  it may call ``signal.signal``) by a pending call (``Py_AddPendingCall``: the main thread runs it at its
  next bytecode boundary, where it would run the handler), which the sampler waits for (0.5 s at most: a
  main thread inside a long C call runs it later) before it sends the signal. (A profile function, set the
  same way, sees nothing on Python 3.10; and it would slow the handler's own checkpoint down.)
- **The watchdog** (opt-in: ``arm(watchdog=True)``, the seed's): on a GPU fragmentation alert, frees the
  caching allocator's unused cache (``torch.cuda.empty_cache()``, never where the job has not initialised
  CUDA), at most once in 30 s, and writes the bytes it freed.
- **Callbacks** (``blackbox.on_alert``): see ``on_alert``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from types import FrameType
from typing import Any

from .._jobsignal import Latch, _code_of, raised_by_signal_handler
from .._sigmask import let_through
from ..ring import format as fmt
from .alerts import Alert
from .gpu import loaded_torch
from .signals import RECORDED

KIND_ACTION = fmt.KIND_CODES["alert_action"]
SIGNAL_ENV, WATCHDOG_ENV = "BLACKBOX_ALERT_SIGNAL", "BLACKBOX_WATCHDOG"
SENT, NOT_SENT, ENTERED, RETURNED = "signal sent", "signal not sent", "handler entered", "handler returned"
NOT_WATCHED, EMPTIED, DROPPED = "handler not watched", "cache emptied", "callback dropped"
WATCHDOG_EVERY_S = 30.0
WATCH_WAIT_S = 0.5  # the sampler waits this long at most for the watch to be set before it sends the signal
_CALLBACKS: list[Callable[[Alert], object]] = []


def on_alert(fn: Callable[[Alert], object]) -> Callable[[Alert], object]:
    """Call ``fn(alert)`` at each alert of this process (a :class:`blackbox.Alert`: kind, level, value,
    limit, the forecast with its error, the top allocation site when allocations are sampled); returns
    ``fn``, so it serves as a decorator. Registered before or after ``arm()``, for the whole process.

    Where it runs: on ``blackbox-alerts``, a daemon thread of blackbox's own, never in the job's threads
    nor on the sampler. The sampler hands it each alert through a deque (an append: the sampler never
    waits for it), and nothing of the job ever waits for that thread: not a step, not a signal, not
    ``disarm()`` nor the interpreter's exit. So a callback that blocks (a lock the job holds while it
    writes a checkpoint, a slow disk) holds up later callbacks only, never the job: it cannot deadlock it.
    A callback never changes the job by itself: an exception it raises becomes one warning, and the
    callback is dropped (an ``alert_action`` record says so). What it does on purpose (save a checkpoint,
    set a flag the training loop reads to lower its batch size) is the job's own doing."""
    if not callable(fn):
        raise TypeError(f"on_alert expected a callable, found {type(fn).__name__}")
    _CALLBACKS.append(fn)
    return fn


def parse_signal(setting: Any) -> int | None:
    """A signal number from ``USR1``, ``SIGUSR1``, ``10`` or an int; None for None or ""."""
    if setting is None or setting == "":
        return None
    if isinstance(setting, int) and not isinstance(setting, bool):
        return int(signal.Signals(setting))
    text = str(setting).strip().upper()
    if text.isdigit():
        return int(signal.Signals(int(text)))
    name = text if text.startswith("SIG") else "SIG" + text
    if name not in signal.Signals.__members__:
        raise ValueError(f"alert_signal must name a signal (USR1, SIGTERM, 10), got {setting!r}")
    return int(signal.Signals[name])


class AlertActions:
    """Callbacks, the alert signal and the watchdog for one armed recorder."""

    def __init__(self, event: Callable[..., int], intern: Callable[[Any], int], signum: int | None,
                 watchdog: bool, top_site: Callable[[], dict[str, Any] | None] | None = None,
                 warn: Callable[[str], None] | None = None) -> None:  # fmt: skip
        self._event, self._intern, self._warn = event, intern, warn
        self.signum, self.watchdog = signum, watchdog
        self._top_site = top_site
        self._queue: deque[Alert] = deque()
        self._wake = threading.Lock()
        self._wake.acquire()  # released (by alerted) while there is work: the thread's wait
        self._thread: threading.Thread | None = None
        self._stopped = False
        self.signalled = False
        self._next_watchdog = 0.0
        self._keep: Any = None  # the pending call's C function, alive until it has run

    def alerted(self, alert: Alert) -> None:
        """On the sampler thread, at each alert: the signal at the first critical one; the rest handed on."""
        if self.signum is not None and alert.level == "critical" and not self.signalled:
            self.signalled = True
            self._send(self.signum, alert)
        if _CALLBACKS or (self.watchdog and alert.kind == "fragmentation"):
            self._queue.append(alert)
            if self._thread is None and not self._stopped:
                self._thread = threading.Thread(target=self._run, name="blackbox-alerts", daemon=True)
                self._thread.start()
            with contextlib.suppress(RuntimeError):  # released already: the thread will find this one too
                self._wake.release()

    def stop(self) -> None:
        """No more work (at disarm); nothing waits for a callback in flight."""
        self._stopped = True
        with contextlib.suppress(RuntimeError):
            self._wake.release()

    def _record(self, detail: str, alert: Alert | None, label: str | None = None, value: int | None = None) -> None:
        kind = next((c for c, n in fmt.ALERT_KINDS.items() if alert and n == alert.kind), -1)
        level = next((c for c, n in fmt.ALERT_LEVELS.items() if alert and n == alert.level), -1)
        self._event(KIND_ACTION, label, value, -1, (self._intern(detail), kind, level))

    # ------------------------------------------------------------ the alert signal
    def _send(self, signum: int, alert: Alert) -> None:
        name = signal.Signals(signum).name
        try:
            handler = signal.getsignal(signum)
        except (ValueError, OSError):
            handler = signal.SIG_DFL
        if handler in (signal.SIG_DFL, signal.SIG_IGN):
            why = "its default action would end the job" if handler == signal.SIG_DFL else "the job ignores it"
            self._record(NOT_SENT, alert, f"{name}: the job has no handler for it ({why})", signum)
            return
        code = _code_of(handler) if callable(handler) else None
        label = f"{code.co_name} ({code.co_filename}:{code.co_firstlineno})" if code else "a native handler"
        if code is not None:  # the watch first: set in the main thread before the signal can reach its handler
            watching = Latch()
            self._watch(signum, handler, label, alert, watching)
            watching.wait(WATCH_WAIT_S)  # a main thread inside a long C call sets it later: the signal goes anyway
        else:
            self._record(NOT_WATCHED, alert, label)
        self._record(SENT, alert, name, signum)
        os.kill(os.getpid(), signum)

    def _watch(self, signum: int, handler: Any, label: str, alert: Alert, watching: Latch) -> None:
        """A pending call into the main thread, which sets the one-shot watch of the job's handler there."""
        try:
            import ctypes

            callback_type = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
            self._keep = callback_type(lambda _arg: self._in_main(signum, handler, label, alert, watching))
            add = ctypes.pythonapi.Py_AddPendingCall
            add.argtypes, add.restype = [callback_type, ctypes.c_void_p], ctypes.c_int
            if add(self._keep, None) != 0:
                self._record(NOT_WATCHED, alert, label)
                watching.set()
        except Exception:
            self._record(NOT_WATCHED, alert, label)
            watching.set()

    def _in_main(self, signum: int, handler: Any, label: str, alert: Alert, watching: Latch) -> int:
        """In the main thread, at a bytecode boundary, just before the signal is sent: the job's handler,
        wrapped for this one delivery. The wrapper puts the job's handler back before it calls it (so the
        handler finds itself in place, and a second signal goes straight to it), writes when it was entered
        and when it returned or raised, and lets what it raises go to the job, as from the handler itself."""
        record = self._record

        def watched(signo: int, frame: FrameType | None) -> Any:
            with contextlib.suppress(Exception):
                signal.signal(signo, handler)
            record(ENTERED, alert, label)
            try:
                return handler(signo, frame)
            finally:
                record(RETURNED, alert, label)

        try:
            if signal.getsignal(signum) is handler:  # the job has not replaced it meanwhile
                signal.signal(signum, watched)
            else:
                self._record(NOT_WATCHED, alert, label + " (replaced by the job before the signal)")
        except Exception as exc:
            if raised_by_signal_handler(exc):
                raise
        finally:
            watching.set()
        return 0

    # ------------------------------------------------------------ the thread: watchdog and callbacks
    def _run(self) -> None:
        while not self._stopped:
            self._wake.acquire(timeout=5.0)
            while self._queue and not self._stopped:
                alert = self._queue.popleft()
                if self.watchdog and alert.kind == "fragmentation":
                    self._empty_cache(alert)
                if _CALLBACKS:
                    with let_through(RECORDED):  # the job's code: what it starts must not have them blocked
                        self._call(alert)

    def _empty_cache(self, alert: Alert) -> None:
        now = time.monotonic()
        torch = loaded_torch()
        if now < self._next_watchdog or torch is None:
            return
        try:
            if not torch.cuda.is_initialized():
                return
            self._next_watchdog = now + WATCHDOG_EVERY_S
            before = _reserved(torch)
            torch.cuda.empty_cache()
            self._record(EMPTIED, alert, "torch.cuda.empty_cache()", max(0, before - _reserved(torch)))
        except Exception as exc:
            self._record(EMPTIED, alert, f"torch.cuda.empty_cache() failed: {type(exc).__name__}: {exc}"[:200])

    def _call(self, alert: Alert) -> None:
        if alert.top_site is None and self._top_site is not None:
            try:
                alert.top_site = self._top_site()
            except Exception:
                alert.top_site = None
        for fn in list(_CALLBACKS):
            try:
                fn(alert)
            except BaseException as exc:  # noqa: BLE001 (a SystemExit here would end only this thread)
                with contextlib.suppress(ValueError):
                    _CALLBACKS.remove(fn)
                name = getattr(fn, "__qualname__", None) or repr(fn)
                self._record(DROPPED, alert, f"{name}: {type(exc).__name__}: {exc}"[:300])
                if self._warn is not None:
                    self._warn(f"blackbox dropped the on_alert callback {name}: it raised {type(exc).__name__}: {exc}")


def _reserved(torch: Any) -> int:
    total = 0
    for d in range(torch.cuda.device_count()):
        total += int(torch._C._cuda_memoryStats(d)["reserved_bytes"]["all"]["current"])
    return total


def alert_settings(alerts: bool, levels: Any, signal_setting: Any, before: float | None,
                   watchdog: bool | None) -> dict[str, Any] | None:  # fmt: skip
    """arm's alert settings, each None read from the environment (what ``blackbox run`` sets): the ring's
    ``options.alerts``; None where alerts are off. Raises ValueError on a bad one (arming then fails)."""
    if not alerts:
        return None
    from .alerts import BEFORE_ENV, DEFAULT_BEFORE_S, LEVELS_ENV, parse_levels

    warning, critical = parse_levels(os.environ.get(LEVELS_ENV) if levels is None else levels)
    signum = parse_signal(os.environ.get(SIGNAL_ENV) if signal_setting is None else signal_setting)
    raw = os.environ.get(BEFORE_ENV) if before is None else before
    before_s = DEFAULT_BEFORE_S if raw in (None, "") else float(raw)
    if not before_s >= 0:
        raise ValueError(f"alert_before must be seconds >= 0, got {raw!r}")
    if watchdog is None:
        watchdog = os.environ.get(WATCHDOG_ENV, "").strip().lower() in ("1", "true", "yes", "on")
    return {"levels": [warning, critical], "before_s": before_s, "watchdog": bool(watchdog),
            "signal": None if signum is None else signal.Signals(signum).name}  # fmt: skip
