"""Where a ring lives and how its file is made: naming, the default folder, sidecars, creation.

Creation is all-or-nothing: the file is made under a hidden temporary name with
``O_EXCL|O_NOFOLLOW`` and mode 0600, locked (``liveness``), its blocks reserved
with ``posix_fallocate`` (so a full disk fails here, not as a SIGBUS mid-run),
its zeros written with ``pwrite`` (so its pages are in the page cache, and the
writers' first lap faults them in without allocating, as every later lap does),
mapped ``MAP_SHARED``, its header written, and only then linked under its name.
On any failure the temporary file is removed and the ``OSError`` propagates to
the recorder, which turns it into one warning.

The mapping is whole but never resident whole, and never locked: the writers
keep only the 256 KiB chunk of records being written mapped (``_cwriter.c``, 4.;
two chunks at the instant one is left, as the page-cache folio of the next may
reach back), and the sampler unmaps the rest at each tick (mapping.py,
"Residency"). The pages stay in the page cache (charged to the job's memory
cgroup as any file it writes, and reclaimable once written back), not in the
process's RSS: arming does not change which process the kernel's OOM killer
picks. Before, the whole ring was pre-faulted and locked: 34,884 KiB of the
main process's RSS, enough to make it the OOM killer's victim instead of a
leaking DataLoader worker (tests/test_oom_victim.py).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from .._errors import BlackboxError
from .._fds import OwnedFd
from .format import MAGIC, STATE_ARMED, Header, decode_header
from .header import CRASH_SUFFIX as CRASH_SUFFIX
from .header import RING_SUFFIX as RING_SUFFIX
from .header import header_of
from .liveness import LOCK_LIVENESS, lock_held, lock_ring, pid_alive_here
from .mapping import RingMap

SLURM_FOLDER_PREFIX = "slurm-"
SNAPSHOT_SUFFIX = ".oom-snapshot.pickle"  # PyTorch's allocator snapshot at the first CUDA OOM
SIDECAR_SUFFIXES = (CRASH_SUFFIX, SNAPSHOT_SUFFIX)
_DISKLESS = {"tmpfs", "ramfs", "devtmpfs", "shm"}
FILL_PIECE = 256 << 10  # the zeros written at creation per pwrite: at most one write window's chunk


def user_dir(uid: int | None = None) -> Path:
    """``/var/tmp/blackbox-<uid>``: a user's own ring folder.

    ``/var/tmp`` is disk-backed on Linux distributions that follow the FHS and
    survives reboots, unlike ``/tmp``, which is often a tmpfs.
    """
    return Path("/var/tmp") / f"blackbox-{os.getuid() if uid is None else uid}"


def slurm_job_folder(job_id: str, restart: int | None = None) -> str:
    """The name of a Slurm job's ring folder inside the user's: ``slurm-<job id>``, and for a requeued
    job's later attempts ``slurm-<job id>-restart<N>`` (``SLURM_RESTART_COUNT``), so that each attempt's
    rings stay apart and the epilogue recovers the attempt that just ended."""
    return f"{SLURM_FOLDER_PREFIX}{job_id}" + (f"-restart{restart}" if restart else "")


def default_dir() -> Path:
    """``$BLACKBOX_DIR`` if set; else, in a Slurm job, a folder of that job's own inside the user's
    (``/var/tmp/blackbox-<uid>/slurm-<SLURM_JOB_ID>``, see ``slurm_job_folder``), so that the epilogue
    recovers that job's rings alone; else ``/var/tmp/blackbox-<uid>``."""
    env = os.environ.get("BLACKBOX_DIR")
    if env:
        return Path(env)
    job = os.environ.get("SLURM_JOB_ID", "")
    if job.isdigit() and len(job) <= 20:
        restart = os.environ.get("SLURM_RESTART_COUNT", "")
        return user_dir() / slurm_job_folder(job, int(restart) if restart.isdigit() and len(restart) < 6 else None)
    return user_dir()


def resolve_target(path: str | os.PathLike[str] | None) -> tuple[Path, bool]:
    """(where, is a folder): no path is the default folder; a path ending in ``/`` or naming an
    existing folder is a folder (the ring is named inside it); anything else is the ring file."""
    if path is None:
        return default_dir(), True
    text = os.fspath(path)
    target = Path(text)
    return target, text.endswith(os.sep) or target.is_dir()


