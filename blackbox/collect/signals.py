"""Signals and native crashes.

SIGTERM, SIGINT, SIGHUP, SIGUSR1 and SIGUSR2 become ``signal`` events. The
handler that was installed before ours is chained: a Python handler is called,
an ignored signal stays ignored, and a default one is restored and the signal
raised again, so the process ends exactly as it would have (killed by that
signal, with that exit status). Handlers can only be set from the main thread;
a signal whose handler was set outside Python is left alone.

Native crashes (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL): ``faulthandler``
writes every thread's Python traceback to ``<ring>.crash``; ``recover`` folds
that file into the bundle. A job that enabled faulthandler itself keeps its own.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from ..ring import format as fmt
from ..ring.file import CRASH_SUFFIX, sidecar

KIND_SIGNAL = fmt.KIND_CODES["signal"]
RECORDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")


class SignalRecorder:
    """Writes signal events for one Recorder and owns its handlers."""

    def __init__(self, event: Callable[..., int], intern: Callable[[Any], int]) -> None:
        self._event = event
        self._intern = intern
        self._previous: dict[int, Any] = {}
        self.installed: list[str] = []

    def install(self) -> str:
        """Install the handlers; returns why not, or "" when they are installed."""
        if threading.current_thread() is not threading.main_thread():
            return "arm() was not called from the main thread"
        for name in RECORDED:
            signum = getattr(signal, name, None)
            if signum is None:
                continue
            try:
                previous = signal.getsignal(signum)
                if previous is None:
                    continue  # a handler set outside Python: leave it alone
                signal.signal(signum, self._handle)
            except (OSError, ValueError, RuntimeError):
                continue
            self._previous[signum] = previous
            self.installed.append(name)
        return ""

    def _handle(self, signum: int, frame: FrameType | None) -> Any:
        previous = self._previous.get(signum, signal.SIG_DFL)
        if callable(previous):
            how = "chained to the job's handler"
        elif previous == signal.SIG_IGN:
            how = "ignored, as before"
        else:
            how = "default action"
        try:
            name = signal.Signals(signum).name
            self._event(KIND_SIGNAL, name, signum, -1, (self._intern(how),))
        except Exception:
            pass
        if callable(previous):
            return previous(signum, frame)
        if previous == signal.SIG_IGN:
            return None
        signal.signal(signum, signal.SIG_DFL)  # end the process the way the signal would have
        os.kill(os.getpid(), signum)
        return None

    def uninstall(self) -> None:
        """Restore the previous handlers where ours are still installed (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            try:
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, previous)
            except (OSError, ValueError, RuntimeError):
                pass
        self._previous.clear()


class CrashFile:
    """faulthandler's output file beside the ring (only if the job did not enable faulthandler)."""

    def __init__(self, ring: Path) -> None:
        self.path = sidecar(ring, CRASH_SUFFIX)
        self._file: TextIO | None = None
        self.note = ""

    def enable(self) -> None:
        if faulthandler.is_enabled():
            self.note = "faulthandler was already enabled by the job; its output goes where the job sent it"
            return
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._file = os.fdopen(fd, "w")
        faulthandler.enable(file=self._file, all_threads=True)

    def disable(self, *, keep_if_empty: bool = False) -> None:
        if self._file is None:
            return
        try:
            faulthandler.disable()
            self._file.close()
            if not keep_if_empty and self.path.stat().st_size == 0:
                self.path.unlink()
        except OSError:
            pass
        self._file = None
