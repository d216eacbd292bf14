"""``blackbox prune`` run as root over folders users can change meanwhile.

Each attack is done for real by users made with ``useradd`` (``users.py``), the attacker's steps as that
user; the race waits for root with inotify (``inotify.py``) and swaps the pruned folder for a link to the
victim's folder once root has listed what it will delete.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (the user cannot read the stdlib under /root: imported before forking)
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO
from inotify import Watch
from users import User, local_users, shared_folder

import blackbox

pytestmark = pytest.mark.slow  # each starts root's command in a process of its own, and users
PADDING = 2_000  # entries root walks after it has listed the decoy and before it deletes it
OLD = time.time() - 30 * 86400


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[User, User]]:
    with local_users("prvictim", "prattack") as (victim, attacker):
        yield victim, attacker


@pytest.fixture
def shared() -> Iterator[Path]:
    with shared_folder() as path:
        yield path


def _prune(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """``blackbox prune`` as root, in a process of its own (``--as-owner`` drops root for good)."""
    return subprocess.run([sys.executable, "-m", "blackbox", "prune", str(folder), *options], text=True,
                          capture_output=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip


def _victims_job(victim: User, shared: Path) -> Path:
    """The victim's private folder, with a job folder ``slurm-900`` holding its ring."""
    theirs = shared / "victim"
    (theirs / "slurm-900").mkdir(parents=True)
    rec = blackbox.Recorder.arm(theirs / "slurm-900" / "evidence.ring", capacity=64, sample_interval=3600, keep="off")
    rec.mark("the victim's evidence")
    rec.disarm()
    victim.give(theirs)
    os.chmod(theirs, 0o700)
    return theirs / "slurm-900" / "evidence.ring"


def _plant(attacker: User, folder: Path) -> None:
    """As the attacker: an old, empty decoy ``slurm-900`` and a young ``slurm-999`` with many entries."""

    def plant() -> None:
        (folder / "slurm-900").mkdir()
        os.utime(folder / "slurm-900", (OLD, OLD))
        (folder / "slurm-999").mkdir()
        for i in range(PADDING):
            os.close(os.open(folder / "slurm-999" / f"pad-{i}", os.O_CREAT | os.O_WRONLY))

    attacker.run(plant)


def _race(attacker: User, folder: Path, victims: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Root prunes ``folder`` keeping one entry; the attacker waits (inotify) for root to walk ``slurm-999``,
    by then done with the decoy, and swaps ``folder`` for a link to the victim's folder."""
    ready_r, ready_w = os.pipe()

    def swap() -> None:
        with Watch() as watch:
            watch.add(folder / "slurm-999")
            os.write(ready_w, b"w")
            watch.wait(120)
            os.rename(folder, folder.with_name("moved"))
            os.symlink(victims, folder)
            os.write(ready_w, b"s")

    pid = attacker.start(swap)
    try:
        assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"w"
        done = _prune(folder, "--max-count", "1", *options)
        assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"s", "the swap was not made"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)
    return done


@pytest.mark.parametrize("owner", ["root", "attacker"])
def test_a_folder_swapped_for_a_link_after_roots_listing_deletes_nothing_of_another_user(
    users: tuple[User, User], shared: Path, owner: str
) -> None:
    victim, attacker = users
    # GIVEN the victim's job folder slurm-900 with its ring, in the victim's private folder
    evidence = _victims_job(victim, shared)
    # and a folder root prunes inside a folder the attacker owns: root's own, open to all like a shared
    # folder of rings (root prunes it as root), or the attacker's (root prunes it --as-owner)
    parent = shared / "attacker"
    parent.mkdir()
    attacker.give(parent)
    folder = parent / "rings"
    folder.mkdir()
    os.chmod(folder, 0o1777)
    if owner == "attacker":
        attacker.give(folder)
    # and in it the attacker's old empty decoy slurm-900, and a young slurm-999 of many entries
    _plant(attacker, folder)
    # WHEN root prunes it to one entry while the attacker swaps it for a link to the victim's folder
    done = _race(attacker, folder, shared / "victim", *(["--as-owner"] if owner == "attacker" else []))
    # THEN the victim's job folder and ring are still there, and what root listed is what it pruned
    assert done.returncode == 0, done.stderr
    assert evidence.exists(), f"root deleted another user's ring: {done.stdout}"
    assert not (parent / "moved" / "slurm-900").exists() and (parent / "moved" / "slurm-999").exists()


def test_root_refuses_another_users_folder_unless_as_its_owner(users: tuple[User, User], shared: Path) -> None:
    _, attacker = users
    # GIVEN the attacker's folder with an old job folder beyond any limit, and a link to it
    folder = shared / "rings"
    folder.mkdir()
    attacker.give(folder)
    attacker.run(lambda: ((folder / "slurm-1").mkdir(), os.utime(folder / "slurm-1", (OLD, OLD))))
    (shared / "link").symlink_to(folder)
    # WHEN root prunes it, or the link to it, to nothing
    refused, linked = _prune(folder, "--max-count", "0"), _prune(shared / "link", "--max-count", "0")
    # THEN both are refused in one line each, nothing deleted
    assert refused.returncode == 1 and linked.returncode == 1
    assert refused.stderr.count("\n") == 1 and f"found one of uid {attacker.uid}" in refused.stderr
    assert "--as-owner" in refused.stderr
    assert linked.stderr.count("\n") == 1 and "symbolic link" in linked.stderr, linked.stderr
    assert (folder / "slurm-1").exists()
    # AND --as-owner prunes it as the attacker
    done = _prune(folder, "--max-count", "0", "--as-owner")
    assert done.returncode == 0 and not (folder / "slurm-1").exists(), done.stderr
