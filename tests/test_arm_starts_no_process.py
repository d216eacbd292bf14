"""Arming starts no process in the job: no fork, no exec, no subprocess, from import to disarm.

A child of the job's is a change a user can see (in ``ps``, in a launcher's process table, in the
SIGCHLD its end sends to the job's handlers). ctypes.util.find_library, which blackbox's mapping
once used to find libc, runs ``ldconfig -p`` in a child at import: every armed rank of the field's
nanoGPT job had a child the unarmed one did not.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_py

JOB = """
import json, sys, time
started = []
def audit(event, args):
    if event in ("subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.exec", "os.system",
                 "os.spawn", "pty.spawn"):
        started.append([event, repr(args)[:200]])
sys.addaudithook(audit)
import blackbox
rec = blackbox.arm(sys.argv[1], sample_interval=0.05)
time.sleep(0.3)  # a few sampler ticks
blackbox.step()
rec.disarm()
print(json.dumps(started))
"""


@pytest.mark.parametrize("backend", ["c", "python"])
def test_import_arm_sample_and_disarm_start_no_process(tmp_path: Path, backend: str) -> None:
    proc = run_py(JOB, f"{tmp_path}/", env={"BLACKBOX_WRITER": backend})
    started = json.loads(proc.stdout.strip().splitlines()[-1])
    assert started == [], started
    assert list(tmp_path.glob("*.ring")), "nothing was armed"
