"""BlackboxWarning, issued where the user will look: the first frame outside blackbox on the caller's
stack, else (a thread of blackbox's own, such as the sampler's) the line that called ``blackbox.arm()``;
never ``_recorder.py``. A warning is never an exception, even under ``-W error``."""

from __future__ import annotations

import os
import sys
import threading
import warnings
from types import FrameType
from typing import Any

from ._errors import BlackboxWarning

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep  # blackbox's own folder
_ARM_SITE: list[Any] = []  # [filename, line, module globals] of the caller's arm(): where later warnings point


def _callers_frame() -> tuple[FrameType | None, int]:
    """(the innermost frame outside blackbox on this thread's stack, its ``stacklevel`` for warn's caller)."""
    frame: FrameType | None = sys._getframe(2)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return frame, level


def note_arm_site() -> None:
    """Remember the line that called ``blackbox.arm()``: a warning with no caller of its own (from the
    sampler's thread) points there."""
    frame, _ = _callers_frame()
    if frame is not None:
        _ARM_SITE[:] = [frame.f_code.co_filename, frame.f_lineno, frame.f_globals]


def warn(message: str) -> None:
    """One warning, never an exception (even under ``-W error``), pointing at the caller's own line: the
    first frame outside blackbox, else (a thread of blackbox's own) the line that armed it."""
    try:
        frame, level = _callers_frame()
        if (frame is None or frame.f_code.co_filename == threading.__file__) and _ARM_SITE:
            filename, line, module = _ARM_SITE
            registry = module.setdefault("__warningregistry__", {})
            warnings.warn_explicit(message, BlackboxWarning, filename, line, module.get("__name__"), registry, module)
        else:
            warnings.warn(message, BlackboxWarning, stacklevel=level)
    except Exception:
        try:
            sys.stderr.write(f"BlackboxWarning: {message}\n")
        except Exception:
            pass
