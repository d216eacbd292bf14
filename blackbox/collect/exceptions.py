"""Exceptions and exits into the ring: chained excepthooks, ``sys.exit`` and ``capture_oom``.

``sys.excepthook`` and ``threading.excepthook`` are wrapped, not replaced: the
wrapper writes one ``oom`` or ``exception`` event (an uncaught
``KeyboardInterrupt`` too: it tells an interrupt from a clean exit) and then
calls the hook that was there before, so the user's traceback still prints and
the exit status is unchanged. ``sys.exit`` is wrapped the same way: called from
the main thread, it writes an ``exit`` event with the status the process will
exit with, then raises exactly what it would have. An exception already
recorded by ``capture_oom`` is not recorded twice when it later goes uncaught.
"""

from __future__ import annotations

import functools
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from ..ring import format as fmt
from .oom import classify

KIND_OOM = fmt.KIND_CODES["oom"]
KIND_EXCEPTION = fmt.KIND_CODES["exception"]
KIND_EXIT = fmt.KIND_CODES["exit"]
MAX_DETAIL = 512

Event = Callable[..., int]
Intern = Callable[[Any], int]


class ExceptionRecorder:
    """Writes exception events for one Recorder and owns its excepthook wrappers."""

    def __init__(self, event: Event, intern: Intern) -> None:
        self._event = event
        self._intern = intern
        self._recent: deque[BaseException] = deque(maxlen=32)
        self._sys_hook: Any = None
        self._thread_hook: Any = None
        self._prev_sys: Any = None
        self._prev_thread: Any = None
        self._prev_exit: Any = None
        self._our_exit: Any = None

    def record(self, exc: BaseException, detail: str) -> str:
        """Write the event; returns its kind (``oom`` or ``exception``), or "" if already recorded."""
        try:
            if any(e is exc for e in self._recent):
                return ""
            self._recent.append(exc)
            kind, label, wrapper = classify(exc)
            if wrapper:
                detail = f"{detail}; raised as {wrapper}"
            code = KIND_OOM if kind == "oom" else KIND_EXCEPTION
            sid = self._intern(detail[:MAX_DETAIL])
            self._event(code, label, None, -1, (sid, fmt.NULL, fmt.NULL) if code == KIND_OOM else (sid,))
            return kind
        except Exception:
            return ""

    def install(self) -> None:
        prev_sys, prev_thread = sys.excepthook, threading.excepthook

        def sys_hook(et: type[BaseException], ev: BaseException, tb: TracebackType | None) -> Any:
            if ev is not None and not isinstance(ev, SystemExit):
                self.record(ev, "uncaught")
            return prev_sys(et, ev, tb)

        def thread_hook(args: Any) -> Any:
            ev = args.exc_value
            if ev is not None and not isinstance(ev, SystemExit):
                name = getattr(args.thread, "name", None) or "?"
                self.record(ev, f"uncaught in thread {name}")
            return prev_thread(args)

        self._prev_sys, self._prev_thread = prev_sys, prev_thread
        self._sys_hook, self._thread_hook = sys_hook, thread_hook
        sys.excepthook = sys_hook
        threading.excepthook = thread_hook
        self._wrap_exit()

    def _wrap_exit(self) -> None:
        original = sys.exit

        @functools.wraps(original)
        def exit(status: Any = None) -> Any:
            if threading.current_thread() is threading.main_thread():
                self.record_exit(status)
            return original(status)

        self._prev_exit, self._our_exit = original, exit
        sys.exit = exit

    def record_exit(self, status: Any) -> None:
        """An ``exit`` event: the status the process exits with (a non-int status prints and exits 1)."""
        try:
            if status is None or isinstance(status, int):
                self._event(KIND_EXIT, None, int(status or 0))
            else:
                self._event(KIND_EXIT, str(status)[:MAX_DETAIL], 1)
        except Exception:
            pass

    def uninstall(self) -> None:
        """Put the previous hooks back, where ours are still the ones installed."""
        if self._sys_hook is not None and sys.excepthook is self._sys_hook:
            sys.excepthook = self._prev_sys
        if self._thread_hook is not None and threading.excepthook is self._thread_hook:
            threading.excepthook = self._prev_thread
        if self._our_exit is not None and sys.exit is self._our_exit:
            sys.exit = self._prev_exit
        self._sys_hook = self._thread_hook = self._our_exit = None


def format_context(context: str, metadata: dict[str, Any]) -> str:
    """``capture_oom: CONTEXT k=v ...`` (the detail of a captured exception)."""
    parts = [f"capture_oom: {context}"] + [
        f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in metadata.items()
    ]
    return " ".join(parts)


@contextmanager
def capture(recorder: Callable[[], ExceptionRecorder | None], context: str, metadata: dict[str, Any]) -> Iterator[None]:
    """Record an exception raised inside the block (kind ``oom`` or ``exception``), then re-raise it."""
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            rec = recorder()
            if rec is not None:
                rec.record(exc, format_context(context, metadata))
        raise
