"""A job that hangs after Slurm's SIGTERM (its handler only sets a flag, as Lightning's does) is SIGKILLed by
slurmstepd ``KillWait`` (30 s) later, ``blackbox run`` with it: the snapshot ``blackbox run`` writes a second
after the SIGTERM (run/snapshot.py) is then all there is, and its line in the job's output says where it hung.
Against a real slurmd (``tests/slurm_cluster.py``), armed and unarmed side by side."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from tests.slurm_cluster import slurm_cluster
from tests.test_hang import FLAG_HANDLER

pytestmark = pytest.mark.slow

JOB = FLAG_HANDLER  # a flag-setting SIGTERM handler (Lightning's), stuck at step 30


def test_a_job_hung_at_scancel_leaves_the_snapshot_of_where_it_hung() -> None:
    with slurm_cluster() as c:
        folder = c.folder / "jobs"
        job = folder / "hung_job.py"
        job.write_text(JOB)
        jobs = {}
        for armed in (False, True):
            run = f"{sys.executable} -m blackbox run --quiet -- " if armed else ""
            marker = folder / f"stuck-{armed}"
            out = folder / f"out-{armed}"
            jobs[armed] = (c.sbatch(f"#!/bin/bash\nexec {run}{sys.executable} {job} {marker}\n", "--mem=700M",
                                    "--ntasks=1", "-o", str(out)), marker, out)  # fmt: skip
        for job_id, marker, _ in jobs.values():
            c.wait_running(job_id, marker)
        time.sleep(3.0)  # stuck for longer than a hang needs (10 steps' time, and 2 s)
        for job_id, _, _ in jobs.values():
            c.run("scancel", str(job_id))  # SIGTERM, taken by the flag handler; SIGKILL after KillWait
        account = {armed: c.wait(job_id, timeout=120) for armed, (job_id, _, _) in jobs.items()}
        # THEN both end alike in Slurm's account (killed by SIGKILL after KillWait)
        assert account[False]["ExitCode"] == account[True]["ExitCode"] == "0:9", account
        # AND the armed job's output says where it hung, and the snapshot it names is there
        text = jobs[True][2].read_text()
        line = next((x for x in text.splitlines() if "the job still runs 1 s after SIGTERM from slurmstepd" in x), "")
        plant = JOB.splitlines().index("        threading.Event().wait()  # PLANT: stuck here; the flag is never "
                                       "read again") + 1  # fmt: skip
        assert f"stuck in load (hung_job.py:{plant})" in line, text
        bundle = Path(line.split("A snapshot is in ")[1].split("/: ")[0])
        death = json.loads((bundle / "metadata.json").read_text())["death"]
        assert death["alive"] and "taken by its own handler" in death["headline"], death
