"""A BlackboxWarning points at the user's own line (the ``blackbox.arm()`` call), never at blackbox's
modules: warnings from arm itself at its caller's line, warnings from blackbox's own thread at the line
that armed it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO

ARM_FAILS = """\
import blackbox

recorder = blackbox.arm("/proc/no-such-folder/job.ring")
print("armed", recorder.armed)
"""
THREAD_WARNS = """\
import sys, time
import blackbox
from blackbox.collect import stacks

recorder = blackbox.arm(sys.argv[1], capacity=256, sample_interval=0.01)

def broken(*_args):
    raise RuntimeError("stack table broken")

stacks.StackTable.intern = broken  # the sampler's thread meets it at its next tick
def somewhere_new():
    time.sleep(0.5)
somewhere_new()
print("armed", recorder.armed)
"""
BAD_OPTION = """\
import sys
import blackbox


def start():
    return blackbox.arm(sys.argv[1], capacity=256, sample_interval=3600, stack_threads=[42])


start()
"""


def run_job(tmp_path: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    job = tmp_path / "train.py"
    job.write_text(code)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, str(job), *args], capture_output=True, text=True, env=env, timeout=60)


def warning_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "BlackboxWarning" in line]


def test_a_failed_arm_warns_at_the_line_that_called_arm(tmp_path: Path) -> None:
    proc = run_job(tmp_path, ARM_FAILS)
    assert proc.returncode == 0 and proc.stdout.strip() == "armed False"
    (line,) = warning_lines(proc.stderr)
    assert line.startswith(f"{tmp_path / 'train.py'}:3: BlackboxWarning: blackbox is disarmed"), proc.stderr
    assert 'recorder = blackbox.arm("/proc/no-such-folder/job.ring")' in proc.stderr, "the line itself is shown"


def test_a_warning_from_blackboxs_own_thread_points_at_the_arm_call(tmp_path: Path) -> None:
    proc = run_job(tmp_path, THREAD_WARNS, str(tmp_path / "job.ring"))
    assert proc.returncode == 0 and proc.stdout.strip() == "armed True", proc.stderr
    (line,) = warning_lines(proc.stderr)
    assert line.startswith(f"{tmp_path / 'train.py'}:5: BlackboxWarning: blackbox stopped sampling stacks"), \
        proc.stderr  # fmt: skip
    assert "threading.py" not in proc.stderr and "_recorder.py" not in proc.stderr


def test_a_warning_inside_arm_points_at_the_users_caller_not_blackbox(tmp_path: Path) -> None:
    proc = run_job(tmp_path, BAD_OPTION, str(tmp_path / "job.ring"))
    (line,) = warning_lines(proc.stderr)
    assert line.startswith(f"{tmp_path / 'train.py'}:6: BlackboxWarning: "), proc.stderr
    assert "stack_threads" in line and "blackbox/" not in line.split("BlackboxWarning")[0]


def test_under_w_error_a_warning_is_still_never_an_exception(tmp_path: Path) -> None:
    job = tmp_path / "train.py"
    job.write_text(ARM_FAILS)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-W", "error", str(job)], capture_output=True, text=True, env=env,
                          timeout=60)  # fmt: skip
    assert proc.returncode == 0 and proc.stdout.strip() == "armed False" and "Traceback" not in proc.stderr
    assert len(warning_lines(proc.stderr)) == 1
