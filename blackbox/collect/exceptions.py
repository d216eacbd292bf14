"""Exceptions into the ring: chained excepthooks and ``capture_oom``.

``sys.excepthook`` and ``threading.excepthook`` are wrapped, not replaced: the
wrapper writes one ``oom`` or ``exception`` event and then calls the hook that
was there before, so the user's traceback still prints and the exit status is
unchanged. An exception already recorded by ``capture_oom`` is not recorded
twice when it later goes uncaught.
"""

from __future__ import annotations

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
            if ev is not None and not isinstance(ev, (KeyboardInterrupt, SystemExit)):
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

    def uninstall(self) -> None:
        """Put the previous hooks back, where ours are still the ones installed."""
        if self._sys_hook is not None and sys.excepthook is self._sys_hook:
            sys.excepthook = self._prev_sys
        if self._thread_hook is not None and threading.excepthook is self._thread_hook:
            threading.excepthook = self._prev_thread
        self._sys_hook = self._thread_hook = None


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
