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
from . import format as fmt
from .file import RING_SUFFIX, SIDECAR_SUFFIXES, SLURM_FOLDER_PREFIX, sidecar
from .header import read_header
from .liveness import ring_locked, writer_alive

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
YOUNG_S = 300.0  # a ring this recent is never removed: a rank may be arming it
STALE_S = 3600.0  # a header-less ring, or a temporary file, this old belongs to nobody
KEEP_ENV = "BLACKBOX_KEEP"
DEFAULT_KEEP = "count=64,size=2G"  # per ring folder: the newest 64 rings and run folders, 2 GiB in all
KEEP_OFF = "off"
RUN_PREFIX = "run-"
RUN_LOCK = "run.lock"  # in a run folder: locked by its `blackbox run` for as long as it lives


@dataclass(frozen=True)
class Entry:
    path: Path
    mtime: float
    size: int
    in_use: bool


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


def _regular(path: Path) -> os.stat_result | None:
    """lstat of a regular file (never through a link); None if it is something else or has vanished."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st if stat.S_ISREG(st.st_mode) else None


def ring_entries(folder: Path, now: float | None = None) -> list[Entry]:
    """Every ``*.ring`` (with its sidecar files) in a folder, with whether it is in use."""
    now = time.time() if now is None else now
    out = []
    for ring in sorted(folder.glob(f"*{RING_SUFFIX}")):
        st = _regular(ring)
        if st is None:
            continue  # a link, a folder, a FIFO, or gone since the listing
        try:
            header = read_header(ring)
            in_use = header.state != fmt.STATE_CLEAN and writer_alive(ring, header.meta)
        except BlackboxError:
            in_use = now - st.st_mtime < STALE_S  # header-less: perhaps still being made by an older writer
        in_use = in_use or now - st.st_mtime < YOUNG_S
        size = st.st_size + sum(s.st_size for f in _sidecars(ring) if (s := _regular(f)) is not None)
        out.append(Entry(ring, st.st_mtime, size, in_use))
    return out


def _sidecars(ring: Path) -> list[Path]:
    return [sidecar(ring, s) for s in SIDECAR_SUFFIXES]


def run_entries(folder: Path, now: float | None = None, depth: int = 0) -> list[Entry]:
    """Every job folder in a folder, each one entry: ``blackbox run``'s (``run-*`` holding ``rings/`` or
    ``RUN_LOCK``) and a Slurm job's (``slurm-*``, its rings inside, and its ``blackbox run`` folders)."""
    now = time.time() if now is None else now
    out = []
    for d in sorted([*folder.glob(f"{RUN_PREFIX}*"), *folder.glob(f"{SLURM_FOLDER_PREFIX}*")]):
        try:
            st = os.lstat(d)
            rings, lock = _lstat(d / "rings"), _lstat(d / RUN_LOCK)
            slurm = d.name.startswith(SLURM_FOLDER_PREFIX) and depth == 0
            if not stat.S_ISDIR(st.st_mode) or not (slurm or rings and stat.S_ISDIR(rings.st_mode) or lock):
                continue  # not a run folder (one being made holds its lock file before its rings folder)
            newest, size = st.st_mtime, 0
            for top, dirs, files in os.walk(d):  # never follows a link
                for name in dirs + files:
                    if (s := _lstat(Path(top, name))) is not None:
                        newest = max(newest, s.st_mtime)
                        size += s.st_size if stat.S_ISREG(s.st_mode) else 0
            in_use = ring_locked(d / RUN_LOCK) is True or now - newest < YOUNG_S
            in_use = in_use or bool(rings and any(e.in_use for e in ring_entries(d / "rings", now)))
            if slurm and not in_use:
                in_use = any(e.in_use for e in ring_entries(d, now) + run_entries(d, now, depth + 1))
            out.append(Entry(d, newest, size, in_use))
        except OSError:
            continue  # gone since the listing, or not ours to read
    return out


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def bundle_entries(folder: Path, marker: str = "metadata.json") -> list[Entry]:
    """Every bundle (a sub-folder holding ``marker``) in a folder."""
    out = []
    for d in sorted(folder.iterdir()):
        try:
            if not stat.S_ISDIR(os.lstat(d).st_mode) or not (d / marker).is_file():
                continue
            size = sum(s.st_size for f in d.rglob("*") if (s := _regular(f)) is not None)
            out.append(Entry(d, (d / marker).stat().st_mtime, size, False))
        except OSError:
            continue
    return out


def delete(entry: Entry) -> None:
    """Remove an entry (a ring and its sidecars, or a bundle folder); what is already gone is fine."""
    if entry.path.is_dir() and not entry.path.is_symlink():
        import shutil  # here, not at arm: it imports bz2 and lzma

        shutil.rmtree(entry.path, ignore_errors=True)
        return
    for f in (entry.path, *_sidecars(entry.path)):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()


def sweep(folder: Path, now: float | None = None) -> list[Path]:
    """Remove what belongs to no ring: sidecars whose ring is gone, empty sidecars of a ring that is
    not in use, and temporary files of a writer that died while making its ring. Returns them."""
    now = time.time() if now is None else now
    gone: list[Path] = []
    for f in sorted(folder.iterdir()):
        st = _regular(f)
        if st is None:
            continue
        name = f.name
        suffix = next((s for s in SIDECAR_SUFFIXES if name.endswith(RING_SUFFIX + s)), None)
        if suffix is not None:
            ring = Path(str(f)[: -len(suffix)])
            orphan = _regular(ring) is None
            empty_and_idle = st.st_size == 0 and not _in_use(ring, now)
            if orphan or empty_and_idle:
                gone.append(f)
        elif name.startswith(".") and name.endswith(".tmp") and RING_SUFFIX in name and now - st.st_mtime > STALE_S:
            gone.append(f)
    for f in gone:
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    return gone


def _in_use(ring: Path, now: float) -> bool:
    entries = [e for e in ring_entries(ring.parent, now) if e.path == ring] if _regular(ring) else []
    return bool(entries and entries[0].in_use)


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


def folder_entries(folder: Path, now: float | None = None) -> list[Entry]:
    """The rings and the run folders of a ring folder."""
    return ring_entries(folder, now) + run_entries(folder, now)


def prune_ring_folder(folder: Path, keep: str, new: int = 1) -> list[Path]:
    """Make room in a ring folder by a keep setting (``new``: entries about to be made count already)."""
    count, size = parse_keep(keep)
    if count is None and size is None:
        return []
    doomed = plan(folder_entries(folder), None if count is None else max(0, count - new), size)
    for e in doomed:
        delete(e)
    sweep(folder)
    return [e.path for e in doomed]


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


def keep_at_arm(folder: Path, keep: str | None, new: int = 1) -> str | None:
    """At arm: keep the ring folder within the keep setting in force (``new``: entries about to be made).
    Never raises: what went wrong comes back as a warning's text (a bad setting never stops arming)."""
    try:
        if not in_run_folder(folder):
            prune_ring_folder(folder, keep_setting(keep), new)
        if folder.name.startswith(SLURM_FOLDER_PREFIX):  # a Slurm job's own folder: the user's folder around it
            prune_ring_folder(folder.parent, keep_setting(keep), 0)
    except Exception as exc:
        return f"{'keep=' if keep is not None else KEEP_ENV} not applied: {exc}"
    return None
