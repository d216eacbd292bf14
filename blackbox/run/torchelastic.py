"""The verdict in torchrun's own report: ``TORCHELASTIC_ERROR_FILE``.

Run as a torchrun worker (``torchrun --no-python ... blackbox run -- python
train.py``), each rank's ``blackbox run`` sees torchrun's error-file path in its
environment. When the rank fails and the job wrote no error file itself (its
``@record`` writes one only for an exception it sees; a SIGKILL or an OOM kill
leaves none), blackbox writes its verdict there, in the format torchrun reads:
torchrun then prints the real cause in "Root Cause (first observed failure)",
and orders the failures by the death's time on blackbox's clock (torchrun's
timestamps are whole seconds) rather than by when it noticed them.
"""

from __future__ import annotations

import calendar
import json
import os
import time
from pathlib import Path
from typing import Any

from .._errors import one_line

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def _epoch_seconds(iso: str | None) -> int:
    """Whole seconds since the epoch of a UTC ISO-8601 time (now, if there is none)."""
    try:
        return calendar.timegm(time.strptime((iso or "")[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return int(time.time())


def _death(meta: dict[str, Any]) -> dict[str, Any]:
    """The death to report: the first death's full record (with its evidence), else the job's own."""
    first = meta.get("first_death") or {}
    rings = meta.get("rings") or [meta]
    ring = next((m for m in rings if m.get("pid") == first.get("pid")), rings[0])
    death: dict[str, Any] = ring.get("death") or {}
    return death


def verdict(meta: dict[str, Any], bundle: Path) -> dict[str, Any]:
    """The error-file document: one line (cause, step, headline, the deciding evidence), then the evidence."""
    death = _death(meta)
    evidence = [
        one_line(str(e)) for e in death.get("evidence", []) if not str(e).startswith(("a clean end", "no clean end"))
    ]
    # torchrun prints these to the terminal: the job's own text (an exception message) escaped, one line each
    line = one_line(f"blackbox: {death.get('cause')} at step {death.get('step')}: {death.get('headline', '')}")
    if evidence:
        line += f" {evidence[-1]}"
    return {
        "message": {
            "message": line,
            "extraInfo": {
                "py_callstack": "\n".join([line, *evidence, f"bundle: {bundle}"]),
                "timestamp": str(_epoch_seconds(death.get("time"))),
            },
        }
    }


def write_error_file(meta: dict[str, Any], status: int, bundle: Path) -> bool:
    """Write the verdict where torchrun looks, if it asked for one, the rank failed, and nothing is there yet."""
    path = os.environ.get(ERROR_FILE_ENV)
    if not path or status == 0:
        return False
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError:
        return False  # the job's own @record wrote it (its exception is the better account), or no access
    with os.fdopen(fd, "w") as f:
        json.dump(verdict(meta, bundle), f)
    return True
