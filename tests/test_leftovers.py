"""The tests' own cleanup (tests/leftovers.py, run after every test): what a test leaves in the default ring
folders goes, never a ring still armed, and a removed user's whole folder goes with it."""

from __future__ import annotations

import contextlib
import encodings.ascii  # noqa: F401  (the user cannot read the stdlib under /root: imported before forking)
import os
import pwd
import signal
import subprocess
import time
import warnings
from pathlib import Path

import private_tmp
import pytest
from conftest import spawn_py
from leftovers import ROOT, clean, snapshot
from users import local_users

import blackbox

DEFAULT_ARM = """
import sys, blackbox
rec = blackbox.arm(capacity=64, sample_interval=3600, keep="off")
print(rec.path, flush=True)
sys.stdin.readline()
"""


def _armed_in_default_folder() -> tuple[subprocess.Popen[str], Path]:
    env = {k: v for k, v in os.environ.items() if k != "BLACKBOX_DIR"}
    child = spawn_py(DEFAULT_ARM, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert child.stdout is not None
    path = Path(child.stdout.readline().strip())
    assert path.parent == ROOT / f"blackbox-{os.getuid()}", path
    return child, path


def test_a_dead_ring_left_in_the_default_folder_goes_and_a_live_one_stays(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    private_tmp.need()
    monkeypatch.delenv("BLACKBOX_DIR", raising=False)
    before = snapshot()
    # GIVEN two processes armed in the default folder: one SIGKILLed (its ring left behind), one still armed
    dead, dead_ring = _armed_in_default_folder()
    live, live_ring = _armed_in_default_folder()
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait(timeout=60)
        # WHEN the cleanup runs
        removed = clean(before)
        # THEN the dead ring went, the live one stayed
        assert dead_ring in removed and not dead_ring.exists()
        assert live_ring.exists()
    finally:
        live.communicate("go\n", timeout=60)
    assert live.returncode == 0
    assert live_ring in clean(before) and not live_ring.exists(), "once its writer is gone, it goes too"


def test_a_removed_users_default_folder_goes_whole() -> None:
    private_tmp.need()
    before = snapshot()
    # GIVEN a user made for the test arms with their default folder, and is removed
    with local_users("left") as (user,):
        folder = ROOT / f"blackbox-{user.uid}"

        def arm() -> str:
            os.environ.pop("BLACKBOX_DIR", None)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                rec = blackbox.Recorder.arm(capacity=64, sample_interval=3600, keep="off")
            assert rec.armed, [str(w.message) for w in caught]
            return str(rec.path)  # the forked child leaves without disarming, as a killed job would

        ring = Path(user.run(arm))
        assert ring.parent == folder and ring.exists()
    # WHEN the cleanup runs, THEN the removed user's whole folder went
    assert folder in clean(before) and not folder.exists()


def test_a_user_with_a_process_still_running_is_removed() -> None:
    # GIVEN a test user whose background step is still running when the test is done with the user
    with local_users("busy") as (user,):
        pid = user.start(lambda: time.sleep(600))
        name = user.name
    # THEN the user is gone (userdel alone refuses while the user has a process) and so is the process
    with pytest.raises(KeyError):
        pwd.getpwnam(name)
    assert os.waitpid(pid, 0)[0] == pid


def test_a_real_jobs_ring_that_dies_during_a_test_is_never_removed() -> None:
    private_tmp.need()
    before = snapshot()
    # GIVEN a real job beside the suite (in the machine's mount namespace, its default folder), armed during
    # a test and SIGKILLed before the test ends: its ring is the evidence a flight recorder exists to keep
    folder = ROOT / f"blackbox-{os.getuid()}"
    existed = private_tmp.machine_path(folder).exists()
    env = {k: v for k, v in os.environ.items() if k != "BLACKBOX_DIR"}
    job = spawn_py(DEFAULT_ARM, env=env, stdin=subprocess.PIPE,
                   stdout=subprocess.PIPE, preexec_fn=private_tmp.in_machine_namespace)  # fmt: skip
    assert job.stdout is not None
    ring = Path(job.stdout.readline().strip())
    seen = private_tmp.machine_path(ring)
    try:
        assert ring.parent == folder and seen.exists(), ring
        job.send_signal(signal.SIGKILL)
        job.wait(timeout=60)
        # WHEN the suite's clean-up runs after the test
        removed = clean(before)
        # THEN the job's ring is still there
        assert seen.exists(), f"the clean-up removed a real job's ring: {removed}"
    finally:
        job.kill()
        job.wait(timeout=60)
        seen.unlink(missing_ok=True)  # the one file this test made there (as the job), and its folder if new
        if not existed:
            with contextlib.suppress(OSError):
                private_tmp.machine_path(folder).rmdir()


def test_a_killed_sessions_private_var_tmp_goes_and_a_live_ones_stays() -> None:
    private_tmp.need()
    # GIVEN in the machine's /var/tmp the private folder of a session killed an hour ago, and this session's
    real = os.open(private_tmp.machine_path(ROOT / "x").parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        dead = private_tmp.machine_path(ROOT / f"{private_tmp.PREFIX}killed{os.getpid()}")
        (dead / "blackbox-0").mkdir(parents=True)
        (dead / "blackbox-0" / "left.ring").write_bytes(b"x")
        hour_ago = time.time() - 3600
        os.utime(dead, (hour_ago, hour_ago))
        ours = private_tmp.machine_path(ROOT / private_tmp._State.private.name)  # type: ignore[union-attr]
        os.utime(ours, (hour_ago, hour_ago))
        # WHEN a session starts and sweeps them
        private_tmp._sweep(real)
        # THEN the dead one went whole, and this one (the root of this session's /var/tmp) stayed
        assert not dead.exists() and ours.is_dir()
    finally:
        os.close(real)
        if dead.exists():
            subprocess.run(["rm", "-rf", str(dead)], check=False)
