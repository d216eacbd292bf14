"""The Python children of a `blackbox run` job: which arm, when, and what is said of them.

The job's own process arms at start; any other Python process arms once it has
imported numpy or torch (a short script that never does is not recorded, and
costs what it costs unarmed). A job whose own process is not Python (a shell
loop) is told as such, with the children it recorded. A Python process with no
Python process above it in the job (a shell's) is the job's own work: ``main``,
a full ring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from blackbox._recorder import DEFAULT_CAPACITY
from blackbox.collect import identity
from blackbox.run import bootstrap

ENV = dict(os.environ, PYTHONPATH=str(REPO))


def _run(work: Path, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(work), "--", "sh", "-c", script],
                          capture_output=True, text=True, timeout=600, env=ENV)  # fmt: skip


def _folded(work: Path) -> list[dict]:  # type: ignore[type-arg]
    (run,) = work.glob("run-*")
    path = run / "rings" / "folded.jsonl"
    return [json.loads(line) for line in path.open()] if path.exists() else []


def test_a_shell_job_of_300_short_python_children(tmp_path: Path) -> None:
    # GIVEN a shell loop of 300 short Python children, the last 10 of which import numpy
    py = sys.executable
    loop = f"for i in $(seq 290); do {py} -c pass; done; for i in $(seq 10); do {py} -c 'import numpy'; done"
    proc = _run(tmp_path / "run", loop)
    # THEN the 10 that did array work were armed and recorded (each folded into one line at its clean end),
    # the 290 others ran unarmed, and blackbox run says what happened, not that the job is not Python; each
    # is the shell's, with no Python process above it: the job's own work
    assert proc.returncode == 0, proc.stderr
    folded = _folded(tmp_path / "run")
    assert len(folded) == 10 and {f["role"] for f in folded} == {"main"}, folded
    assert "10 Python processes of the job ended cleanly and were recorded, one line each" in proc.stderr, proc.stderr
    assert "not a Python job" not in proc.stderr


def test_a_shells_python_armed_by_its_import_keeps_its_ring_when_it_is_killed(tmp_path: Path) -> None:
    # GIVEN a shell job whose Python process imports numpy, then dies of SIGKILL; the shell then exits 0
    code = "import os, numpy, blackbox; print(blackbox.active().armed, flush=True); os.kill(os.getpid(), 9)"
    proc = _run(tmp_path / "run", f"{sys.executable} -c '{code}'; exit 0")
    # THEN its ring was kept and recovered: the bundle names its death, told as one the job outlived
    assert proc.returncode == 0 and proc.stdout == "True\n", proc.stderr
    (run,) = (tmp_path / "run").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    assert meta["death"]["cause"] == "killed" and meta["death"]["victim"]["role"] == "main process", meta["death"]
    assert meta["recovery"]["slots"] == DEFAULT_CAPACITY  # the job's own work: a full ring
    assert "exit status 0: the job ended cleanly; a process of it died before: killed;" in proc.stderr
    assert "cause: killed" not in proc.stderr and "**The job exited with status 0**" in proc.stderr


@pytest.mark.parametrize("arms_itself", [False, True])
def test_a_shells_python_that_imports_blackbox_first_is_armed_once_and_its_death_told(
    tmp_path: Path, arms_itself: bool
) -> None:
    # GIVEN a shell job whose Python script imports blackbox before numpy (blackbox's own import loads numpy,
    # the bootstrap's trigger), marks its steps, maybe calls arm() too, and dies of a ValueError at step 7
    arm = "blackbox.arm(); " if arms_itself else ""
    code = (f"import blackbox; {arm}print(blackbox.active().armed, flush=True)\n"
            "for n in range(8):\n    blackbox.step(n)\nraise ValueError('planted at step 7')\n")  # fmt: skip
    (tmp_path / "t.py").write_text(code)
    proc = _run(tmp_path / "run", f"{sys.executable} {tmp_path / 't.py'}; exit $?")
    # THEN it was armed by `blackbox run` once its import was done (before: "not armed (AttributeError: partially
    # initialized module 'blackbox' ...)"), one ring, and the bundle tells its exception at its step
    assert proc.returncode == 1 and proc.stdout == "True\n", proc.stderr
    assert "not armed" not in proc.stderr and "partially initialized" not in proc.stderr, proc.stderr
    (run,) = (tmp_path / "run").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    rings = sorted((run / "rings").glob("*.ring"))
    assert len(rings) == 1 and "rings" not in meta and meta["role"] == "main", rings
    death = meta["death"]
    assert (death["cause"], death["step"]) == ("exception", 7), death
    assert 'The job died of an uncaught ValueError at <module> (t.py:4): "planted at step 7".' in proc.stderr


def test_a_child_that_imports_torch_arms_once_torch_is_imported(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = "import torch, sys, blackbox; print(blackbox.active().armed, 'torch' in sys.modules, flush=True)"
    proc = _run(tmp_path / "run", f'{sys.executable} -c "{code}"')
    assert proc.returncode == 0 and proc.stdout == "True True\n", proc.stderr
    (child,) = _folded(tmp_path / "run")
    assert child["role"] == "main"


@pytest.mark.parametrize(
    "argv,arms_at_start",
    [
        (["python", "-c", "pass"], False),
        (["python", "tool.py", "--x"], False),
        (["python", "-c", "from multiprocessing.spawn import spawn_main", "--multiprocessing-fork"], True),
        (["python", "-m", "multiprocessing.forkserver"], True),
        (["python", "-c", "from multiprocessing.resource_tracker import main"], True),
        (["python", "-m", "torch._inductor.compile_worker", "--workers=4"], True),
    ],
)
def test_who_arms_at_start_is_who_collect_identity_calls_a_helper_other_than_a_child(
    monkeypatch: pytest.MonkeyPatch, argv: list[str], arms_at_start: bool
) -> None:
    # The bootstrap decides with the standard library alone, before blackbox is imported: the same answer
    # as the role the ring will record (a child of the job, under blackbox run, not the launcher's own)
    assert (bootstrap.RUN_PID_ENV, bootstrap.FIRST_PY_ENV) == (identity.RUN_PID_ENV, identity.FIRST_PY_ENV)
    monkeypatch.setenv(identity.RUN_PID_ENV, str(os.getppid() + 1))
    monkeypatch.setenv(identity.FIRST_PY_ENV, str(os.getppid()))  # a Python process of the job above it
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(sys, "orig_argv", argv)
    assert bootstrap.arms_at_start() is arms_at_start
    assert (identity.role() != "child") is arms_at_start
    if not arms_at_start:
        monkeypatch.delenv(identity.FIRST_PY_ENV)  # none above it (a shell's): the job's own, armed on import
        assert not bootstrap.arms_at_start() and identity.role() == "main"
        monkeypatch.setenv(identity.FIRST_PY_ENV, str(os.getpid()))  # as its own start-up set it
        assert identity.role() == "main"
        monkeypatch.setenv("RANK", "3")  # a rank torchrun started is a job's own process
        assert bootstrap.arms_at_start() and identity.role() == "main"


def test_the_signals_held_from_before_blackboxs_import_are_the_ones_it_records() -> None:
    # The bootstrap names them with the standard library alone: held from before numpy loads (its BLAS threads
    # inherit the mask) until the handlers are in, they are the ones arming holds
    from blackbox.collect import signals

    assert bootstrap.HELD == signals.RECORDED


def test_helpers_forked_after_the_main_took_a_sighup_still_fold_when_they_end_cleanly(tmp_path: Path) -> None:
    # GIVEN a job's own process that reloads its config on SIGHUP (it took one), then runs 3 fork workers
    # that end cleanly
    code = ("import multiprocessing as mp, os, signal, time, numpy\n"
            "signal.signal(signal.SIGHUP, lambda s, f: None)\n"
            "os.kill(os.getpid(), signal.SIGHUP); time.sleep(0.2)\n"
            "def work():\n    time.sleep(0.3)\n"
            "ps = [mp.get_context('fork').Process(target=work) for _ in range(3)]\n"
            "[p.start() for p in ps]; [p.join() for p in ps]\n")  # fmt: skip
    (tmp_path / "job.py").write_text(code)
    proc = subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "run"), "--",
                           sys.executable, str(tmp_path / "job.py")], capture_output=True, text=True, timeout=300,
                          env=ENV)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # THEN the workers are folded (the main's SIGHUP, copied into each at fork, once kept each ring as if the
    # worker had been asked to stop), and the main's ring alone is kept
    folded = _folded(tmp_path / "run")
    (run,) = (tmp_path / "run").glob("run-*")
    assert len(folded) == 3 and len(list((run / "rings").glob("*.ring"))) == 1, (folded, proc.stderr)


def test_blackbox_commands_a_job_runs_are_not_armed(tmp_path: Path) -> None:
    # GIVEN a shell job that runs blackbox's own command line (a script that recovers or prunes at its end)
    proc = _run(tmp_path / "run", f"{sys.executable} -m blackbox --help > /dev/null")
    # THEN it is not the job's work: no ring, no folded line, and no "not armed" warning
    assert proc.returncode == 0 and "not armed" not in proc.stderr, proc.stderr
    (run,) = (tmp_path / "run").glob("run-*")
    assert not list((run / "rings").glob("*.ring")) and not _folded(tmp_path / "run"), proc.stderr
