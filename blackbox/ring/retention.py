"""Keeping a ring folder and a bundle folder inside the limits a user sets.

``plan`` is pure: given the entries (their age, size and whether they are in
use), it names the oldest to delete until both the count and the total size are
within bounds. An entry in use is never chosen, and it still counts towards the
limits. A ring is in use while its writer holds its lock (or, for a ring
without one, while its pid lives), while it is young (another rank may have
just made it), and while its header cannot be read and it is not old (an older
writer may still be writing it).

Every pass tolerates other passes and users working in the same folder at the
same time: an entry that vanishes between listing and deleting is skipped,
links are never followed, and the pass never gives up because one entry is odd.
A pass opens its folder once and lists, looks into and removes everything
relative to that descriptor (``tree``), each entry only while it is still the
file it listed (device and inode): a folder swapped for a link to another
user's meanwhile, above or inside it, changes nothing. As root, a folder of
another user is not pruned (``refuse_other_owner``; at arm it is left as it
is, for its owner's own arms).
Sidecars left without their ring, empty ones, and temporary files of a writer
that died while making its ring go too.

A folder may also hold ``blackbox run``'s run folders (``run-*/``, with
``rings/`` and ``bundle/``) and Slurm jobs' folders (``slurm-<job>/``, made by
arm in a Slurm job, see ``file.default_dir``): each is one entry, its size all
it holds, in use while its ``blackbox run`` holds the lock on its ``RUN_LOCK``
file (the kernel drops it when that process dies, however it dies), while any
of its rings (or its runs) is in use (a process the job left running), and
while it is young. Arming in a Slurm job's folder keeps the user's folder
around it within the limits too. A run's own ``rings/`` folder is never pruned
at arm: the run is kept or removed whole.

Every ``arm()`` keeps its folder within ``DEFAULT_KEEP`` unless told otherwise
(``keep=`` or ``BLACKBOX_KEEP``; ``off`` keeps everything).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from .._errors import BlackboxError
from .._units import human_bytes
from . import format as fmt
from .file import RING_SUFFIX, SIDECAR_SUFFIXES, SLURM_FOLDER_PREFIX
from .header import probe
from .inputs import Folder, folder_at, open_child, open_folder
from .liveness import ring_locked, writer_alive
from .tree import identity, remove, usage

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
YOUNG_S = 300.0  # a ring this recent is never removed: a rank may be arming it
STALE_S = 3600.0  # a header-less ring, or a temporary file, this old belongs to nobody
KEEP_ENV = "BLACKBOX_KEEP"
DEFAULT_KEEP = "count=64,size=2G"  # per ring folder: the newest 64 rings and run folders, 2 GiB in all
KEEP_OFF = "off"
RUN_PREFIX = "run-"
RUN_LOCK = "run.lock"  # in a run folder: locked by its `blackbox run` for as long as it lives
Listed = list[tuple[str, os.stat_result]]  # a folder's entries as listed: (name, lstat)


@dataclass(frozen=True)
class Entry:
    path: Path
    mtime: float
    size: int
    in_use: bool
    ident: tuple[int, int] | None = None  # (device, inode) as listed: removed only while it is still that file


def plan(entries: list[Entry], max_count: int | None, max_bytes: int | None) -> list[Entry]:
    """The entries to delete, oldest first, so that what is left fits both limits where it can."""
    kept = sorted(entries, key=lambda e: e.mtime)  # oldest first
    count, total = len(kept), sum(e.size for e in kept)
    doomed: list[Entry] = []
    for e in kept:
        over = (max_count is not None and count > max_count) or (max_bytes is not None and total > max_bytes)
        if not over:
            break
        if e.in_use:
            continue
        doomed.append(e)
        count, total = count - 1, total - e.size
    return doomed


def parse_size(text: str) -> int:
    """``"20G"`` -> bytes (K, M, G, T are powers of 1024; a plain number is bytes)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in _UNITS and not t[-1:].isdigit() else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise BlackboxError(f"expected a size such as 500M or 20G, found {text!r}") from None
    if not value >= 0:
        raise BlackboxError(f"expected a size of zero or more, such as 500M or 20G, found {text!r}")
    return int(value * _UNITS[unit])


def check_count(value: int | None) -> int | None:
    if value is not None and value < 0:
        raise BlackboxError(f"expected a count of zero or more, found {value}")
    return value


def ring_entries(where: Folder | Path, now: float | None = None) -> list[Entry]:
    """Every ``*.ring`` (with its sidecar files) in a folder, with whether it is in use."""
    with folder_at(where) as folder:
        return _rings_in(folder, folder.entries(), time.time() if now is None else now)


