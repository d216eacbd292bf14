"""A private ``/var/tmp`` for the test session, so that the suite never touches a real job's rings.

Tests arm with the default folder (``/var/tmp/blackbox-<uid>``), run ``blackbox run`` (its run folders go
there too), run jobs as users made with ``useradd`` and Slurm jobs (theirs go to their users' folders),
and the suite removes after each test what the test left (``leftovers.py``). On a shared training node
those folders also hold the rings of real jobs, and a ring that appeared during a test is not always the
test's: a job that died meanwhile left it. So, as the Slurm lane makes its cluster in a folder of its own,
the session makes ``/var/tmp`` its own: where it runs as root, :func:`enter` moves this process into a
new mount namespace (``unshare(CLONE_NEWNS)``, every mount made private so nothing propagates back) and
binds a fresh folder of the real ``/var/tmp`` (``bb-test-vartmp-XXXXXXXX``, mode 1777 like ``/var/tmp``,
on the same filesystem) over ``/var/tmp``. Every process the tests start, and every thread started from
now on, sees it; no other process on the machine does, and this process sees no other's rings. What is
left in it when the session ends goes whole (:func:`leave`); the folder of a session killed before it
could remove it goes when the next session starts (:func:`_sweep`: no live process has it as a mount).

Without root (or where the kernel refuses the namespace) there is no private ``/var/tmp``: the session
sets ``BLACKBOX_DIR`` to a folder of its own instead, and tests that need the default folder itself ask
for :func:`need` (they skip, saying why). The clean-up after each test then never looks in ``/var/tmp``.

Called at the top of ``conftest.py``, before ``blackbox`` (and numpy's threads) is imported: a thread
that exists at the ``unshare`` stays in the machine's namespace.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import shutil
import stat
import tempfile
import time
from pathlib import Path

import pytest

VAR_TMP = Path("/var/tmp")
PREFIX = "bb-test-vartmp-"  # never "blackbox-": that is a user's ring folder
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000


STALE_S = 60.0  # an unmounted private folder this old belongs to a session that ended without removing it


class _State:
    private: Path | None = None  # the folder of the real /var/tmp bound over /var/tmp, as its real path names it
    real: int = -1  # the real /var/tmp, opened before the bind: the private folder is removed through it
    machine: int = -1  # the mount namespace the session started in (tests start a real job there)
    folder: Path | None = None  # without a private /var/tmp: the session's BLACKBOX_DIR
    why_not: str = ""
    pid: int = 0  # the session's process (a forked child that exits normally removes nothing)


def enter() -> None:
    """Make ``/var/tmp`` this session's own (see the module docstring); once per process."""
    if _State.private is not None or _State.folder is not None:
        return
    _State.pid = os.getpid()
    atexit.register(leave)  # a process that is no pytest session (a script importing the tests' helpers)
    why = _private_var_tmp()
    if why is None:
        return
    _State.why_not = why
    _State.folder = Path(tempfile.mkdtemp(prefix="bb-test-rings-"))
    os.environ["BLACKBOX_DIR"] = str(_State.folder)


def _private_var_tmp() -> str | None:
    if os.geteuid() != 0:
        return "a private /var/tmp needs root (a mount namespace)"
    libc = ctypes.CDLL(None, use_errno=True)
    real = os.open(VAR_TMP, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    _sweep(real)
    machine = os.open("/proc/self/ns/mnt", os.O_RDONLY | os.O_CLOEXEC)
    private = Path(tempfile.mkdtemp(prefix=PREFIX, dir=VAR_TMP))
    os.chmod(private, 0o1777)
    steps = (
        lambda: libc.unshare(_CLONE_NEWNS),
        lambda: libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None),
        lambda: libc.mount(os.fsencode(private), os.fsencode(VAR_TMP), None, _MS_BIND, None),
    )
    for step in steps:
        if step() != 0:
            err = ctypes.get_errno()
            os.rmdir(private)
            os.close(real)
            os.close(machine)
            return f"the kernel refused a private /var/tmp ({os.strerror(err)})"
    _State.private, _State.real, _State.machine = private, real, machine
    return None


def _sweep(real: int) -> None:
    """Remove the private folders of sessions that ended without removing theirs (killed): root's, older than
    a minute, and the root of no mount in any process's namespace (a live session's /var/tmp is)."""
    now = time.time()
    stale = []
    for name in os.listdir(real):
        with contextlib.suppress(OSError):
            st = os.stat(name, dir_fd=real, follow_symlinks=False)
            if name.startswith(PREFIX) and stat.S_ISDIR(st.st_mode) and st.st_uid == 0 and now - st.st_mtime > STALE_S:
                stale.append(name)
    if not stale:
        return
    mounted = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
            mounted.update(line.split()[3].rsplit("/", 1)[-1] for line in f if PREFIX in line)
    for name in stale:
        if name not in mounted:
            shutil.rmtree(f"/proc/self/fd/{real}/{name}", ignore_errors=True)


def leave() -> None:
    """Remove what the session left: the private ``/var/tmp`` (through the real one) or its BLACKBOX_DIR."""
    if os.getpid() != _State.pid:
        return
    if _State.private is not None:
        shutil.rmtree(f"/proc/self/fd/{_State.real}/{_State.private.name}", ignore_errors=True)
    if _State.folder is not None:
        shutil.rmtree(_State.folder, ignore_errors=True)


def private() -> bool:
    """``/var/tmp`` is this session's own."""
    return _State.private is not None


def in_machine_namespace() -> None:
    """Move the calling process (a child between fork and exec) to the machine's mount namespace, where
    ``/var/tmp`` is everyone's: a real job's, run beside the suite."""
    if ctypes.CDLL(None, use_errno=True).setns(_State.machine, _CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "setns to the machine's mount namespace")


def machine_path(path: Path) -> Path:
    """Where this process reaches ``path`` of the machine's ``/var/tmp`` (through the real one's descriptor)."""
    return Path(f"/proc/self/fd/{_State.real}") / path.relative_to(VAR_TMP)


def need() -> None:
    """Skip the calling test where ``/var/tmp`` is not this session's own (it arms in the default folder itself)."""
    if not private():
        pytest.skip(f"needs a private /var/tmp for the default ring folder: {_State.why_not}")


enter()  # on import: conftest imports this module before blackbox (and numpy's threads)
