"""A job whose command line holds bytes that are not UTF-8 (a Latin-1 file name): armed as any other."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

from blackbox.ring.reader import find_rings, read_ring

ENV = dict(os.environ, PYTHONPATH=str(REPO))
JOB = """\
import sys, blackbox
blackbox.arm(sys.argv[1])
print(blackbox.active().armed, flush=True)
raise ValueError("planted")
"""


def test_arm_with_an_argument_that_is_not_utf8_records_it_escaped(tmp_path: Path) -> None:
    # GIVEN a job started with an argument of Latin-1 bytes (Python keeps them as lone surrogates)
    (tmp_path / "train.py").write_text(JOB)
    proc = subprocess.run([sys.executable, str(tmp_path / "train.py"), str(tmp_path / "rings") + "/", b"caf\xe9.bin"],
                          capture_output=True, env=ENV, timeout=120)  # fmt: skip
    # THEN it arms (before, "blackbox is disarmed: ... metadata text that is not valid Unicode") and the ring
    # names the argument with its byte escaped
    assert proc.returncode == 1 and proc.stdout == b"True\n", proc.stderr.decode(errors="replace")
    assert b"disarmed" not in proc.stderr, proc.stderr.decode(errors="replace")
    (path,) = find_rings([tmp_path / "rings"])
    assert read_ring(path).meta["identity"]["argv"][-1] == "caf\\xe9.bin"


def test_blackbox_run_of_a_job_with_an_argument_that_is_not_utf8_tells_its_death(tmp_path: Path) -> None:
    # GIVEN the same command run directly (its own arm() call) and under `blackbox run`
    (tmp_path / "train.py").write_text(JOB)
    cmd = [sys.executable, str(tmp_path / "train.py"), str(tmp_path / "own") + "/", b"caf\xe9.bin"]
    plain = subprocess.run(cmd, capture_output=True, env={**ENV, "PYTHONPATH": str(REPO)}, timeout=120)
    armed = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "run"), "--", *cmd],
                           capture_output=True, env=ENV, timeout=120)  # fmt: skip
    # THEN it ends as unarmed and its bundle tells the exception (before: "the job left no ring")
    assert (armed.returncode, armed.stdout) == (plain.returncode, plain.stdout) == (1, b"True\n")
    (bundle,) = (tmp_path / "run").glob("run-*/bundle")
    summary = (bundle / "summary.md").read_text()
    assert 'The job died of an uncaught ValueError at \\<module> (train.py:4): "planted".' in summary, summary[:2000]