def safe_folder(folder: Path) -> None:
    """Make (mode 0700) or accept a default ring folder only if it is this user's alone: owned by
    this user, not a symbolic link, not writable by group or others. Raises PermissionError
    naming what was found (another user could otherwise delete or read the rings, or plant files).
    A Slurm job's folder inside the user's (``default_dir``) is checked with the user's folder above it."""
    if folder.parent == user_dir() and folder != user_dir():
        safe_folder(folder.parent)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(folder)
    what = f"expected a folder of this user's alone (uid {os.geteuid()}, not writable by others)"
    if stat.S_ISLNK(st.st_mode):
        raise PermissionError(f"{folder}: {what}, found a symbolic link")
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"{folder}: {what}, found something that is not a folder")
    if st.st_uid != os.geteuid():
        raise PermissionError(f"{folder}: {what}, found one owned by uid {st.st_uid}")
    if st.st_mode & 0o022:
        raise PermissionError(f"{folder}: {what}, found mode {stat.S_IMODE(st.st_mode):o}")


def rings_of_pid(folder: Path, pid: int) -> list[str]:
    """The names of process ``pid``'s rings in ``folder`` (``ring_name``), by one directory listing."""
    try:
        return [n for n in os.listdir(folder) if f"-pid{pid}-" in n and n.endswith(RING_SUFFIX)]
    except OSError:
        return []


