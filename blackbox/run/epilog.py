"""A Slurm epilogue's recovery: exactly one job's rings on this node, into a bundle its user can read.

Slurm runs the epilogue as root after every job (once per attempt of a requeued
job) with the job's id, user and restart count in its environment. A job's rings
are in a folder of their own by default (``ring.file.default_dir``):
``/var/tmp/blackbox-<uid>/slurm-<job id>``, ``...-restart<N>`` for a requeued
job's later attempts, with ``blackbox run``'s rings in ``run-*/rings/`` inside it.
Only folders owned by the job's user, reached without links, are read, each opened
once relative to the folder above it (``O_DIRECTORY|O_NOFOLLOW``, its owner checked
on the descriptor) and handed to recovery open: a folder swapped for a link once
root has looked at it changes nothing. Only rings of the job's user are read, as
recovery reads any user's files (``recovery``: bounded, no link followed, no pickle).

The attempt that just ended is the newest attempt folder present, no newer than
``SLURM_JOB_RESTART_COUNT`` (already 1 in the epilogue of a first attempt that
was requeued). Its bundle goes to ``DEST/<job id>/<host>`` (``<host>-restart<N>``
for attempt N), so every attempt's bundle is kept; a bundle already there for
that attempt is left as it is. A local bundle is then given to the job's user
(files first, then the folders, never through a link).
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._errors import BlackboxError, RingNotFoundError, one_line
from ..ring.file import RING_SUFFIX, SLURM_FOLDER_PREFIX, user_dir
from ..ring.inputs import Folder, open_child, open_folder

_ATTEMPT = re.compile(r"^-restart([0-9]{1,5})$")
MAX_RUN_FOLDERS = 256  # blackbox run folders of one job read at most


@dataclass
class JobRings:
    """What the epilogue found of one job on this node: its folders, held open (``close()`` them)."""

    job: str
    uid: int
    attempt: int = 0
    folders: list[Folder] = field(default_factory=list)  # the attempt's folder and its runs' rings/ folders
    notes: list[str] = field(default_factory=list)  # why a folder was not read

    @property
    def ring_count(self) -> int:
        return sum(1 for d in self.folders for n in _names(d) if n.endswith(RING_SUFFIX))

    def close(self) -> None:
        for folder in self.folders:
            folder.close()


def environment(env: dict[str, str]) -> tuple[str, int, int, int | None, str | None]:
    """(job id, uid, gid, restart count, node name) from Slurm's epilogue environment."""
    job, uid = env.get("SLURM_JOB_ID", ""), env.get("SLURM_JOB_UID", "")
    if not (job.isdigit() and len(job) <= 20 and uid.isdigit() and len(uid) <= 10):
        found = ", ".join(f"{k}={env.get(k)!r}" for k in ("SLURM_JOB_ID", "SLURM_JOB_UID"))
        raise BlackboxError(f"expected Slurm's epilogue environment (SLURM_JOB_ID and SLURM_JOB_UID), found {found}")
    gid_text, restarts = env.get("SLURM_JOB_GID", ""), env.get("SLURM_JOB_RESTART_COUNT", "")
    gid = int(gid_text) if gid_text.isdigit() and len(gid_text) <= 10 else _primary_gid(int(uid))
    node = env.get("SLURMD_NODENAME", "")
    return (job, int(uid), gid, int(restarts) if restarts.isdigit() and len(restarts) <= 5 else None,
            node if re.fullmatch(r"[A-Za-z0-9._-]{1,64}", node) else None)  # fmt: skip


def _primary_gid(uid: int) -> int:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_gid
    except KeyError:
        return uid


def _names(folder: Folder) -> list[str]:
    try:
        return os.listdir(folder.fd)
    except OSError:
        return []


