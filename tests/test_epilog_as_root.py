"""Slurm's epilogue (``blackbox epilog``, run as root) over a job's folders its user can change meanwhile.

Each attack is done for real by users made with ``useradd`` (``users.py``), the attacker's steps as that
user; the race waits for root with inotify (``inotify.py``). The epilogue runs as Slurm runs it: root, a
fresh process, the job's id and user in its environment, the default folders (``/var/tmp`` is the
session's own: ``private_tmp.py``).
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (the user cannot read the stdlib under /root: imported before forking)
import json
import os
import secrets
import select
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import private_tmp
import pytest
from conftest import REPO
from inotify import Watch
from users import User, local_users

import blackbox
from blackbox.recovery.bundle import read_bundle

pytestmark = pytest.mark.slow  # each starts root's command in a process of its own, and users
PADDING = 2_000  # entries root lists between its first listing of the swapped folder and its use of it


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[User, User]]:
    with local_users("epvictim", "epattack") as (victim, attacker):
        yield victim, attacker


def _job_folder(user: User, job: int) -> Path:
    folder = Path(f"/var/tmp/blackbox-{user.uid}/slurm-{job}")
    folder.mkdir(mode=0o700, parents=True)
    os.chmod(folder.parent, 0o700)
    user.give(folder.parent)
    return folder


def _ring(user: User, folder: Path, label: str) -> Path:
    """A ring as the user's job leaves it (made here, then given to them)."""
    rec = blackbox.Recorder.arm(folder / f"{label}.ring", capacity=128, sample_interval=3600, keep="off")
    for i in range(5):
        rec.mark(label, i)
    rec.disarm()
    assert rec.path is not None
    return user.give(rec.path)


def _epilog(job: int, user: User, out: Path) -> subprocess.CompletedProcess[str]:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "SLURM_JOB_ID": str(job),
           "SLURM_JOB_UID": str(user.uid), "SLURM_JOB_GID": str(user.gid)}  # fmt: skip
    return subprocess.run([sys.executable, "-m", "blackbox", "epilog", "-o", str(out)], env=env, text=True,
                          capture_output=True, timeout=120)  # fmt: skip


def _texts(bundle: Path) -> str:
    """Every label of the bundle's timeline, and its metadata."""
    table, meta = read_bundle(bundle)
    return json.dumps(meta) + "\n".join(str(v) for v in table["label"].to_pylist() if v is not None)


def test_a_run_folder_swapped_for_a_link_after_roots_first_listing_hands_over_no_other_users_ring(
    users: tuple[User, User], tmp_path: Path
) -> None:
    private_tmp.need()
    victim, attacker = users
    secret = f"VICTIM-{secrets.token_hex(4)}"
    # GIVEN the victim's finished job with its ring in its own private folder
    theirs = _job_folder(victim, 901)
    _ring(victim, theirs, secret)
    # and the attacker's job: a run folder with her ring, and another with many entries for root to list
    mine = _job_folder(attacker, 902)
    rings = mine / "run-a" / "rings"
    rings.mkdir(parents=True)
    (mine / "run-b" / "rings").mkdir(parents=True)
    attacker.give(mine)
    _ring(attacker, rings, "attacker")
    attacker.run(lambda: [os.close(os.open(mine / "run-b" / "rings" / f"pad-{i}", os.O_CREAT | os.O_WRONLY))
                          for i in range(PADDING)] and None)  # fmt: skip
    # and the attacker waiting (inotify) for root's first listing of run-a/rings, to swap it for a link to the
    # victim's job folder
    ready_r, ready_w = os.pipe()

    def swap() -> None:
        with Watch() as watch:
            watch.add(rings)
            os.write(ready_w, b"w")
            watch.wait(120)
            os.rename(rings, rings.parent / "moved")
            os.symlink(theirs, rings)
            os.write(ready_w, b"s")

    pid = attacker.start(swap)
    try:
        assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"w"
        # WHEN Slurm's epilogue recovers the attacker's job as root
        done = _epilog(902, attacker, tmp_path / "out")
        assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"s", "the swap was not made"
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(ready_r)
        os.close(ready_w)
    # THEN the attacker's bundle holds her ring alone: the victim's ring is neither in its timeline nor in rings/
    assert done.returncode == 0, done.stderr
    bundle = tmp_path / "out" / "902" / socket.gethostname().split(".")[0]
    text = _texts(bundle)
    assert "attacker" in text, done.stderr
    assert secret not in text and secret not in done.stderr
    kept = [k["ring"] for k in json.loads((bundle / "metadata.json").read_text())["raw_rings"]["kept"]]
    assert kept and all("attacker" in k for k in kept), kept
    assert [p.name for p in (bundle / "rings").iterdir()] == ["attacker.ring.zst"]


def test_only_the_jobs_users_rings_are_read(users: tuple[User, User], tmp_path: Path) -> None:
    private_tmp.need()
    victim, attacker = users
    secret = f"VICTIM-{secrets.token_hex(4)}"
    # GIVEN in the attacker's job folder her ring and a ring of the victim's (root places it, as the victim's
    # own job would where the attacker's folder is open to her)
    mine = _job_folder(attacker, 903)
    _ring(attacker, mine, "attacker")
    _ring(victim, mine, secret)
    # WHEN Slurm's epilogue recovers the attacker's job as root
    done = _epilog(903, attacker, tmp_path / "out")
    # THEN her ring is recovered, the victim's is named unread in one line and read nowhere
    assert done.returncode == 0, done.stderr
    bundle = tmp_path / "out" / "903" / socket.gethostname().split(".")[0]
    meta = json.loads((bundle / "metadata.json").read_text())
    assert secret not in _texts(bundle).replace(f"{secret}.ring", "")
    assert [k["file"] for k in meta["raw_rings"]["kept"]] == ["rings/attacker.ring.zst"]
    reasons = [u["reason"] for u in meta["unread_rings"]]
    assert len(reasons) == 1 and f"uid {victim.uid}" in reasons[0] and f"uid {attacker.uid}" in reasons[0], reasons
