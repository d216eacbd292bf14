"""Where ``blackbox run`` puts a run: a fresh folder nobody but the job's user (and root) can change.

The job imports our ``sitecustomize`` from the run folder and writes its rings
there, by path, in every Python process it starts. Whoever can rename a folder
on that path can swap the run folder for their own and have the job's next
Python process run their code as the job's user. So the parent folder (``--dir``,
else the default ring folder) is taken by its real, absolute path (no link, no
relative part a ``chdir`` would change), and every folder from ``/`` down to it
must be owned by root or the job's user and writable by nobody else, unless it
is sticky (``/tmp``, ``/var/tmp``: then others cannot rename what is ours in
it). A folder writable by the user's own private group (the user alone in it)
counts as the user's. Anything else is refused before the job starts, in one
line naming the folder and who else can write it.
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
import tempfile
import time
from pathlib import Path

from .._errors import BlackboxError
from ..ring.file import default_dir, safe_folder


class UnsafeRunFolderError(BlackboxError):
    """The run folder's parent can be changed by another user."""


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _private_group(gid: int, uid: int) -> bool:
    """The user's own private group: the user's primary group, with no other member as far as the user
    database tells (where ``umask 002`` is the default, a user's folders are writable by it)."""
    try:
        user = pwd.getpwuid(uid)
        others = [m for m in grp.getgrgid(gid).gr_mem if m != user.pw_name]
        primary = [p.pw_name for p in pwd.getpwall() if p.pw_gid == gid and p.pw_uid != uid]
    except KeyError:
        return False
    return user.pw_gid == gid and not others and not primary


def _who_else_writes(st: os.stat_result, uid: int) -> str | None:
    """Who besides ``uid`` and root can rename or replace what is in this folder, in words; None if nobody."""
    if st.st_uid not in (0, uid):
        return f"is owned by {_user(st.st_uid)}"
    if st.st_mode & stat.S_ISVTX:
        return None  # sticky: others may add entries, never rename or remove ours
    mode = f"mode {stat.S_IMODE(st.st_mode):o}"
    if st.st_mode & stat.S_IWOTH:
        return f"every user can write ({mode})"
    if st.st_mode & stat.S_IWGRP and not _private_group(st.st_gid, uid):
        try:
            name = grp.getgrgid(st.st_gid).gr_name
        except KeyError:
            name = str(st.st_gid)
        return f"group {name} can write ({mode})"
    return None


def check_private(folder: Path) -> None:
    """Raise UnsafeRunFolderError unless no user but this one and root can change ``folder`` or any folder
    above it (``folder``: absolute, without links)."""
    uid = os.geteuid()
    for depth in range(1, len(folder.parts) + 1):
        path = Path(*folder.parts[:depth])
        st = os.lstat(path)
        if not stat.S_ISDIR(st.st_mode):
            raise UnsafeRunFolderError(f"{path}: expected a folder on the run folder's path, found something else")
        why = _who_else_writes(st, uid)
        if why is not None:
            raise UnsafeRunFolderError(
                f"{folder}: expected a folder that only {_user(uid)} and root can change, all the way from /, "
                f"found {path}, which {why}: another user could swap the run folder, and the job's Python "
                f"processes would run what they put there; use a folder of your own (or a sticky one, chmod +t)"
            )


def run_parent(requested: str | None) -> Path:
    """The folder the run folder goes in: ``--dir`` (made if missing) or the default ring folder, by its
    real absolute path, checked with :func:`check_private`."""
    if requested:
        parent = Path(os.path.abspath(requested))
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        parent = Path(os.path.abspath(default_dir()))
        safe_folder(parent)
    real = Path(os.path.realpath(parent))
    check_private(real)
    return real


def work_folder(requested: str | None) -> Path:
    """A fresh run folder (mode 0700), ``run-<UTC time>-XXXX``, inside ``--dir`` or the default ring folder.
    Each run gets its own: rings of an earlier run in the same ``--dir`` never join this run's bundle."""
    parent = run_parent(requested)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return Path(tempfile.mkdtemp(prefix=f"run-{stamp}-", dir=parent))
