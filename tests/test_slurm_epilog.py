"""``blackbox epilog`` as a real slurmd runs it, checked against Slurm's own account of each job.

One cluster (``proctrack/cgroup``, ``task/cgroup`` with ``ConstrainRAMSpace``)
whose Epilog is README's line (``blackbox epilog -o DEST``, run by slurmd as root
with no PATH). Its jobs run at once, as root and as a user made with ``useradd``:

- ``oom``: the user's job under ``blackbox run`` outgrows ``--mem``: Slurm says
  OUT_OF_MEMORY; blackbox run's own verdict (no kernel log for a normal user) is
  ``host_oom_kill`` from the task cgroup's counter, and the epilogue's (root,
  the kernel's line) is ``host_oom_kill``, certain, in a bundle the user owns;
  blackbox run's verdict is the job's comment (``scontrol show job``), which the
  epilogue cannot set on a finished job (it says so);
- ``neighbour`` (the same user, still running when the others end) and
  ``cancelled`` (``scancel``): the cancelled job's bundle holds its own ring
  alone, says SIGTERM from slurmstepd was a cancel, not the neighbour's death;
- ``requeued`` (root, ``arm()``): ``scontrol requeue`` then ``scancel``: two
  bundles, one per attempt, each of its own attempt's ring, the first saying
  the SIGTERM was a requeue;
- ``timeout`` (root, ``arm()``, ``--time=1``): the SIGTERM was the time limit.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import shared_python, slurm_cluster
from tests.users import local_users

pytestmark = pytest.mark.slow

ARMED = """
import os, sys, time
import blackbox
blackbox.arm(sample_interval=0.2)
open(sys.argv[1], "a").write(f"START {os.getpid()} {os.environ.get('SLURM_RESTART_COUNT')}\\n")
while True:
    time.sleep(0.05)
"""
GROW = """
import os, sys, time
open(sys.argv[1], "a").write(f"START {os.getpid()}\\n")
chunks = []
while True:
    chunks.append(bytearray(os.urandom(1 << 20) * 16))  # 16 MiB, every page touched
    time.sleep(0.05)
