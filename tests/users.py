"""Real local users for attack tests: made with ``useradd``, removed with ``userdel`` after.

An attacker's steps run as that user in a forked child of the test process
(``setresuid``), so the kernel checks them as it would a real user's: what the
attacker cannot do (write into a root folder, read a root-only file) fails
here too. Tests skip, saying why, only where users cannot be made (not root,
no ``useradd``).
"""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int

    def run(self, step: Callable[[], Any], groups: Sequence[int] = ()) -> str:
        """Run ``step`` as this user (and member of ``groups``) in a forked child; return what it returns,
        as text, or raise AssertionError with the child's error."""
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: drop to the user, do the step, report, leave without cleanup
            code = 1
            try:
                os.close(r)
                os.setgroups(list(groups))
                os.setresgid(self.gid, self.gid, self.gid)
                os.setresuid(self.uid, self.uid, self.uid)
                result = step()
                os.write(w, ("" if result is None else str(result)).encode())
                code = 0
            except BaseException as exc:
                os.write(w, f"{type(exc).__name__}: {exc}".encode())
            finally:
                os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            out = f.read().decode()
        _, status = os.waitpid(pid, 0)
        if os.waitstatus_to_exitcode(status) != 0:
            raise AssertionError(f"as {self.name}: {out}")
        return out

    def start(self, step: Callable[[], Any]) -> int:
        """Run ``step`` as this user in a forked child, in the background (an attack looping while the
        test goes on): the child's pid, for the caller to SIGKILL and reap."""
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(ready_r)
                os.setgroups([])
                os.setresgid(self.gid, self.gid, self.gid)
                os.setresuid(self.uid, self.uid, self.uid)
                os.close(ready_w)  # the child is the user's now: a cleanup that looks for the uid finds it
                step()
            finally:
                os._exit(0)
        os.close(ready_w)
        try:
            os.read(ready_r, 1)  # returns at the child's close (or its death), never before its uid changed
        finally:
            os.close(ready_r)
        return pid

    def give(self, path: Path) -> Path:
        """chown ``path`` (and what is inside it) to this user, as if they had made it."""
        for p in [path, *(path.rglob("*") if path.is_dir() else [])]:
            os.chown(p, self.uid, self.gid, follow_symlinks=False)
        return path


@contextmanager
def local_users(*roles: str) -> Iterator[list[User]]:
    """One new local user per role (``bb<role><n>``), removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("making local users needs root (useradd)")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("no useradd/userdel on this machine")
    made: list[User] = []
    try:
        for role in roles:
            name = f"bb{role[:10]}{os.getpid() % 100_000}"
            proc = subprocess.run(
                ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", "--user-group", name],
                capture_output=True,
                text=True,
            )
            if proc.returncode != 0:
                pytest.skip(f"useradd refused to make a user: {proc.stderr.strip()}")
            pw = pwd.getpwnam(name)
            made.append(User(name, pw.pw_uid, pw.pw_gid))
        yield made
    finally:
        left = []
        for user in made:
            try:
                remove_user(user)
            except AssertionError as exc:
                left.append(str(exc))
        assert not left, left


def _pids_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def remove_user(user: User) -> None:
    """userdel, which refuses while the user has a process: a background attack left running (``start``)
    is SIGKILLed first (the uid is this test's alone). Fails the test if the user is still there."""
    for _ in range(50):
        for pid in _pids_of(user.uid):
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["userdel", user.name], capture_output=True)
        try:
            pwd.getpwnam(user.name)
        except KeyError:
            return
        time.sleep(0.1)
    raise AssertionError(f"could not remove the test user {user.name}")


@contextmanager
def local_group(role: str, members: Sequence[User]) -> Iterator[int]:
    """A new local group (``bb<role><n>``) with ``members`` in it, removed afterwards: its gid. A member's
    steps run in it with ``User.run(step, groups=[gid])``."""
    if os.geteuid() != 0 or shutil.which("groupadd") is None or shutil.which("usermod") is None:
        pytest.skip("making a local group needs root, groupadd and usermod")
    name = f"bb{role[:10]}{os.getpid() % 100_000}"
    proc = subprocess.run(["groupadd", name], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"groupadd refused to make a group: {proc.stderr.strip()}")
    try:
        for user in members:
            subprocess.run(["usermod", "-a", "-G", name, user.name], check=True, capture_output=True)
        yield grp.getgrnam(name).gr_gid
    finally:
        subprocess.run(["groupdel", name], capture_output=True)
        with suppress(KeyError):
            grp.getgrnam(name)
            raise AssertionError(f"could not remove the test group {name}")


@contextmanager
def shared_folder() -> Iterator[Path]:
    """A world-writable sticky folder like ``/var/tmp`` (not under pytest's root-only tmp_path)."""
    path = Path(tempfile.mkdtemp(prefix="bb-shared-"))
    os.chmod(path, 0o1777)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