def _rings_in(folder: Folder, listed: Listed, now: float) -> list[Entry]:
    names = dict(listed)
    out = []
    for name, st in listed:
        if not name.endswith(RING_SUFFIX) or not stat.S_ISREG(st.st_mode):
            continue  # a link, a folder, a FIFO
        try:
            header, locked = probe(folder.path / name, folder)
            in_use = header.state != fmt.STATE_CLEAN and writer_alive(locked, header.meta)
        except BlackboxError:
            in_use = now - st.st_mtime < STALE_S  # header-less: perhaps still being made by an older writer
        in_use = in_use or now - st.st_mtime < YOUNG_S
        sides = [names.get(name + suffix) for suffix in SIDECAR_SUFFIXES]
        size = st.st_size + sum(s.st_size for s in sides if s is not None and stat.S_ISREG(s.st_mode))
        out.append(Entry(folder.path / name, st.st_mtime, size, in_use, identity(st)))
    return out


def run_entries(where: Folder | Path, now: float | None = None, depth: int = 0) -> list[Entry]:
    """Every job folder in a folder, each one entry: ``blackbox run``'s (``run-*`` holding ``rings/`` or
    ``RUN_LOCK``) and a Slurm job's (``slurm-*``, its rings inside, and its ``blackbox run`` folders)."""
    with folder_at(where) as folder:
        return _runs_in(folder, folder.entries(), time.time() if now is None else now, depth)


def _runs_in(folder: Folder, listed: Listed, now: float, depth: int) -> list[Entry]:
    out = []
    for name, st in listed:
        slurm = name.startswith(SLURM_FOLDER_PREFIX) and depth == 0
        if not stat.S_ISDIR(st.st_mode) or not (slurm or name.startswith(RUN_PREFIX)):
            continue
        try:
            d = open_child(folder, name)  # never through a link; what is looked at inside goes through it
        except (BlackboxError, OSError):
            continue  # gone since the listing, or not ours to read
        with d:
            if identity(os.fstat(d.fd)) != identity(st):
                continue  # another folder put in its place since the listing
            inner = d.entries()
            kinds = dict(inner)
            rings, lock = kinds.get("rings"), kinds.get(RUN_LOCK)
            rings_folder = rings is not None and stat.S_ISDIR(rings.st_mode)
            if not (slurm or rings_folder or lock):
                continue  # not a run folder (one being made holds its lock file before its rings folder)
            size, newest = usage(d.fd)
            newest = max(st.st_mtime, newest)
            in_use = ring_locked(RUN_LOCK, d.fd) is True or now - newest < YOUNG_S
            if not in_use and rings_folder:
                with contextlib.suppress(BlackboxError, OSError), open_child(d, "rings") as rings_in:
                    in_use = any(e.in_use for e in ring_entries(rings_in, now))
            if slurm and not in_use:
                in_use = any(e.in_use for e in _rings_in(d, inner, now) + _runs_in(d, inner, now, depth + 1))
        out.append(Entry(folder.path / name, newest, size, in_use, identity(st)))
    return out


def bundle_entries(where: Folder | Path, marker: str = "metadata.json") -> list[Entry]:
    """Every bundle (a sub-folder holding ``marker``) in a folder."""
    out = []
    with folder_at(where) as folder:
        for name, st in folder.entries():
            if not stat.S_ISDIR(st.st_mode):
                continue
            try:
                with open_child(folder, name) as d:
                    mark = os.stat(marker, dir_fd=d.fd, follow_symlinks=False)
                    if not stat.S_ISREG(mark.st_mode) or identity(os.fstat(d.fd)) != identity(st):
                        continue
                    size, _ = usage(d.fd)
            except (BlackboxError, OSError):
                continue
            out.append(Entry(folder.path / name, mark.st_mtime, size, False, identity(st)))
    return out


def delete(where: Folder | Path, entry: Entry) -> None:
    """Remove an entry of the folder ``where`` (a ring and its sidecars, or a run or bundle folder, whole),
    relative to the folder's descriptor and only while it is still the file listed (``Entry.ident``):
    what is already gone, or was replaced meanwhile, stays as it is."""
    name = entry.path.name
    with folder_at(where) as folder:
        try:
            st = os.stat(name, dir_fd=folder.fd, follow_symlinks=False)
        except OSError:
            return
        if not remove(folder.fd, name, same=entry.ident) or stat.S_ISDIR(st.st_mode):
            return
        for suffix in SIDECAR_SUFFIXES:
            with contextlib.suppress(OSError):
                if stat.S_ISREG(os.stat(name + suffix, dir_fd=folder.fd, follow_symlinks=False).st_mode):
                    os.unlink(name + suffix, dir_fd=folder.fd)


def sweep(where: Folder | Path, now: float | None = None) -> list[Path]:
    """Remove what belongs to no ring: sidecars whose ring is gone, empty sidecars of a ring that is
    not in use, and temporary files of a writer that died while making its ring. Returns them."""
    now = time.time() if now is None else now
    with folder_at(where) as folder:
        listed = folder.entries()
        names = dict(listed)
        gone: list[tuple[str, os.stat_result]] = []
        for name, st in listed:
            if not stat.S_ISREG(st.st_mode):
                continue
            suffix = next((s for s in SIDECAR_SUFFIXES if name.endswith(RING_SUFFIX + s)), None)
            if suffix is not None:
                ring = name[: -len(suffix)]
                ring_st = names.get(ring)
                if ring_st is None or not stat.S_ISREG(ring_st.st_mode):
                    gone.append((name, st))  # its ring is gone
                elif st.st_size == 0 and not _rings_in(folder, [(ring, ring_st)], now)[0].in_use:
                    gone.append((name, st))  # empty, beside a ring no longer in use
            elif name.startswith(".") and name.endswith(".tmp") and RING_SUFFIX in name and now - st.st_mtime > STALE_S:
                gone.append((name, st))
        return [folder.path / name for name, st in gone if remove(folder.fd, name, same=identity(st))]