"""


def _bundle(dest: Path, job: int, host: str, restart: int = 0) -> dict:
    place = dest / str(job) / (host + (f"-restart{restart}" if restart else ""))
    assert (place / "metadata.json").is_file(), f"no bundle at {place}: {sorted(dest.rglob('*'))[:20]}"
    return json.loads((place / "metadata.json").read_text())


def _death(meta: dict) -> dict:
    return meta.get("death") or meta["first_death"]


def _ring_pids(meta: dict) -> list[int]:
    return sorted(r["pid"] for r in meta.get("rings", [meta]) if "pid" in r)


def _wait_log(log: Path, lines: int, timeout: float = 60) -> list[str]:
    deadline = time.monotonic() + timeout
    while True:
        got = log.read_text().splitlines() if log.exists() else []
        if len(got) >= lines:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{log}: {got} after {timeout:.0f} s")
        time.sleep(0.2)


def test_slurm_epilogue_recovers_each_job_alone_for_its_user(tmp_path: Path) -> None:
    dest = Path(os.environ.get("TMPDIR", "/tmp")) / f"bb-epilog-dest-{os.getpid()}"
    epilog = f"{sys.executable} -m blackbox epilog -o {dest}"
    with local_users("slurmjob") as (user,), slurm_cluster(epilog=epilog) as c:
        python = shared_python(c.folder)
        jobs_dir = c.folder / "jobs"
        (jobs_dir / "armed.py").write_text(ARMED)
        (jobs_dir / "grow.py").write_text(GROW)
        mine = jobs_dir / "mine"
        mine.mkdir(mode=0o700)
        user.give(mine)
        log = {name: (mine if name in ("oom", "neighbour", "cancelled") else jobs_dir) / f"{name}.log"
               for name in ("oom", "neighbour", "cancelled", "requeued", "timeout")}  # fmt: skip
        run = f"{python} -m blackbox run --quiet --"
        ids = {
            "oom": c.sbatch(f"#!/bin/sh\nexec {run} {python} {jobs_dir}/grow.py {log['oom']}\n",
                            "--mem=200M", "-o", f"{mine}/oom.out", user=user, folder=mine),
            "neighbour": c.sbatch(f"#!/bin/sh\nexec {python} {jobs_dir}/armed.py {log['neighbour']}\n",
                                  "--mem=200M", "-o", f"{mine}/neighbour.out", user=user, folder=mine),
            "cancelled": c.sbatch(f"#!/bin/sh\nexec {python} {jobs_dir}/armed.py {log['cancelled']}\n",
                                  "--mem=200M", "-o", f"{mine}/cancelled.out", user=user, folder=mine),
            "requeued": c.sbatch(f"#!/bin/sh\nexec {sys.executable} {jobs_dir}/armed.py {log['requeued']}\n",
                                 "--mem=200M", "--requeue", "-o", f"{jobs_dir}/requeued.out"),
            "timeout": c.sbatch(f"#!/bin/sh\nexec {sys.executable} {jobs_dir}/armed.py {log['timeout']}\n",
                                "--mem=200M", "--time=1", "-o", f"{jobs_dir}/timeout.out"),
        }  # fmt: skip
        for name in ("neighbour", "cancelled", "requeued"):
            _wait_log(log[name], 1)
        time.sleep(1.5)  # a few samples in the rings
        c.run("scancel", str(ids["cancelled"]))
        c.run("scontrol", "requeue", str(ids["requeued"]))
        _wait_log(log["requeued"], 2, timeout=120)  # the second attempt started
        time.sleep(1.5)
        c.run("scancel", str(ids["requeued"]))
        account = {name: c.wait(ids[name], timeout=240) for name in ("oom", "cancelled", "requeued", "timeout")}
        host = c.host

        assert account["oom"]["JobState"] == "OUT_OF_MEMORY", account["oom"]
        out = (mine / "oom.out").read_text()
        assert "cause: host_oom_kill" in out, out  # blackbox run's own verdict, as the user (no kernel log)
        run_bundle = Path(out.split("bundle in ")[1].split()[0])
        run_death = _death(json.loads((run_bundle / "metadata.json").read_text()))
        assert run_death["confidence"] == "strong", run_death  # the task cgroup's oom_kill counter rose
        assert any("oom_kill counter rose" in e for e in run_death["evidence"]), run_death
        oom = _bundle(dest, ids["oom"], host)
        assert (oom["cause"], _death(oom)["confidence"]) == ("host_oom_kill", "certain"), _death(oom)
        place = dest / str(ids["oom"]) / host
        owners = {p.stat().st_uid for p in [place, *place.rglob("*")]}
        assert owners == {user.uid}, f"the bundle is not the user's alone: {owners}"
        assert (dest / str(ids["oom"])).stat().st_uid == user.uid
        # blackbox run's verdict is the job's comment, in one line (scontrol update while the job still runs, as
        # its user); the epilogue's cannot be there: this slurmctld refuses a finished job's update, and says so
        shown = c.run("scontrol", "-o", "show", "job", str(ids["oom"]))
        assert "Comment=blackbox: host_oom_kill (strong): The main process" in shown, shown
        assert f"Bundle: {run_bundle}" in shown, shown
        said = [ln for ln in c.log("epilog.log").splitlines() if f"job {ids['oom']}: 1 rings" in ln]
        assert said and "no comment: scontrol said: Job has already finished" in said[0], said

        cancelled = _bundle(dest, ids["cancelled"], host)
        started = [int(line.split()[1]) for line in log["cancelled"].read_text().splitlines()]
        assert _ring_pids(cancelled) == started, "another job's ring joined the cancelled job's bundle"
        assert account["cancelled"]["JobState"] == "CANCELLED"
        assert "a cancel (scancel)" in json.dumps(_death(cancelled)), _death(cancelled)

        first, second = (_bundle(dest, ids["requeued"], host, n) for n in (0, 1))
        pids = [int(line.split()[1]) for line in log["requeued"].read_text().splitlines()]
        assert _ring_pids(first) == [pids[0]] and _ring_pids(second) == [pids[1]]
        assert "a requeue" in json.dumps(_death(first)), _death(first)
        assert account["requeued"]["Restarts"] == "1"

        assert account["timeout"]["JobState"] == "TIMEOUT"
        assert "time limit" in json.dumps(_death(_bundle(dest, ids["timeout"], host)))
        assert "blackbox epilog" in c.log("epilog.log") and "Traceback" not in c.log("epilog.log")
        c.run("scancel", str(ids["neighbour"]))
        c.wait(ids["neighbour"])
    _remove(dest)


def _remove(dest: Path) -> None:
    import shutil

    shutil.rmtree(dest, ignore_errors=True)


def test_epilog_outside_an_epilogue_is_one_line(tmp_path: Path) -> None:
    from tests.conftest import run_py

    out = run_py("import blackbox.cli as c, sys; sys.exit(c.main(['epilog', '-o', sys.argv[1]]))", str(tmp_path),
                 env={"SLURM_JOB_ID": "", "SLURM_JOB_UID": ""}, check=False)  # fmt: skip
    assert out.returncode == 1
    assert out.stderr.strip().count("\n") == 0 and "SLURM_JOB_ID" in out.stderr, out.stderr
