"""Running under torchrun: the verdict in torchrun's own report, and one account per job in its log.

Under torchrun (``torchrun --no-python ... blackbox run -- python train.py``)
every rank has its own ``blackbox run``, all writing into torchrun's log. Each
prints one line (its cause and bundle); the full account is printed once: by
the rank whose failure came first (its ``blackbox run`` saw its job end first),
or, when every rank exited cleanly, by rank 0. The ranks sharing a ``--dir`` (the
ranks of a node, every rank where it is a shared filesystem) learn which came
first from one file there, ``torchrun-<run id>-attempt<n>.ends``: each failed
rank appends one line (its end's time and its rank) when its job ends, before
its recovery; after it, the rank whose line is the earliest prints the account.
A rank's collateral death (a peer gone from a collective, torchrun tearing the
ranks down) comes after the failure that caused it.

The error file: ``TORCHELASTIC_ERROR_FILE``.

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
import re
import time
from pathlib import Path
from typing import Any

from .._errors import one_line

ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
RUN_ID_ENV = "TORCHELASTIC_RUN_ID"
RESTART_ENV = "TORCHELASTIC_RESTART_COUNT"
MAX_ENDS_BYTES = 1 << 20


def rank() -> str | None:
    """This rank's number when torchrun started this `blackbox run`, else None."""
    if RUN_ID_ENV not in os.environ:
        return None
    return os.environ.get("RANK", "?")


def ends_file(parent: Path) -> Path:
    """Where the failed ranks of this torchrun attempt note their ends (in the folder of the run folders)."""
    run_id = re.sub(r"[^A-Za-z0-9._-]", "_", os.environ.get(RUN_ID_ENV, ""))[:64] or "none"
    attempt = re.sub(r"[^0-9]", "", os.environ.get(RESTART_ENV, ""))[:9] or "0"
    return parent / f"torchrun-{run_id}-attempt{attempt}.ends"


def note_end(parent: Path, end_ns: int) -> None:
    """Append this rank's failed end (one O_APPEND write); never raises."""
    try:
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(ends_file(parent), flags, 0o600)
        try:
            os.write(fd, f"{end_ns} {rank()}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def first_to_fail(parent: Path, end_ns: int) -> bool:
    """Whether no other rank of this attempt noted a failed end before ``end_ns`` (ties: the lower rank)."""
    me = (end_ns, rank() or "")
    try:
        fd = os.open(ends_file(parent), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            data = os.read(fd, MAX_ENDS_BYTES)
        finally:
            os.close(fd)
    except OSError:
        return True
    for line in data.decode("utf-8", "replace").splitlines():
        when, _, who = line.partition(" ")
        if when.isdigit() and (int(when), who) < me:
            return False
    return True


def _epoch_seconds(iso: str | None) -> int:
    """Whole seconds since the epoch of a UTC ISO-8601 time (now, if there is none)."""
    try:
        return calendar.timegm(time.strptime((iso or "")[:19], "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return int(time.time())


def _death(meta: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """The death to report: the first death's full record (with its evidence), else the job's own; and the
    last step of the ring it is in (None: that process recorded no step)."""
    first = meta.get("first_death") or {}
    rings = meta.get("rings") or [meta]
    ring = next((m for m in rings if m.get("pid") == first.get("pid")), rings[0])
    death: dict[str, Any] = ring.get("death") or {}
    return death, ring.get("last_step")


def _at_step(step: Any, last_step: Any) -> str:
    """Where in training the death came: its step; else the ring's last step, said to be that; else that its
    process recorded no step (it died before its first, or takes none): never "at step None"."""
    if step is not None:
        return f" at step {step}"
    return " (no step recorded)" if last_step is None else f" (its last step recorded: {last_step})"


def verdict(meta: dict[str, Any], bundle: Path) -> dict[str, Any]:
    """The error-file document: one line (cause, step, headline, the deciding evidence), then the evidence."""
    death, last_step = _death(meta)
    evidence = [
        one_line(str(e)) for e in death.get("evidence", []) if not str(e).startswith(("a clean end", "no clean end"))
    ]
    # torchrun prints these to the terminal: the job's own text (an exception message) escaped, one line each
    at = _at_step(death.get("step"), last_step)
    line = one_line(f"blackbox: {death.get('cause')}{at}: {death.get('headline', '')}")
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