def died_armed(folder: Path, pid: int) -> bool:
    """Whether a ring of process ``pid`` in ``folder`` was left armed, not cleanly ended: the process died
    (SIGKILL, the OOM killer) where it is gone. One directory listing and a 12-byte read per match."""
    for name in rings_of_pid(folder, pid):
        try:
            fd = os.open(folder / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            head = os.pread(fd, 12, 0)
        except OSError:
            continue
        finally:
            os.close(fd)
        if len(head) == 12 and head[:8] == MAGIC and int.from_bytes(head[10:12], "little") == STATE_ARMED:
            return True
    return False


def ring_name(host: str, pid: int, rank: int | None, started_ns: int) -> str:
    """``blackbox-<host>-rank<R>-pid<P>-<UTC start>.ring``; rank ``x`` when unknown."""
    safe_host = re.sub(r"[^A-Za-z0-9.-]", "_", host)[:64] or "host"
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started_ns / 1e9))
    micros = (started_ns // 1000) % 1_000_000
    rank_s = "x" if rank is None else str(rank)
    return f"blackbox-{safe_host}-rank{rank_s}-pid{pid}-{stamp}.{micros:06d}Z{RING_SUFFIX}"


def sidecar(ring: Path, suffix: str) -> Path:
    """A file kept beside a ring: ``<ring><suffix>`` (one of SIDECAR_SUFFIXES)."""
    return Path(str(ring) + suffix)


def filesystem_type(path: Path) -> str | None:
    """The type of the filesystem holding ``path``, from /proc/self/mountinfo."""
    try:
        target = os.path.realpath(path)
        best, fstype = "", None
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                fields = left.split()
                if len(fields) < 5 or not right:
                    continue
                mount_point = fields[4].replace("\\040", " ")
                inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
                if inside and len(mount_point) >= len(best):
                    best, fstype = mount_point, right.split()[0]
        return fstype
    except OSError:
        return None


def is_diskless(path: Path) -> bool:
    return filesystem_type(path) in _DISKLESS


def write_new_file(path: Path, data: bytes) -> bool:
    """Write ``data`` to a new file at ``path``, mode 0600: made under a hidden temporary name with
    ``O_EXCL|O_NOFOLLOW``, then linked to ``path``, so whatever is there already (a file, a link another
    user planted) is never written through nor replaced. False when ``path`` was taken."""
    temp = path.with_name(f".{path.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.link(temp, path, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


@dataclass
class CreatedRing:
    """A ring made and placed: where it is, the descriptor that holds its lock, its mapping."""

    path: Path
    fd: OwnedFd
    map: RingMap
    header: Header
    locked: bool  # the writer's lock is held (liveness by lock; else by pid)
    note: str  # what happened at the requested path, when it was taken ("" otherwise)


def create_ring(requested: Path, header_for: Callable[[bool], bytes]) -> CreatedRing:
    """Make a ring under a hidden temporary name, lock it, reserve and map it, write the header
    (``header_for(locked)``), then link it into place whole: a ring visible under a ``.ring``
    name is complete and, while its writer lives, locked.

    Where ``requested`` is already a ring: a dead writer's is kept, moved aside to a numbered
    name (``train.1.ring``); a live writer's is left alone and this ring gets a fresh name
    beside it (``train.pid<pid>.ring``). Anything else there (not a ring, a link, another
    user's file) is refused, untouched.
    """
    temp = requested.with_name(f".{requested.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = OwnedFd.adopt(os.open(temp, flags, 0o600))
    mm = None
    try:
        locked = lock_ring(fd.fd)
        header = header_for(locked)
        decoded = decode_header(header, len(header))
        size = decoded.file_size
        os.posix_fallocate(fd.fd, 0, size)
        _fill_page_cache(fd.fd, size)
        mm = RingMap(fd.fd, size)
        mm.write(0, header)
        path, note = _place(temp, requested)
    except BaseException:
        if mm is not None:
            mm.close()
        fd.close()
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
    return CreatedRing(path, fd, mm, decoded, locked, note)


def _fill_page_cache(fd: int, size: int) -> None:
    """Write the file's zeros through the descriptor, FILL_PIECE at a time: its pages are then in the
    page cache, so the writers' first lap faults them into the mapping without allocating, as every
    later lap does, and none is mapped into this process (none counts in its RSS). The pieces'
    size bounds the page cache's folios, and so what one write fault maps (a kernel with large
    folios maps the whole folio)."""
    zeros = bytes(min(size, FILL_PIECE))
    for off in range(0, size, len(zeros)):
        n = min(len(zeros), size - off)
        if os.pwrite(fd, zeros if n == len(zeros) else zeros[:n], off) != n:
            raise OSError(errno.ENOSPC, "short write filling the ring")


def _place(temp: Path, requested: Path) -> tuple[Path, str]:
    notes: list[str] = []
    for _ in range(16):
        try:
            os.link(temp, requested)
        except FileExistsError:
            pass
        else:
            os.unlink(temp)
            return requested, "; ".join(notes)
        ino, live = _existing_ring(requested)
        if live:
            fresh = _link_fresh(temp, requested)
            os.unlink(temp)
            return fresh, f"{requested} is held by a live writer: recording to {fresh.name} beside it"
        aside = _move_aside(requested, ino)
        if aside is not None:
            notes.append(f"the earlier ring at {requested.name} was kept as {aside.name}")
    raise FileExistsError(f"{requested}: could not place the ring (the path kept changing)")


def _existing_ring(path: Path) -> tuple[int, bool]:
    """(inode, writer alive) of the ring already at ``path``; raises for anything that is not our ring."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileExistsError(f"{path} is a symbolic link: not following it") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise FileExistsError(f"{path} exists and is not a ring of this user's: left untouched")
        if os.pread(fd, 8, 0) != MAGIC:
            raise FileExistsError(f"{path} exists and is not a blackbox ring: left untouched")
        held = lock_held(fd)
        if held is None:
            return st.st_ino, True  # cannot tell: never move it
        if held:
            return st.st_ino, True
        try:
            meta = header_of(fd, st.st_size, str(path)).meta
        except BlackboxError:
            return st.st_ino, False  # a ring whose header is unreadable: nobody writes it
        return st.st_ino, meta.get("liveness") != LOCK_LIVENESS and pid_alive_here(meta)
    finally:
        os.close(fd)


def _stem(path: Path) -> str:
    return path.name[: -len(RING_SUFFIX)] if path.name.endswith(RING_SUFFIX) else path.name


def _link_fresh(temp: Path, requested: Path) -> Path:
    base = f"{_stem(requested)}.pid{os.getpid()}"
    for k in range(1, 1000):
        fresh = requested.with_name(f"{base}{'' if k == 1 else f'-{k}'}{RING_SUFFIX}")
        try:
            os.link(temp, fresh)
            return fresh
        except FileExistsError:
            continue
    raise FileExistsError(f"{requested}: no free name beside it")


def _move_aside(path: Path, ino: int) -> Path | None:
    """Link the dead ring (inode ``ino``) to the first free ``<stem>.<n>.ring`` and drop its old name;
    None if it vanished or changed meanwhile (another process arming there)."""
    for n in range(1, 100_000):
        aside = path.with_name(f"{_stem(path)}.{n}{RING_SUFFIX}")
        try:
            os.link(path, aside, follow_symlinks=False)
        except FileExistsError:
            continue
        except FileNotFoundError:
            return None
        if os.lstat(aside).st_ino != ino:
            os.unlink(aside)  # not the ring we looked at: another process placed a new one meanwhile
            return None
        with contextlib.suppress(OSError):
            if os.lstat(path).st_ino == ino:
                os.unlink(path)
        for suffix in SIDECAR_SUFFIXES:
            with contextlib.suppress(OSError):
                os.link(sidecar(path, suffix), sidecar(aside, suffix), follow_symlinks=False)
                os.unlink(sidecar(path, suffix))
        return aside
    return None
