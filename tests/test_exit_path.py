"""The armed job's clean exit: what blackbox's end adds to it (no msync unless ``sync_interval`` asked for one)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.ring.reader import find_rings, read_ring

JOB = """
import sys, blackbox
rec = blackbox.arm(sys.argv[1] + "/", sync_interval=float(sys.argv[2]) if sys.argv[2] != "none" else None)
for n in range(50000):
    blackbox.mark("loss", n)
print("written", flush=True)
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="counting msync calls needs strace")
@pytest.mark.parametrize("sync_interval", ["none", "3600"])
def test_a_clean_exit_msyncs_the_ring_only_where_sync_interval_asked(tmp_path: Path, sync_interval: str) -> None:
    # GIVEN an armed job that writes 50,000 events and exits, its system calls traced
    trace = tmp_path / "trace"
    proc = subprocess.run(["strace", "-f", "-qq", "-e", "trace=msync", "-o", str(trace), sys.executable, "-c", JOB,
                           str(tmp_path / "rings"), sync_interval], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert proc.returncode == 0 and proc.stdout == "written\n", proc.stderr
    msyncs = [line for line in trace.read_text().splitlines() if re.search(r"\bmsync\(", line)]
    # THEN its end msyncs the whole ring once where the job asked for periodic syncs (sync_interval: the sampler's
    # hour never came), and never otherwise: the page cache holds the ring whatever becomes of the process
    assert len(msyncs) == (0 if sync_interval == "none" else 1), msyncs
    # AND every event is in the ring, which ended cleanly
    ring = read_ring(next(iter(find_rings([tmp_path / "rings"]))))
    labels = [ring.strings.get(int(i)) for i in ring.records["label"]]
    assert ring.clean and labels.count("loss") == 50000


def test_sys_exit_called_wrongly_fails_armed_as_unarmed(tmp_path: Path) -> None:
    # GIVEN a job that calls sys.exit with a keyword (a TypeError: it takes its status positionally)
    job = tmp_path / "job.py"
    job.write_text("import os, sys\nif os.environ.get('RING'):\n    import blackbox\n"
                   "    blackbox.arm(os.environ['RING'])\nsys.exit(status=3)\n")  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO))
    runs = {ring: subprocess.run([sys.executable, str(job)], capture_output=True, text=True, timeout=60,
                                 env=dict(env, RING=ring)) for ring in ("", str(tmp_path / "j.ring"))}  # fmt: skip
    # THEN armed, it fails as it does unarmed: status 1 and the same TypeError (blackbox's sys.exit wrapper
    # once took the keyword and exited 3)
    unarmed, armed = runs.values()
    assert unarmed.returncode == armed.returncode == 1, (unarmed.stderr, armed.stderr)
    error = "TypeError: sys.exit() takes no keyword arguments"
    assert unarmed.stderr.splitlines()[-1] == armed.stderr.splitlines()[-1] == error, armed.stderr
