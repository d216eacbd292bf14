"""Slurm's signals reach a job under ``blackbox run`` exactly once, as they reach the job run without it.

Against a real slurmd (``tests/slurm_cluster.py``), under ``proctrack/cgroup``
(slurmstepd signals only its own child: ``blackbox run``) and
``proctrack/linuxproc`` (it signals every process below it, the job first). The
job counts what its handlers took: SIGTERM (then it dies by it, as an unhandled
SIGTERM would) and SIGUSR1 (a checkpoint). Each way Slurm signals is done to an
armed and an unarmed job side by side, and both must count the same and end with
the same exit code in Slurm's own account (``0:15``: killed by SIGTERM, where a
dropped SIGTERM leaves the job to slurmstepd's SIGKILL after ``KillWait``,
``0:9``):

- ``scancel`` of a batch job (SIGCONT, SIGTERM to the step's container);
- ``scancel -b -s USR1`` (the batch script's pid alone), then ``scancel``;
- ``--signal=B:USR1@115`` with a 2-minute time limit (slurmctld sends it at its
  next check, within about a minute), then ``scancel``;
- an ``srun`` step: ``scancel -s USR1`` (the steps' containers), then ``scancel``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import Cluster, slurm_cluster

pytestmark = pytest.mark.slow

JOB = """
import os, signal, sys, time
log = sys.argv[1]
def note(what):
    with open(log, "a") as f:
        f.write(f"{what} {os.getpid()}\\n")
def on_term(signum, frame):
    note("TERM")
    time.sleep(1.0)  # a second SIGTERM meanwhile would be counted too
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)
signal.signal(signal.SIGTERM, on_term)
signal.signal(signal.SIGUSR1, lambda s, f: note("USR1"))
note("START")
while True:
    time.sleep(0.05)
"""
WAYS = ("scancel", "batch_usr1", "signal_b", "srun")


def _script(way: str, armed: bool, job: Path, log: Path, python: str) -> tuple[str, list[str]]:
    run = f"{python} -m blackbox run --quiet -- " if armed else ""
    options = ["--mem=200M", "--ntasks=1", "-o", f"{log}.out"]
    if way == "signal_b":
        options += ["--time=2", "--signal=B:USR1@115"]
    if way == "srun":
        return f"#!/bin/bash\nsrun --mem=150M {run}{python} {job} {log}\n", options
    return f"#!/bin/bash\nexec {run}{python} {job} {log}\n", options


def _count(log: Path) -> dict[str, int]:
    words = [line.split()[0] for line in log.read_text().splitlines()] if log.exists() else []
    return {w: words.count(w) for w in ("START", "TERM", "USR1")}


def _wait_for(log: Path, word: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while _count(log)[word] == 0:
        if time.monotonic() > deadline:
            raise AssertionError(f"no {word} in {log} after {timeout:.0f} s: {_count(log)}")
        time.sleep(0.2)


def _drive(c: Cluster, python: str) -> dict[tuple[str, bool], tuple[int, Path]]:
    folder = c.folder / "jobs"
    job = folder / "counting_job.py"
    job.write_text(JOB)
    jobs = {}
    for way in WAYS:
        for armed in (False, True):
            log = folder / f"{way}-{'armed' if armed else 'plain'}.log"
            script, options = _script(way, armed, job, log, python)
            jobs[(way, armed)] = (c.sbatch(script, *options), log)
    for job_id, log in jobs.values():
        c.wait_running(job_id, log)
        _wait_for(log, "START", 60)
    time.sleep(1.0)  # blackbox run's job armed and its handlers set
    for (way, _), (job_id, _log) in jobs.items():
        if way == "batch_usr1":
            c.run("scancel", "-b", "-s", "USR1", str(job_id))
        elif way == "srun":
            c.run("scancel", "-s", "USR1", str(job_id))
    for (way, _), (job_id, log) in jobs.items():
        if way != "scancel":
            _wait_for(log, "USR1", 100 if way == "signal_b" else 30)
        time.sleep(0.5)  # a second delivery, had there been one, would be counted by now
        c.run("scancel", str(job_id))
    return jobs


@pytest.mark.parametrize("proctrack", ["cgroup", "linuxproc"])
def test_slurm_signals_reach_the_job_exactly_once(proctrack: str) -> None:
    with slurm_cluster(proctrack=proctrack) as c:
        python = sys.executable
        jobs = _drive(c, python)
        account = {key: c.wait(job_id) for key, (job_id, _) in jobs.items()}
        problems = []
        for way in WAYS:
            plain, armed = (_count(jobs[(way, a)][1]) for a in (False, True))
            plain_code, armed_code = (account[(way, a)]["ExitCode"] for a in (False, True))
            usr1 = 0 if way == "scancel" else 1
            if plain != {"START": 1, "TERM": 1, "USR1": usr1}:
                problems.append(f"{way}: the unarmed job counted {plain}")
            if armed != plain:
                problems.append(f"{way}: armed {armed}, unarmed {plain}")
            if armed_code != plain_code:
                problems.append(f"{way}: Slurm's exit code armed {armed_code}, unarmed {plain_code}")
        assert not problems, f"proctrack/{proctrack}: " + "; ".join(problems)
        assert account[("scancel", False)]["ExitCode"] == "0:15"  # Slurm's account of a job killed by SIGTERM
        for way in ("scancel", "batch_usr1", "signal_b"):  # blackbox run recovered within KillWait
            out = Path(f"{jobs[(way, True)][1]}.out").read_text()
            assert "bundle in " in out, out
            bundle = Path(out.split("bundle in ")[1].split()[0])
            death = json.loads((bundle / "metadata.json").read_text())["death"]
            assert death["cause"] == "signal" and "SIGTERM" in " ".join(death["evidence"]), death
