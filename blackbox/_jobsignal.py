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
    except Exception:  # a handler object whose attributes raise: not one we can name
        return None
    return None


def _handler_codes() -> set[CodeType]:
    codes = set()
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
    tb = exc.__traceback__
    if tb is None:
        return False
    codes = _handler_codes()
    while tb is not None and codes:
        if tb.tb_frame.f_code in codes:
            return True
        tb = tb.tb_next
    return False


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

    def run(self, step: Callable[[], object]) -> None:
        try:
            step()
        except KeyboardInterrupt as exc:
            self._hold(exc)
        except Exception as exc:
            if raised_by_signal_handler(exc):
                self._hold(exc)
            else:
                self._on_error(exc)

    def wait(self, done: threading.Event, timeout: float) -> None:
        """``done.wait(timeout)``, waited out whatever the job's handlers raise meanwhile. (Not
        ``Thread.join``: one interrupted by a handler's exception takes the thread for ended, bpo-45274.)"""
        deadline = time.monotonic() + timeout
        while not done.is_set() and (left := deadline - time.monotonic()) > 0:
            self.run(lambda: done.wait(left))

    def _hold(self, exc: BaseException) -> None:
        if self.held is None:  # the first: a handler's later ones follow from the same death
            self.held = exc

    def raise_held(self) -> None:
        held, self.held = self.held, None
        if held is not None:
            raise held
