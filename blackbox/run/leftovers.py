"""Processes of the job still running when ``blackbox run`` is done waiting for it.

When the job's process ends, ``blackbox run`` waits for the rest of its process
group (``GRACE_S``), then recovers and exits with the job's status. Whatever
the job started and left running by then (a DataLoader worker whose main
process was killed, a daemon it started in a session of its own) goes on
without it: those processes are named (pid and command line, secrets redacted
as in a ring's identity), on stderr and in the bundle's ``left_running``, never
signalled. Found by walking ``/proc`` down from ``blackbox run``'s own pid: as
the job's subreaper, every process the job left is ours or a descendant of ours.
"""

from __future__ import annotations

import os
from typing import Any

from .proc import command_of

MAX_LISTED = 64  # processes named in the metadata; the count says how many there were


def stat_of(pid: int | str) -> tuple[int, int, str] | None:
    """(parent, process group, state) of a process, from ``/proc/<pid>/stat``; None when it has ended."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    fields = text.rsplit(")", 1)[-1].split()  # the command name may hold spaces and brackets
    try:
        return int(fields[1]), int(fields[2]), fields[0]
    except (IndexError, ValueError):
        return None


def descendants(ancestor: int, pgrp: int | None = None) -> list[int]:
    """The live (not zombie) processes below ``ancestor``, in pid order; those of process group ``pgrp``
    alone where it is given."""
    children: dict[int, list[int]] = {}
    left: set[int] = set()  # zombies, and processes of another group
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        found = stat_of(name)
        if found is None:
            continue
        ppid, group, state = found
        children.setdefault(ppid, []).append(int(name))
        if state in ("Z", "X") or (pgrp is not None and group != pgrp):
            left.add(int(name))
    out, todo = [], [ancestor]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.append(child)
                todo.append(child)
    return sorted(p for p in out if p not in left)


def still_running(ancestor: int) -> tuple[int, list[dict[str, Any]]]:
    """(how many processes the job left running below ``ancestor``, ``{"pid", "command"}`` of the first
    MAX_LISTED of them)."""
    pids = descendants(ancestor)
    return len(pids), [{"pid": pid, "command": command_of(pid)} for pid in pids[:MAX_LISTED]]