def _child(parent: Folder, name: str, uid: int, notes: list[str], quiet_if_missing: bool = False) -> Folder | None:
    """The folder ``name`` in ``parent``, opened once (``inputs.open_child``: never through a link, the job
    user's own), or None with the reason in ``notes``."""
    try:
        return open_child(parent, name, uid)
    except RingNotFoundError as exc:
        if not quiet_if_missing:
            notes.append(one_line(str(exc)))
    except BlackboxError as exc:
        notes.append(one_line(str(exc)))
    return None


def find(job: str, uid: int, restarts: int | None, root: Path | None = None) -> JobRings:
    """The folders holding the rings of the job's attempt that just ended (see the module docstring), each
    opened once, relative to the folder above it, never through a link, and the job user's own; every
    ring the recovery then reads is read through these descriptors."""
    found = JobRings(job, uid)
    root = user_dir(uid) if root is None else root
    try:
        top = open_folder(root.parent)  # /var/tmp: root's
    except BlackboxError as exc:
        found.notes.append(one_line(str(exc)))
        return found
    with top:
        home = _child(top, root.name, uid, found.notes)
    if home is None:
        return found
    with home:
        attempts: dict[int, str] = {}
        prefix = f"{SLURM_FOLDER_PREFIX}{job}"
        for name in _names(home):
            if not name.startswith(prefix):
                continue
            rest = name[len(prefix) :]
            m = _ATTEMPT.match(rest)
            if rest == "" or m:
                attempts[int(m.group(1)) if m else 0] = name
        usable = [n for n in attempts if restarts is None or n <= restarts]
        if not usable:
            found.notes.append(f"no folder of job {job} in {root}/")
            return found
        found.attempt = max(usable)
        folder = _child(home, attempts[found.attempt], uid, found.notes)
    if folder is None:
        return found
    found.folders.append(folder)
    runs = sorted(n for n in _names(folder) if n.startswith("run-"))[:MAX_RUN_FOLDERS]
    for name in runs:
        run = _child(folder, name, uid, found.notes)
        if run is not None:
            with run:
                rings = _child(run, "rings", uid, found.notes, quiet_if_missing=True)
            if rings is not None:
                found.folders.append(rings)
    return found


def destination(out: str, job: str, host: str, attempt: int) -> tuple[str, str]:
    """(the job's folder under ``out``, the bundle's place in it) for a local folder or a URI prefix."""
    base = out.rstrip("/") if out.rstrip("/") else out
    job_place = f"{base}/{job}"
    return job_place, f"{job_place}/{host}" + (f"-restart{attempt}" if attempt else "")


def give(path: Path | str, uid: int, gid: int) -> int:
    """Give a bundle folder root wrote (and what is in it) to the job's user: every entry is changed
    through a descriptor of its folder without following links, a folder after what is in it (until
    then the user cannot change what is inside), and only what is root's with a single name (never a
    hard link another user made). Returns how many entries were changed."""
    fd = os.open(path, _FOLDER)
    try:
        return _give(fd, uid, gid, 0)
    finally:
        os.close(fd)


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _give(fd: int, uid: int, gid: int, depth: int) -> int:
    if os.fstat(fd).st_uid != 0 or depth > 8:
        return 0
    changed = 0
    for name in os.listdir(fd):
        st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            inner = os.open(name, _FOLDER, dir_fd=fd)
            try:
                changed += _give(inner, uid, gid, depth + 1)
            finally:
                os.close(inner)
        elif stat.S_ISREG(st.st_mode) and st.st_uid == 0 and st.st_nlink == 1:
            os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
            changed += 1
    os.fchown(fd, uid, gid)
    return changed + 1


def make_job_folder(place: str) -> bool:
    """Make the job's local folder (mode 0700, root's until the bundle is given away); True if made."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(place, 0o700)
        return True
    return False


def summary_line(meta: dict[str, Any]) -> str:
    death = meta.get("first_death") or meta.get("death") or {}
    return f"cause {meta.get('cause')}; {death.get('headline', '')}".strip()
