"""What a test leaves in the default ring folders (``/var/tmp/blackbox-<uid>``), removed after it.

A test that arms with the default folder (no path, no ``BLACKBOX_DIR``), runs a job as a user made with
``useradd``, or runs a Slurm job, may leave rings, run folders, per-job folders, or a whole
``blackbox-<uid>`` folder of a user it then removed. ``snapshot`` lists those folders before the test;
``clean`` removes what appeared since and is no longer in use: never a ring whose writer still holds its
lock (or whose pid lives), never a run whose ``blackbox run`` still lives. A ``blackbox-<uid>`` folder
whose user is gone (made by a test, then removed) goes whole.

It looks only in the session's own ``/var/tmp`` (``private_tmp.py``): in the machine's, a ring that
appeared during a test may be a real job's, one that died meanwhile. Where the session has no private
``/var/tmp`` (not root), it removes nothing: the session's rings went to its own ``BLACKBOX_DIR``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
from pathlib import Path

import private_tmp

from blackbox.ring.retention import Entry, delete, ring_entries, run_entries

ROOT = Path("/var/tmp")
PREFIX = "blackbox-"
_FAR = 1e12  # a "now" past every age rule: only the locks and pids say what is in use


def snapshot() -> dict[str, set[str]]:
    """The default ring folders and what each holds (none where /var/tmp is not the session's own)."""
    out: dict[str, set[str]] = {}
    if not private_tmp.private():
        return out
    try:
        folders = [p for p in ROOT.iterdir() if p.name.startswith(PREFIX) and p.is_dir() and not p.is_symlink()]
    except OSError:
        return out
    for folder in folders:
        try:
            out[folder.name] = set(os.listdir(folder))
        except OSError:
            continue
    return out


def _user_gone(folder: Path) -> bool:
    try:
        pwd.getpwuid(folder.lstat().st_uid)
    except KeyError:
        return True
    except OSError:
        return False
    return False


def _idle(entries: list[Entry]) -> bool:
    return not any(e.in_use for e in entries)


def clean(before: dict[str, set[str]]) -> list[Path]:
    """Remove what appeared in the default ring folders since ``before`` and is not in use; returns it."""
    removed: list[Path] = []
    for name, names in snapshot().items():
        folder = ROOT / name
        if _user_gone(folder):  # the folder of a user a test made and removed (this test or an earlier one)
            if _idle(ring_entries(folder, _FAR) + run_entries(folder, _FAR)):
                shutil.rmtree(folder, ignore_errors=True)
                removed.append(folder)
            continue
        new = names - before.get(name, set())
        if name not in before:  # made during the test: goes too once empty (its user's uid comes round again)
            removed += _cleaned(folder, new)
            with contextlib.suppress(OSError):
                folder.rmdir()
                removed.append(folder)
        elif new:  # else nothing read: a test that leaves nothing pays for two listings only
            removed += _cleaned(folder, new)
    return removed


def _cleaned(folder: Path, new: set[str]) -> list[Path]:
    """Remove the entries of ``folder`` named in ``new`` that are not in use; returns them."""
    removed: list[Path] = []
    for e in ring_entries(folder, _FAR) + run_entries(folder, _FAR):
        if e.path.name in new and not e.in_use:
            delete(folder, e)
            removed.append(e.path)
    for sub in sorted(new):  # a job's own folder (slurm-<job>): gone with its rings once none is in use
        path = folder / sub
        if path.is_dir() and not path.is_symlink() and not sub.startswith("run-"):
            if _idle(ring_entries(path, _FAR)):
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
    return removed
