"""A multiprocessing worker whose target raises, under ``blackbox run``, for each start method: the job runs as
unarmed (the same output, the worker's traceback printed as it was), and the worker's ring keeps its death,
that exception, not folded away as a helper that ended cleanly. Python 3.13 moved the worker's finalizers
(blackbox's disarm among them) after the exception was printed: the disarm no longer saw it go by."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.ring.writer import built_module

JOB = """\
import multiprocessing as mp, sys

def load_shard(n):
    raise KeyError(f"shard {n} is missing")  # the planted truth

if __name__ == "__main__":
    mp.set_start_method(sys.argv[1])
    p = mp.Process(target=load_shard, args=(7,))
    p.start()
    p.join()
    print("worker exitcode", p.exitcode, flush=True)
"""
ENV = dict(os.environ, PYTHONPATH=str(REPO))


@pytest.mark.skipif(built_module() is None, reason="needs the C extension (blackbox run records the exit status)")
@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_a_workers_exception_is_its_death_for_every_start_method(tmp_path: Path, method: str) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    # GIVEN a job whose worker's target raises KeyError, run unarmed and under `blackbox run`
    plain = subprocess.run([sys.executable, str(script), method], capture_output=True, text=True, env=ENV,
                           timeout=120)  # fmt: skip
    armed = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "run"), "--quiet", "--",
                            sys.executable, str(script), method], capture_output=True, text=True, env=ENV,
                           timeout=120)  # fmt: skip
    # THEN the job is unchanged: its status and output, and the worker's traceback as it printed it
    assert (armed.returncode, armed.stdout) == (plain.returncode, plain.stdout) == (0, "worker exitcode 1\n")
    traceback = [ln for ln in plain.stderr.splitlines() if ln.strip()]
    assert traceback[-1] == "KeyError: 'shard 7 is missing'" and traceback[0].startswith("Process "), plain.stderr
    assert "\n".join(traceback) in armed.stderr, (plain.stderr, armed.stderr)
    # AND the worker's ring was kept and tells that exception, at its line; the job outlived it
    (run,) = (tmp_path / "run").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    workers = [r for r in meta["rings"] if r["role"] == "worker"]
    assert len(workers) == 1, [(r["role"], r["death"]["cause"]) for r in meta["rings"]]
    death = workers[0]["death"]
    assert death["cause"] == "exception", death
    assert any(re.search(r"KeyError: 'shard 7 is missing'", e) for e in death["evidence"]), death["evidence"]
    assert meta["first_death"]["pid"] == workers[0]["pid"] and meta["exit_status"] == 0
    assert all(h["role"] != "worker" for h in meta.get("helpers", [])), meta.get("helpers")
