"""A native crash, read from faulthandler's output: which signal, and the crashing thread's Python stack.

Pure functions over the text faulthandler wrote into the ring's crash region (``crash-<pid>.txt`` in the
bundle). Its first line names the fatal error ("Fatal Python error: Segmentation fault"); the block
headed "Current thread 0x... (most recent call first):" is the thread that crashed, one frame a line
(``  File "train.py", line 6 in die``). The stack is kept folded as the stack samples are (frames
``fn (path:line)``, outermost first, joined by ``;``), so the views show both alike.
"""

from __future__ import annotations

import os
import re
from typing import Any

from .allocs import site_of

# faulthandler's names of the fatal errors it handles -> the signal
FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Floating-point exception": "SIGFPE",
         "Floating point exception": "SIGFPE", "Bus error": "SIGBUS", "Illegal instruction": "SIGILL"}  # fmt: skip
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
MAX_FRAMES = 100  # faulthandler writes at most 100 frames a thread


SHUTDOWN = re.compile(r"^Stack of every thread at (SIG[A-Z0-9]+), while the process shut down\s*$")


def shutdown_signal(text: str | None) -> str | None:
    """The signal whose stacks the C handler wrote as the process shut down, after its clean end (its first
    line: ``Stack of every thread at SIGTERM, while the process shut down``), else None."""
    m = SHUTDOWN.match((text or "").split("\n", 1)[0])
    return m[1] if m else None


def crash_signal(text: str | None) -> str | None:
    """The signal faulthandler's first line names (``SIGSEGV``), None where it names none."""
    for line in (text or "").splitlines()[:5]:
        m = re.match(r"Fatal Python error: (.+?)\s*$", line)
        if m:
            return FATAL.get(m[1])
    return None


def crashing_stack(text: str | None) -> str | None:
    """The crashing thread's Python stack, folded (outermost first); None where no thread is marked current
    (a crash outside any Python thread) or its block holds no frame."""
    frames: list[str] | None = None
    for line in (text or "").splitlines():
        thread = _THREAD.match(line)
        if thread:
            if frames is not None:
                break  # the current thread's block has ended
            frames = [] if thread[1] == "Current thread" else None
            continue
        m = _FRAME.match(line) if frames is not None else None
        if m and frames is not None and len(frames) < MAX_FRAMES:
            frames.append(f"{m[3]} ({m[1]}:{m[2]})")
        elif frames and not line.strip():
            break
    return ";".join(reversed(frames)) if frames else None


def short_frame(frame: str) -> str:
    """``fn (/a/b/train.py:12)`` -> ``fn (train.py:12)``: the file's base name."""
    name, sep, where = frame.rpartition(" (")
    return f"{name} ({os.path.basename(where)}" if sep else frame


def innermost_first(stack: str) -> str:
    """A folded stack as one line, innermost frame first, short file names: ``die (train.py:6) ← main (...)``."""
    return " ← ".join(short_frame(f) for f in reversed(stack.split(";")))


def crash_reading(pid: Any, text: str | None) -> dict[str, Any] | None:
    """``native_crash`` of a ring's metadata: the bundle ``file`` that holds faulthandler's tracebacks, its
    ``first_line``, the ``signal`` it names, the crashing thread's ``stack`` (folded) and ``site`` (its
    innermost frame of the job's own code); None without a crash. The same for ``shutdown_stacks`` (the
    stacks at a signal that ended the shutdown: ``shutdown_signal``), ``stack`` the thread that took it."""
    if text is None:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    stack = crashing_stack(text)
    return {"file": f"crash-{pid}.txt", "first_line": lines[0] if lines else "",
            "signal": crash_signal(text) or shutdown_signal(text), "stack": stack,
            "site": site_of(stack) if stack else None}  # fmt: skip


def native_crash(text: str, status_signal: str | None, pid: Any) -> tuple[dict[str, Any], str]:
    """(the crash as the headline tells it: ``signal``, ``site``; the evidence line) of a fatal signal in
    native code, from faulthandler's output: the signal it names (else the exit status's), the crashing
    thread's Python stack, and the file that holds every thread's."""
    name = crash_signal(text) or status_signal
    stack = crashing_stack(text)
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    shown = innermost_first(stack) if stack else "none (no Python thread)"
    return {"signal": name, "site": site_of(stack) if stack else None}, (
        f'{name or "a fatal signal"} in native code: faulthandler\'s "{first}" (crash-{pid}.txt); the crashing '
        f"thread's Python stack, innermost frame first: {shown}")  # fmt: skip


def crash_headline(who: str, crash: dict[str, Any]) -> str:
    """``The main process (pid 7) died of SIGSEGV in native code, called from die (train.py:7).``"""
    site = f", called from {short_frame(crash['site'])}" if crash.get("site") else ""
    return f"{who} died of {crash['signal']} in native code{site}."


def shutdown_where(text: str | None, signal: str, frames: int = 4) -> str:
    """``in poll (popen_fork.py:27) ← wait (popen_fork.py:43) ← …``: where the thread that took ``signal`` was
    as it ended the shutdown (``shutdown_signal``'s text), innermost frames first; "" where that text is not
    this signal's or holds no frame."""
    stack = crashing_stack(text) if shutdown_signal(text) == signal else None
    if not stack:
        return ""
    parts = stack.split(";")
    shown = innermost_first(";".join(parts[-frames:]))
    return f"in {shown}{' ← …' if len(parts) > frames else ''}"