def refuse_other_owner(folder: Folder) -> None:
    """As root, a folder of another user is not pruned (its owner could swap what is in it for links to
    other users' files while root works): raises a BlackboxError naming it. ``blackbox prune --as-owner``
    acts as its owner instead."""
    if os.geteuid() == 0 and folder.uid != 0:
        raise BlackboxError(
            f"{folder.path}: expected a folder of root's to prune as root, found one of uid {folder.uid} "
            "(blackbox prune --as-owner prunes it as its owner)"
        )


def parse_keep(text: str) -> tuple[int | None, int | None]:
    """``BLACKBOX_KEEP="count=20,size=20G"`` -> (20, 20 GiB); either part may be left out; ``off``: no limit."""
    count = size = None
    if text.strip().lower() == KEEP_OFF:
        return None, None
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key == "count" and value.strip().isdigit():
            count = int(value)
        elif key == "size":
            size = parse_size(value)
        else:
            raise BlackboxError(f"expected count=N and/or size=SIZE (e.g. count=20,size=20G) or off, found {part!r}")
    return count, size


def folder_entries(where: Folder | Path, now: float | None = None) -> list[Entry]:
    """The rings and the run folders of a ring folder (listed once)."""
    now = time.time() if now is None else now
    with folder_at(where) as folder:
        listed = folder.entries()
        return _rings_in(folder, listed, now) + _runs_in(folder, listed, now, 0)


def prune_ring_folder(path: Path, keep: str, new: int = 1) -> list[Entry]:
    """Make room in a ring folder by a keep setting (``new``: entries about to be made count already): the
    folder opened once, everything listed and removed relative to it. As root, a folder of another user's
    is left as it is (its owner's own arms keep it within their setting). Returns the entries removed."""
    count, size = parse_keep(keep)
    if count is None and size is None:
        return []
    with open_folder(path) as folder:
        if os.geteuid() == 0 and folder.uid != 0:
            return []
        doomed = plan(folder_entries(folder), None if count is None else max(0, count - new), size)
        for e in doomed:
            delete(folder, e)
        sweep(folder)
    return doomed


def keep_setting(keep: str | None) -> str:
    """The keep setting in force: ``keep`` as given to arm, else ``$BLACKBOX_KEEP``, else ``DEFAULT_KEEP``."""
    return keep if keep is not None else os.environ.get(KEEP_ENV) or DEFAULT_KEEP


def in_run_folder(folder: Path) -> bool:
    """``folder`` is a ``blackbox run``'s rings folder (its run is kept or removed whole, never pruned inside)."""
    run = folder.parent
    return (
        folder.name == "rings"
        and run.name.startswith(RUN_PREFIX)
        and any(
            os.path.lexists(run / marker)
            for marker in (RUN_LOCK, ".boot")  # .boot: where its sitecustomize is
        )
    )


def _counted(gone: list[Entry]) -> str:
    """``2 old rings and 1 old folder`` (a run folder, a Slurm job's folder)."""
    rings = sum(e.path.name.endswith(RING_SUFFIX) for e in gone)
    parts = [(rings, "ring"), (len(gone) - rings, "folder")]
    return " and ".join(f"{n} old {what}{'s' if n > 1 else ''}" for n, what in parts if n)


def keep_at_arm(folder: Path, keep: str | None, new: int = 1) -> str | None:
    """At arm: keep the ring folder within the keep setting in force (``new``: entries about to be made).
    Never raises. Returns a warning's text: what it removed (one line, never silently), or what went wrong
    (a bad setting never stops arming); None where it removed nothing."""
    removed: list[tuple[Path, list[Entry]]] = []
    try:
        if not in_run_folder(folder):
            removed.append((folder, prune_ring_folder(folder, keep_setting(keep), new)))
        if folder.name.startswith(SLURM_FOLDER_PREFIX):  # a Slurm job's own folder: the user's folder around it
            removed.append((folder.parent, prune_ring_folder(folder.parent, keep_setting(keep), 0)))
    except Exception as exc:
        return f"{'keep=' if keep is not None else KEEP_ENV} not applied: {exc}"
    said = [f"removed {_counted(gone)} ({human_bytes(sum(e.size for e in gone))}) from {where}"
            for where, gone in removed if gone]  # fmt: skip
    if not said:
        return None
    how = "keep=" if keep is not None else KEEP_ENV if os.environ.get(KEEP_ENV) else "the default keep"
    return (f"{'; '.join(said)}, to keep it within {keep_setting(keep)} ({how}; keep=\"off\" or {KEEP_ENV}=off "
            "keeps everything)")  # fmt: skip
