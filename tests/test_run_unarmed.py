"""A job whose command sets PYTHONPATH anew runs unrecorded under `blackbox run`, and is told why (it read only
"the job left no ring ... is not Python, ran with -S or -I, or could not arm"): ``run.unarmed``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.run.unarmed import sets_pythonpath

JOB = ("import sys, time\nimport numpy\nprint('up', flush=True)\ntime.sleep(float(sys.argv[1]))\n"
       "raise ValueError('bad config')\n")


def _run(tmp_path: Path, *command: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "runs"), "--quiet", "--",
                           *command], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)  # fmt: skip


def test_an_assignment_that_drops_the_entry_is_found_and_one_that_keeps_it_is_not(tmp_path: Path) -> None:
    script, program = tmp_path / "train.sh", tmp_path / "train.py"
    script.write_text("#!/bin/bash\ncd /code\nexport PYTHONPATH=/code/src\npython train.py\n")
    program.write_text('import os\nos.environ["X"] = "PYTHONPATH=/not/a/shell/assignment"\n')
    assert sets_pythonpath(["env", "PYTHONPATH=src", "python", "x.py"]) == "PYTHONPATH=src"
    assert sets_pythonpath(["bash", "-c", "export PYTHONPATH=/a; python x.py"]) == "PYTHONPATH=/a"
    assert sets_pythonpath(["bash", str(script)]) == "PYTHONPATH=/code/src"
    assert sets_pythonpath(["bash", "-c", "PYTHONPATH=/a:$PYTHONPATH python x.py"]) is None
    assert sets_pythonpath(["bash", "-c", 'export PYTHONPATH="${PYTHONPATH}:/a"']) is None
    assert sets_pythonpath(["python", str(program)]) is None  # a Python file is not read as a launch script
    assert sets_pythonpath(["python", "-c", "print(1)"]) is None


@pytest.mark.slow
def test_a_job_that_sets_pythonpath_is_told_why_it_left_no_ring(tmp_path: Path) -> None:
    # GIVEN a job that fails at once, started with PYTHONPATH set anew on its command line
    (tmp_path / "train.py").write_text(JOB)
    unarmed = subprocess.run(["env", "PYTHONPATH=src", sys.executable, "train.py", "0"], capture_output=True,
                             text=True, cwd=tmp_path, timeout=120)  # fmt: skip
    armed = _run(tmp_path, "env", "PYTHONPATH=src", sys.executable, "train.py", "0")
    # THEN it ends as unarmed, and blackbox run says the assignment dropped its entry, and what to do
    assert armed.returncode == unarmed.returncode == 1 and armed.stdout == unarmed.stdout == "up\n"
    assert "the job's command sets PYTHONPATH=src, which drops blackbox run's entry" in armed.stderr, armed.stderr
    assert "PYTHONPATH=src:$PYTHONPATH" in armed.stderr


@pytest.mark.slow
def test_a_launch_scripts_python_without_the_entry_is_named_by_pid_and_a_kept_entry_is_recorded(
    tmp_path: Path,
) -> None:
    # GIVEN launch scripts that export PYTHONPATH, one replacing it and one keeping what it had, then run python
    (tmp_path / "train.py").write_text(JOB)
    for name, value in (("replace.sh", "$PWD/src"), ("keep.sh", "$PWD/src:$PYTHONPATH")):
        (tmp_path / name).write_text(f"#!/bin/sh\nexport PYTHONPATH={value}\npython train.py 1.5\n")
    replaced = _run(tmp_path, "sh", "-c", "sh ./replace.sh")  # (the script's name alone: read while it runs)
    kept = _run(tmp_path, "sh", "./keep.sh")
    # THEN the python that ran without the entry is named, with its PYTHONPATH; the other is recorded, unnamed
    assert replaced.returncode == kept.returncode == 1
    assert "python train.py 1.5`) ran with PYTHONPATH=" + str(tmp_path / "src") in replaced.stderr, replaced.stderr
    assert "it was not recorded" in replaced.stderr and "left no ring" in replaced.stderr
    assert "not recorded" not in kept.stderr and "cause: exception" in kept.stderr, kept.stderr
