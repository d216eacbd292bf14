"""How a process ended by itself (pure): its exit status and how that is known, the signal a status
names, and what a failing ``sys.exit("...")`` said."""

from __future__ import annotations

from typing import Any

from ..ring import format as fmt
from .evidence import Evidence
from .facts import Facts

RUN_SAW = "run"  # the exit status came from `blackbox run`'s wait
HOW_KNOWN = {fmt.EXIT_PROCESS: "recorded by the process as it exited", fmt.EXIT_OS: "its os._exit call",
             fmt.EXIT_SYS: "its sys.exit call", RUN_SAW: "as `blackbox run` saw it"}  # fmt: skip
MAX_SAID = 200  # characters of a sys.exit message kept


def exit_status(f: Facts, ev: Evidence) -> tuple[int | None, str | None]:
    """(status, how it is known: an exit record's detail or RUN_SAW): the status the process recorded as it
    exited or called ``os._exit`` with, else what `blackbox run` saw, else a ``sys.exit`` call's."""
    last = f.exits[-1] if len(f.exits) else None
    if last is not None and last["detail"] in (fmt.EXIT_PROCESS, fmt.EXIT_OS):
        return last["value"], last["detail"]
    if ev.exit_status is not None:
        return ev.exit_status, RUN_SAW
    if last is not None:
        return last["value"], fmt.EXIT_SYS  # a sys.exit call (older writers left no detail)
    return None, None


def exit_message(f: Facts, status: int | None) -> str | None:
    """What the job said as it exited with ``status``: ``sys.exit("fatal: no such config")`` prints its
    message to stderr and exits 1; its exit record keeps the message (its label). None where none."""
    exits = f.exits
    for i in range(len(exits) - 1, max(len(exits) - 4, -1), -1):  # (the process's own exit record follows)
        row: dict[str, Any] = exits[i]
        if row["detail"] in (fmt.EXIT_SYS, None) and row["value"] == status:
            text = row["label"]
            return text if isinstance(text, str) and text.strip() else None
    return None


def signal_of(status: int | None) -> int | None:
    """The signal an exit status names (negative: Python's ``-N``; ``128 + N``: a shell's), None where none."""
    if status is None:
        return None
    if status < 0:
        return -status
    if 128 < status < 128 + 65:
        return status - 128
    return None


HANDLED = "handled by the job's handler"  # a signal record's detail (collect/signals.py; hang.HANDLED)


def interrupted_by(f: Facts) -> tuple[dict[str, Any] | None, str]:
    """(the signal row, the evidence) of an uncaught KeyboardInterrupt: the last signal, where it is the one
    that raised it (SIGINT, or a SIGTERM the job gave Python's SIGINT handler), and from whom it was (``kill
    -INT``: its sender; a terminal's Ctrl-C: the kernel, no sender); else only that it came."""
    s = f.signals[-1] if len(f.signals) else None
    if s is None or s["detail"] not in ("raised KeyboardInterrupt", HANDLED):  # (SIGINT's, or another the job
        return None, "an uncaught KeyboardInterrupt (Ctrl-C or SIGINT)"  # gave Python's handler, or its own that
    # raised it: SIGTERM under torchrun)
    raised = f"an uncaught KeyboardInterrupt, raised by {s['label']} from"
    if s["sender"]:
        return s, f"{raised} {s['sender']} (pid {s['sender_pid']}) at {s['time']}"
    if (s["signal_code"] or 0) > 0 and s["label"] == "SIGINT":  # SI_KERNEL: the terminal's line discipline sent it
        return None, f"{raised} the kernel (a terminal's Ctrl-C) at {s['time']}"
    if s["label"] != "SIGINT":
        return None, f"an uncaught KeyboardInterrupt, raised by {s['label']} at {s['time']}"
    return None, "an uncaught KeyboardInterrupt (Ctrl-C or SIGINT)"
