"""Python processes of a ``blackbox run`` job that cannot arm, and why: their ``PYTHONPATH`` lost our entry.

``blackbox run`` arms a job's Python processes through ``PYTHONPATH`` (the boot
folder holding our ``sitecustomize``). A command that sets the variable anew
(``env PYTHONPATH=src python train.py``, ``export PYTHONPATH=/code`` in a launch
script, ``subprocess.run(..., env={"PYTHONPATH": ...})``) drops that entry, and
its Python processes run unrecorded: the job then "left no ring" with no word of
why. Two ways to tell, both read-only:

- ``sets_pythonpath``: the command line, or the script it runs, assigns
  ``PYTHONPATH`` without ``$PYTHONPATH`` in the value (said before the job runs:
  a job that fails at once is gone before any scan);
- ``UnarmedWatch``: while the job runs, each new process below ``blackbox run``
  whose environment still holds our run's marker (``BLACKBOX_RUN_BOOT``) but whose
  ``PYTHONPATH`` no longer holds the boot folder, and that runs a Python, is named
  once (its pid, command line and ``PYTHONPATH``).

Where blackbox is installed in the job's Python (not editable), ``blackbox-run.pth`` arms such a process
all the same (``bootstrap.py``): it is then not named (``armed_elsewhere``: its ring, or its folded line,
names its pid), and the command's assignment is not said where the job left rings.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from ..ring.file import rings_of_pid
from ..ring.folded import read_folded
from .bootstrap import BOOT_ENV
from .proc import argv_of, command_of

MAX_ENVIRON = 256 << 10  # bytes of a process's environment read
MAX_SCRIPT = 1 << 20  # bytes of a launch script read
MAX_SEEN = 1 << 16  # processes remembered as checked
_ASSIGNED = re.compile(r"(?<![\w$])PYTHONPATH=([^\s;&|]*)")


def sets_pythonpath(command: list[str]) -> str | None:
    """The first ``PYTHONPATH=VALUE`` the command (or a script file it names) assigns without keeping the
    value it had (``$PYTHONPATH``), else None."""
    for arg in command[:64]:
        found = _replaced(arg) or _replaced(_script(arg))
        if found is not None:
            return found
    return None


def _replaced(text: str) -> str | None:
    for m in _ASSIGNED.finditer(text):
        if "PYTHONPATH" not in m[1]:  # PYTHONPATH=src:$PYTHONPATH keeps ours
            return m[0][:200]
    return None


def _script(path: str) -> str:
    """The text of a shell script the command names (``#!`` naming no Python, or ``.sh``), else ""."""
    if os.sep not in path and not path.endswith(".sh"):
        return ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        text = os.read(fd, MAX_SCRIPT).decode("utf-8", "replace") if stat.S_ISREG(os.fstat(fd).st_mode) else ""
    except OSError:
        return ""
    finally:
        os.close(fd)
    first = text.partition("\n")[0]
    shell = first.startswith("#!") and "python" not in first
    return text if shell or (path.endswith(".sh") and not first.startswith("#!")) else ""


class UnarmedWatch:
    """The first Python process of the job seen running without our ``PYTHONPATH`` entry (``scan``)."""

    def __init__(self, boot: Path) -> None:
        self._boot = str(boot)
        self._seen: set[tuple[int, str]] = set()
        self.found: dict[str, object] | None = None

    def scan(self, root: int) -> None:
        """Check the processes below ``root`` not checked yet (a process that exec'd is checked again)."""
        if self.found is not None or len(self._seen) > MAX_SEEN:
            return
        for pid in _below(root):
            argv = argv_of(pid)
            key = (pid, argv[0] if argv else "")
            if key in self._seen or not argv:
                continue
            self._seen.add(key)
            path = self._lost(pid)
            if path is not None and os.path.basename(argv[0]).startswith("python"):
                self.found = {"pid": pid, "command": command_of(pid), "pythonpath": path[:200]}
                return

    def armed_elsewhere(self, rings: Path) -> dict[str, object] | None:
        """``found``, unless that process armed all the same (``blackbox-run.pth``: its ring, or, a helper that
        ended cleanly, its line in ``folded.jsonl``, names its pid)."""
        pid = (self.found or {}).get("pid")
        if not isinstance(pid, int) or rings_of_pid(rings, pid):
            return None
        return None if any(entry.get("pid") == pid for entry in read_folded(rings, (os.getuid(),))) else self.found

    def _lost(self, pid: int) -> str | None:
        """The process's PYTHONPATH, where it is of this run (our marker in its environment) without our entry."""
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                raw = f.read(MAX_ENVIRON)
        except OSError:
            return None
        env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
        if env.get(BOOT_ENV.encode()) != self._boot.encode():
            return None
        path = env.get(b"PYTHONPATH", b"").decode("utf-8", "replace")
        return None if self._boot in path.split(os.pathsep) else path


def _below(root: int) -> list[int]:
    """The processes below ``root``, through each one's main thread's children (bounded)."""
    out: list[int] = []
    todo = [root]
    while todo and len(out) < 4096:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children", "rb") as f:
                kids = [int(k) for k in f.read(65536).split()]
        except (OSError, ValueError):
            continue
        out += kids
        todo += kids
    return out


def advice(found: dict[str, object] | None, assigned: str | None) -> str | None:
    """What to say: the process seen, else the assignment read, with how to keep the job recorded."""
    keep = ("keep blackbox run's entry (PYTHONPATH=src:$PYTHONPATH), install blackbox in the job's Python (pip "
            "install, not editable: its blackbox-run.pth arms such a process) or call blackbox.arm() in the job")
    if found is not None:
        return (f"pid {found['pid']} (`{found['command']}`) ran with PYTHONPATH={found['pythonpath'] or '(empty)'}, "
                f"set by the job without blackbox run's entry: it was not recorded; {keep}")  # fmt: skip
    if assigned is not None:
        return (f"the job's command sets {assigned}, which drops blackbox run's entry: its Python processes are "
                f"not recorded; {keep}")  # fmt: skip
    return None
