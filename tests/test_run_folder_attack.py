"""`blackbox run --dir D` where another user can change D: the attack as it was found, done for real.

Two users made with ``useradd`` share a team group; the team folder is setgid
2770. The victim runs ``blackbox run --dir TEAM -- python3 job.py``; the job
starts a Python child once told to. The attacker, racing, renames the victim's
fresh ``run-*`` folder and puts her own ``.boot/sitecustomize.py`` in its place,
then lets the job go on. Whatever happens, the victim's child must never run the
attacker's code: blackbox run refuses such a folder before the job starts. In a
sticky team folder (3770, root's) the kernel stops the rename, so it is accepted
and the job runs.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from users import User, local_group, local_users, shared_folder

PYTHON3 = shutil.which("python3", path="/usr/bin:/bin")  # one every user can run (the venv's may be root's)
JOB = """\
import os, subprocess, sys, time
open(sys.argv[1], "w").write(os.environ.get("BLACKBOX_RUN_BOOT", ""))
deadline = time.time() + 30
while not os.path.exists(sys.argv[2]) and time.time() < deadline:
    time.sleep(0.02)
subprocess.run([sys.executable, "-c", "pass"])
"""
PLANTED = """\
import os
open({marker!r}, "w").write(f"the attacker's code ran as uid {{os.getuid()}}")
"""


def _victim_runs_blackbox(victim: User, team_gid: int, team: Path, shared: Path) -> int:
    """Fork the victim's `blackbox run --dir TEAM -- python3 job.py READY GO`; returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 125
    try:
        os.setgroups([team_gid])
        os.setresgid(victim.gid, victim.gid, victim.gid)
        os.setresuid(victim.uid, victim.uid, victim.uid)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        err = os.open(shared / "victim.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(err, 2)
        os.dup2(err, 1)
        sys.stdout = sys.stderr = open(err, "w", buffering=1)  # noqa: SIM115 - pytest's capture is not fd 2
        os.chdir(shared)
        from blackbox.cli.run import main

        code = main(["--dir", str(team), "--quiet", "--", str(PYTHON3), str(shared / "job.py"),
                     str(shared / "ready"), str(shared / "go")])  # fmt: skip
    finally:
        with open(shared / "victim.done", "w") as f:
            f.write(str(code))
        os._exit(code)


def _attacker_swaps(team: Path, shared: Path) -> str:
    """As the attacker: once the victim's job is up, rename each run-* folder and plant a sitecustomize in
    its place, then let the job go on. Returns what happened."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if (shared / "victim.done").exists():
            return "the victim's blackbox run ended before any job started"
        if (shared / "ready").exists():
            break
        time.sleep(0.01)
    else:
        return "timed out"
    done = []
    for run in sorted(team.glob("run-*")):
        try:
            os.rename(run, team / f"stolen-{run.name}")
            (run / ".boot").mkdir(parents=True)
            (run / ".boot" / "sitecustomize.py").write_text(PLANTED.format(marker=str(shared / "marker")))
            done.append(f"swapped {run.name}")
        except OSError as exc:
            done.append(f"{run.name}: {type(exc).__name__}: {exc.strerror}")
    (shared / "go").write_text("go")
    return "; ".join(done) or "no run folder"


@dataclass
class Outcome:
    attacker: str  # what the attacker did
    status: int  # the victim's blackbox run's exit status
    stderr: str  # what the victim's blackbox run printed
    entries: list[str]  # what is in the team folder afterwards
    planted_ran: str  # what the attacker's code wrote, if it ever ran


def _attack(mode: int) -> Outcome:
    """The attack on a team folder of this mode (owned by root, group team), done for real."""
    with local_users("victim", "attacker") as (victim, attacker), local_group("team", [victim, attacker]) as gid:
        with shared_folder() as shared:
            team = shared / "team"
            team.mkdir()
            os.chown(team, 0, gid)
            os.chmod(team, mode)
            (shared / "job.py").write_text(JOB)
            os.chmod(shared / "job.py", 0o644)
            pid = _victim_runs_blackbox(victim, gid, team, shared)
            try:
                did = attacker.run(lambda: _attacker_swaps(team, shared), groups=[gid])
            finally:
                _, status = os.waitpid(pid, 0)
            marker = shared / "marker"
            planted_ran = marker.read_text() if marker.exists() else ""
            err = (shared / "victim.err").read_text()
            return Outcome(
                did, os.waitstatus_to_exitcode(status), err, sorted(p.name for p in team.iterdir()), planted_ran
            )


@pytest.mark.skipif(PYTHON3 is None, reason="no /usr/bin/python3 for the victim's job")
def test_a_team_folder_another_user_can_write_is_refused_before_the_job_runs() -> None:
    out = _attack(0o2770)
    assert not out.planted_ran, f"the victim's child ran the attacker's code: {out.planted_ran}; {out.attacker}"
    assert out.status == 1, out.stderr
    assert "can write (mode 2770)" in out.stderr and "another user could swap the run folder" in out.stderr
    assert out.attacker == "the victim's blackbox run ended before any job started"
    assert out.entries == []  # nothing made in the team folder


@pytest.mark.skipif(PYTHON3 is None, reason="no /usr/bin/python3 for the victim's job")
def test_a_sticky_team_folder_is_used_and_the_rename_is_refused_by_the_kernel() -> None:
    out = _attack(0o3770)
    assert not out.planted_ran, f"the victim's child ran the attacker's code: {out.planted_ran}; {out.attacker}"
    assert "PermissionError" in out.attacker and "swapped" not in out.attacker, out.attacker
    # (the victim cannot read root's Python installation, so its recovery may fail to import: not the point here)
    assert out.status == 0 and "exit status 0" in out.stderr, out.stderr


def test_a_folder_of_ones_own_under_one_others_can_write_is_refused(tmp_path: Path) -> None:
    # GIVEN --dir naming a folder of this user's, 0700, inside a folder every user can write (not sticky)
    from blackbox._errors import BlackboxError
    from blackbox.run.folder import work_folder

    with shared_folder() as shared:
        os.chmod(shared, 0o777)
        mine = shared / "mine"
        mine.mkdir(mode=0o700)
        # WHEN blackbox run makes its run folder there: THEN it refuses, naming the folder others can write
        with pytest.raises(BlackboxError, match=f"found {shared}, which every user can write \\(mode 777\\)"):
            work_folder(str(mine))
        assert list(mine.iterdir()) == []
        os.chmod(shared, 0o1777)  # sticky, as /tmp: others cannot rename what is ours in it
        assert work_folder(str(mine)).parent == mine
