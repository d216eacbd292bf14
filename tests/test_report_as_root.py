"""``blackbox report`` of a bundle, run as root, while the bundle's owner swaps it for another user's.

The attacker is a user made with ``useradd`` (``users.py``); she waits with inotify (``inotify.py``) for
root to open her bundle's metadata.json, then swaps her bundle for a link to the victim's: root must read
the timeline from the folder it read the metadata from.
"""

from __future__ import annotations

import encodings.idna  # noqa: F401  (the user cannot read the stdlib under /root: imported before forking)
import json
import os
import secrets
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
from blackbox.cli import main

pytestmark = pytest.mark.slow  # root's command in a process of its own, and users
PADDING = 2_000_000  # values in the attacker's metadata.json that root parses before it opens the timeline
PADDED_FOLDERS = 300  # folders root looks into after it has found the attacker's bundle


@pytest.fixture(scope="module")
def users() -> Iterator[tuple[User, User]]:
    with local_users("rpvictim", "rpattack") as (victim, attacker):
        yield victim, attacker


def _bundle(user: User, folder: Path, function: str) -> Path:
    """``folder/bundle``: a bundle of one ring whose stack samples were taken in ``function``, the user's
    (made here, then given): the report draws what the job was doing from the timeline's stacks."""
    folder.mkdir(mode=0o700)
    scope: dict[str, object] = {"time": time}
    exec(f"def {function}():\n    time.sleep(0.3)\n", scope)  # noqa: S102  (a frame of that name)
    rec = blackbox.Recorder.arm(folder / "r.ring", capacity=4096, sample_interval=0.02, keep="off")
    scope[function]()  # type: ignore[operator]
    rec.disarm()
    assert main(["recover", str(folder / "r.ring"), "-o", str(folder / "bundle"), "--no-raw"]) == 0
    user.give(folder)
    return folder / "bundle"


def test_a_bundle_swapped_for_another_users_after_its_metadata_is_read_gives_no_other_users_timeline(
    users: tuple[User, User], tmp_path: Path
) -> None:
    victim, attacker = users
    secret = f"victim_{secrets.token_hex(4)}"
    with shared_folder() as shared:
        # GIVEN the victim's bundle in her private folder, and the attacker's, its metadata.json padded
        theirs = _bundle(victim, shared / "victim", secret)
        mine = _bundle(attacker, shared / "attacker", "attackers_job")
        os.chmod(shared / "attacker", 0o755)
        meta = json.loads((mine / "metadata.json").read_text())
        (mine / "metadata.json").write_text(json.dumps({**meta, "padding": [0] * PADDING}))
        # and the attacker waiting (inotify) for root to open it, to swap her bundle for a link to the victim's
        ready_r, ready_w = os.pipe()

        def swap() -> None:
            with Watch() as watch:
                watch.add(mine / "metadata.json")
                os.write(ready_w, b"w")
                watch.wait(120)
                os.rename(mine, mine.with_name("moved"))
                os.symlink(theirs, mine)
                os.write(ready_w, b"s")

        pid = attacker.start(swap)
        try:
            assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"w"
            # WHEN root writes the report of her bundle
            page = tmp_path / "r.html"
            done = subprocess.run([sys.executable, "-m", "blackbox", "report", str(mine), "-o", str(page)],
                                  capture_output=True, text=True, timeout=120,
                                  env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
            assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"s", "the swap was not made"
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(ready_r)
            os.close(ready_w)
    # THEN the report is of her bundle alone: the victim's timeline is nowhere in it
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert "attackers_job" in text and secret not in text


def test_a_bundle_found_in_a_folder_and_swapped_for_another_users_gives_no_other_users_timeline(
    users: tuple[User, User], tmp_path: Path
) -> None:
    victim, attacker = users
    secret = f"victim_{secrets.token_hex(4)}"
    with shared_folder() as shared:
        # GIVEN the victim's bundle in her private folder, and the attacker's job folder: her bundle host-a,
        # and after it many empty folders for root to look into
        theirs = _bundle(victim, shared / "victim", secret)
        job = shared / "job"
        job.mkdir()
        mine = _bundle(attacker, job / "host-a", "attackers_job")
        attacker.give(job)
        attacker.run(lambda: [(job / f"x-{i}").mkdir() for i in range(PADDED_FOLDERS)] and None)
        # and the attacker waiting (inotify) for root to list host-a, to swap it for a link to the victim's
        ready_r, ready_w = os.pipe()

        def swap() -> None:
            with Watch() as watch:
                watch.add(mine)
                os.write(ready_w, b"w")
                watch.wait(120)
                os.rename(mine, job / "moved")
                os.symlink(theirs, mine)
                os.write(ready_w, b"s")

        pid = attacker.start(swap)
        try:
            assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"w"
            # WHEN root writes the report of her job folder
            page = tmp_path / "r.html"
            t0 = time.monotonic()
            done = subprocess.run([sys.executable, "-m", "blackbox", "report", str(job), "-o", str(page)],
                                  capture_output=True, text=True, timeout=120,
                                  env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
            assert select.select([ready_r], [], [], 30)[0] and os.read(ready_r, 1) == b"s", "the swap was not made"
        finally:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            os.close(ready_r)
            os.close(ready_w)
    print("REPORT", time.monotonic() - t0, done.stderr)
    # THEN the victim's timeline is nowhere: where the swap came before root opened host-a, the bundle, now a
    # link, is refused in one line; where root held host-a open first (the race is the attacker's to lose: seen
    # under load), the report is of the folder root opened, the attacker's own job
    assert secret not in done.stdout + done.stderr
    assert not page.exists() or secret not in page.read_text()
    if done.returncode == 0:
        assert "attackers_job" in page.read_text() and not done.stderr, done.stderr
    else:
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
