"""Whether an exception caught inside blackbox's own code is the job's, raised by its signal handler.

CPython runs a Python signal handler in the main thread at the next bytecode boundary after the signal
arrives, whatever code that is: also blackbox's hooks, which run in the job's threads (optimizer and
module hooks, the excepthook, the ``sys.exit`` and ``signal.signal`` wrappers, the Python write path).
An exception the handler raises there (torch's SIGCHLD handler raises ``RuntimeError: DataLoader worker
(pid N) is killed by signal``) is the job's: unarmed, it would have propagated from the job's own code a
few bytecodes away. CPython clears the signal's flag before it calls the handler, so an exception
swallowed by blackbox is gone for good: the job never learns its worker died. Every ``except`` in code
that runs in the job's threads asks :func:`raised_by_signal_handler` and re-raises where it answers
True; KeyboardInterrupt and SystemExit pass anyway (no ``except Exception`` catches them).
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
from collections.abc import Callable
from types import CodeType
from typing import Any


def _code_of(handler: Any) -> CodeType | None:
    """The code object a Python signal handler runs first (a function, a bound method, a partial,
    an object with ``__call__``); None for anything else."""
    try:
        for _ in range(8):  # a partial of a partial of a bound method: bounded
            if isinstance(handler, functools.partial):
                handler = handler.func
                continue
            code = getattr(handler, "__code__", None)
            if isinstance(code, CodeType):
                return code
            func = getattr(handler, "__func__", None)
            if func is not None:
                handler = func
                continue
            if isinstance(handler, type):
                return None
            handler = type(handler).__call__  # an object called as a handler: its class's method
    except Exception as exc:  # a handler object whose attributes raise: not one we can name
        if _raised_in(exc, _INSTALLED):  # (the job's handler ran inside this walk, which only _INSTALLED names)
            raise
        return None
    return None


def _raised_in(exc: BaseException, codes: set[CodeType]) -> bool:
    """Whether a frame of one of ``codes`` is in ``exc``'s traceback."""
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


_INSTALLED: set[CodeType] = set()  # every handler the job installed while armed: a one-shot handler puts
_MAX_INSTALLED = 1024  # the default back before it raises, so it is no longer in the signal table


def remember_handler(handler: Any) -> None:
    """``handler`` was installed by the job (blackbox's ``signal.signal`` wrapper calls this)."""
    code = _code_of(handler) if callable(handler) else None
    if code is not None and len(_INSTALLED) < _MAX_INSTALLED:
        _INSTALLED.add(code)


def remember_handlers() -> None:
    """The job's handlers in the signal table now (at arm: those installed before blackbox's wrapper)."""
    for code in _handler_codes():
        if len(_INSTALLED) < _MAX_INSTALLED:
            _INSTALLED.add(code)


def _handler_codes() -> set[CodeType]:
    codes = set(_INSTALLED)
    for signum in signal.valid_signals():
        try:
            handler = signal.getsignal(signum)
        except ValueError:
            continue
        if callable(handler) and handler is not signal.default_int_handler:
            code = _code_of(handler)
            if code is not None:
                codes.add(code)
    return codes


def raised_by_signal_handler(exc: BaseException) -> bool:
    """True where ``exc`` came out of a Python signal handler installed in this process (its frame is in
    the traceback): the job's exception, to re-raise, never to swallow. Costs a walk of the signal table,
    on the error path only. Nothing here raises but a signal handler of the job's, which then propagates
    from here, as it should."""
    return exc.__traceback__ is not None and _raised_in(exc, _handler_codes())


def the_jobs(exc: BaseException) -> BaseException | None:
    """The job's exception in ``exc``: ``exc`` itself where it is no Exception (a KeyboardInterrupt, a
    handler's SystemExit: blackbox raises none) or came out of one of the job's signal handlers, else the
    first such in its ``__context__`` (a handler's exception that landed inside ``threading``'s lock
    handling turns into ``RuntimeError: release unlocked lock``, the job's as its context); None where it
    is blackbox's own failure."""
    seen: BaseException | None = exc
    for _ in range(8):  # a short chain: contexts may loop
        if seen is None:
            return None
        if not isinstance(seen, Exception) or raised_by_signal_handler(seen):
            return seen
        seen = seen.__context__
    return None


