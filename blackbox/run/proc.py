"""What ``/proc`` says about another process: its command line and the program it runs.

Used to name the processes ``blackbox run`` deals with but did not start: who
sent it a signal, what the job left running. Command lines are redacted (secrets
become ``***``, as in a ring's identity) and bounded.
"""

from __future__ import annotations

import contextlib
import os

from ..collect.identity import bounded_argv, redact_argv

MAX_CMDLINE = 4096  # bytes of a command line read
MAX_COMMAND = 1024  # characters of a command line kept
_VALUE_OPTIONS = ("-W", "-X", "-Q")  # a Python option whose value is the next argument


def argv_of(pid: int) -> list[str]:
    """The process's command line (empty for a kernel thread or a process that has ended)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            raw = f.read(MAX_CMDLINE)
    except OSError:
        return []
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def comm_of(pid: int) -> str:
    """The process's command name (``/proc/<pid>/comm``), "" when it has ended."""
    try:
        with open(f"/proc/{pid}/comm", "rb") as f:
            return f.read(64).decode("utf-8", "replace").strip()
    except OSError:
        return ""


def command_of(pid: int) -> str:
    """The command line, redacted and bounded; ``[comm]`` where it has none."""
    argv = argv_of(pid)
    if not argv:
        return f"[{comm_of(pid)}]" if comm_of(pid) else "?"
    return " ".join(bounded_argv(redact_argv(argv)))[:MAX_COMMAND]


def program_of(argv: list[str], comm: str) -> str:
    """The program a process runs, as a person names it: for a Python interpreter, the script or module
    it runs (``torchrun``, not ``python``, nor the name torchrun gives its thread, ``pt_elastic``); for
    anything else, its command name."""
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return comm
    args = iter(argv[1:])
    for arg in args:
        if arg == "-m":
            return next(args, comm)
        if arg == "-c" or arg == "-":
            return comm
        if arg in _VALUE_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            return os.path.basename(arg)[:64] or comm
    return comm


def status_masks(pid: int, keys: tuple[str, ...]) -> dict[str, int] | None:
    """The signal masks named (``SigPnd``, ``SigCgt``, ...) that the process's status holds, as numbers; None where
    it cannot be read (an ended process)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            text = f.read(8192).decode("ascii", "replace")
    except OSError:
        return None
    masks: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in keys:
            with contextlib.suppress(ValueError):
                masks[key] = int(value.strip(), 16)
    return masks


def takes(pid: int, signo: int) -> bool | None:
    """Whether the process has a handler for the signal or blocks it (``SigCgt``, ``SigBlk`` of its status: the
    kernel queues a blocked signal even for a namespace's first process); None where ``/proc`` is not this
    PID namespace's (``unshare -p`` without ``--mount-proc``: a pid there is another process) or unread."""
    masks = status_masks(pid, ("SigCgt", "SigBlk")) if own_proc() else None
    if masks is None or len(masks) < 2:
        return None
    return bool((masks["SigCgt"] | masks["SigBlk"]) >> (signo - 1) & 1)


def own_proc() -> bool:
    """``/proc`` is this PID namespace's (not so after ``unshare -p`` without ``--mount-proc``)."""
    try:
        return os.readlink("/proc/self") == str(os.getpid())
    except OSError:
        return False
