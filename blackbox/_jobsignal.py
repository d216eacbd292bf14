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