class Latch:
    """A flag set once and waited on with a timeout, for a thread blackbox starts and the job's main thread.
    It is a bare lock, held while unset, where ``threading.Event`` is Python code around a Condition: the
    job's handler exception landing just as that Condition's lock was taken left it held, and the next
    ``set()`` hung the job at exit (found by sweeping a handler's exception over the disarm's calls). Each
    call here is one C call on the lock; every wait has a timeout."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # set already
            self._lock.release()

    def is_set(self) -> bool:
        return not self._lock.locked()

    def wait(self, timeout: float) -> bool:
        """For blackbox's own thread (the job's handlers run in the main thread only): the main thread polls
        ``is_set()``."""
        if not self._lock.acquire(timeout=max(0.0, timeout)):
            return False
        self.set()  # (set again: it stays set for the other waiters)
        return True


POLL_S = 0.002  # the job's main thread waits for blackbox's thread by polling (see HeldForTheJob.wait)
TRIES = 3  # a step the job's handlers cut short is run at most this many times (a storm of signals ends it)


class HeldForTheJob:
    """Runs the steps that end a recording (``Recorder.disarm``) each to its end: an exception the job's
    signal handler raises inside one (torch's SIGCHLD handler, as a DataLoader worker dies while the job
    exits), or a KeyboardInterrupt, is held and the remaining steps still run, so the ring keeps its clean
    end and its exit record; ``raise_held()`` then gives the job its exception. blackbox's own failures go
    to ``on_error`` (one warning), as before. Before, such an exception ended the disarm midway: the ring
    read as SIGKILLed though the process exited with status 1 (1 run in 30 of tests/test_causes.py's
    DataLoader OOM)."""

    def __init__(self, on_error: Callable[[BaseException], None]) -> None:
        self.held: BaseException | None = None
        self._on_error = on_error

    def run(self, step: Callable[[], object], *, again: bool = False) -> None:
        """``step()``; the job's exception held (a KeyboardInterrupt, a SystemExit or any other
        BaseException: blackbox raises none of them; an Exception out of one of the job's signal handlers),
        blackbox's own failure to ``on_error``. ``again``: a step that can run twice (idempotent) is run
        again when the job's exception cut it short, up to ``TRIES`` times in all: the exit record's arming,
        cut short by a handler, was lost (the ring then read as SIGKILLed)."""
        for _ in range(TRIES if again else 1):
            try:
                step()
                return
            except BaseException as exc:  # noqa: BLE001 (KeyboardInterrupt, SystemExit: the job's, held)
                if not self._take(exc):
                    return

    def run_all(self, steps: list[tuple[Callable[[], object], bool]]) -> None:
        """``run(step, again=again)`` for each (step, again) in turn. An exception that lands as ``run``
        itself is entered (before its ``try``: a Python call is where a pending handler runs) cut nothing
        short: it is held or told like one from the step, and that step is run after all."""
        i = tries = 0
        while i < len(steps):
            try:
                step, again = steps[i]
                self.run(step, again=again)
                i += 1
            except BaseException as exc:  # noqa: BLE001 (the job's, as in run; blackbox's own to on_error)
                self._take(exc)
                tries += 1
                if tries >= TRIES:  # a storm of signals: the step is let go, as a failure of its own would be
                    i, tries = i + 1, 0

    def wait(self, done: Latch | threading.Event, timeout: float) -> None:
        """Until ``done.is_set()`` or ``timeout`` seconds, polled, whatever the job's handlers raise meanwhile.
        (Not ``Thread.join``: one interrupted by a handler's exception takes the thread for ended, bpo-45274.)"""
        deadline = time.monotonic() + timeout
        while not done.is_set() and (left := deadline - time.monotonic()) > 0:
            self.run(lambda: time.sleep(min(POLL_S, left)))  # polled: taking the latch's lock to wait on it, a
            # handler's exception landing just after would leave it held, and the latch unset (a wait of hours)

    def _take(self, exc: BaseException) -> bool:
        """Hold the job's exception in ``exc`` (True), or tell ``on_error`` of blackbox's own (False)."""
        job = the_jobs(exc)
        if job is None:
            self._on_error(exc)
            return False
        self._hold(job)
        return True

    def _hold(self, exc: BaseException) -> None:
        if self.held is None:  # the first: a handler's later ones follow from the same death
            self.held = exc

    def raise_held(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            raise held
