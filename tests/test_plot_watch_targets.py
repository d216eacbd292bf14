"""`blackbox plot` and `blackbox watch` take the folders `blackbox summary` takes: a `blackbox run`
folder, its rings/ and bundle/, a folder of run folders; watch follows a folder's live rings."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, run_py

from blackbox.cli import main
from blackbox.views.plot import PLOT_ALL_UP_TO

ENV = dict(os.environ, PYTHONPATH=str(REPO))
DIES = "import os, time; time.sleep(0.3); os.kill(os.getpid(), 9)"
# The job and a child it starts, both armed by `blackbox run`, both alive until the file named exists.
TWO_PROCESSES = """
import os, subprocess, sys, time
wait = "import os, sys, time, numpy\\nwhile not os.path.exists(sys.argv[1]): time.sleep(0.05)"  # numpy: a child arms
child = subprocess.Popen([sys.executable, "-c", wait, sys.argv[1]])
exec(wait)
child.wait()
"""


def _blackbox_run(folder: Path, *code: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "blackbox", "run", "--dir", str(folder), "--quiet", "--", sys.executable, "-c"]
    return subprocess.run([*command, *code], capture_output=True, text=True, env=ENV, timeout=120)


def _one_error_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("blackbox: error: "), err
    return err


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A `blackbox run` folder of a job SIGKILLed (rings/, bundle/), alone in its --dir."""
    runs = tmp_path_factory.mktemp("runs")
    assert _blackbox_run(runs, DIES).returncode == -9  # it ends as its job ended
    (run,) = runs.glob("run-*")
    return run


def test_plot_draws_what_summary_describes(
    run_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "m.png"
    pytest.importorskip("matplotlib", reason="plot draws only where matplotlib is installed")
    # a run folder, which summary reads as its bundle: the picture of that bundle
    assert main(["summary", str(run_folder)]) == 0
    capsys.readouterr()
    assert main(["plot", str(run_folder), "-o", str(png)]) == 0
    assert capsys.readouterr().out == f"wrote {png} (the bundle {run_folder / 'bundle'})\n"
    assert png.read_bytes()[:4] == b"\x89PNG"
    # its rings, recovered in memory; its bundle; the folder of run folders (the bundle with the first death)
    assert main(["plot", str(run_folder / "rings"), "-o", str(png)]) == 0
    assert "1 ring recovered in memory" in capsys.readouterr().out
    assert main(["plot", str(run_folder / "bundle"), "-o", str(png)]) == 0
    assert main(["plot", str(run_folder.parent), "-o", str(png)]) == 0
    assert f"(the bundle {run_folder / 'bundle'})" in capsys.readouterr().out
    # a run folder whose job still runs (rings/, no bundle/ yet): its rings
    live = tmp_path / "run-live"
    shutil.copytree(run_folder / "rings", live / "rings")
    assert main(["plot", str(live), "-o", str(png)]) == 0
    assert f"1 ring in {live / 'rings'}: no bundle yet" in capsys.readouterr().out


MANY_RANKS = """
import os, signal, sys, time, blackbox
children = []
for rank in range(int(sys.argv[2])):  # one job of that many ranks, all running at once
    pid = os.fork()
    if pid == 0:
        os.environ["RANK"] = str(rank)
        rec = blackbox.Recorder.arm(os.path.join(sys.argv[1], f"r{rank}.ring"), capacity=256, sample_interval=3600)
        time.sleep(1.0 if rank == 7 else 2.0)
        if rank == 7:
            os.kill(os.getpid(), signal.SIGKILL)
        rec.disarm()
        os._exit(0)
    children.append(pid)
for pid in children:
    os.waitpid(pid, 0)
"""


def test_plot_of_many_rings_draws_the_first_death_as_the_bundle_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib", reason="plot draws only where matplotlib is installed")
    # GIVEN the rings of more ranks than a picture draws together, rank 7 SIGKILLed
    ranks = PLOT_ALL_UP_TO + 2
    rings = tmp_path / "rings"
    rings.mkdir()
    run_py(MANY_RANKS, str(rings), str(ranks))
    (killed,) = [json.loads(line)["pid"] for line in _ring_identities(rings) if json.loads(line)["rank"] == 7]
    # WHEN they are plotted
    assert main(["plot", str(rings), "-o", str(tmp_path / "m.png")]) == 0
    # THEN, as in a bundle's memory.png, the first death's process alone is drawn, and the command says so
    assert f"{ranks} rings recovered in memory; of {ranks} processes, pid {killed} on " in capsys.readouterr().out


def _ring_identities(rings: Path) -> list[str]:
    from blackbox.ring.reader import find_rings, read_header

    return [json.dumps(read_header(p).meta["identity"]) for p in find_rings([rings])]


def test_plot_of_a_job_wide_bundle_names_the_node_bundle_to_plot(
    run_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job"
    assert main(["recover", str(run_folder / "bundle"), "-o", str(job)]) == 0
    capsys.readouterr()
    assert main(["plot", str(job), "-o", str(tmp_path / "m.png")]) == 1
    err = _one_error_line(capsys.readouterr().err)
    assert f"{job}: expected a bundle with a timeline.parquet, found a job-wide bundle" in err
    assert f"blackbox plot {run_folder / 'bundle'}" in err
    assert not (tmp_path / "m.png").exists()


def test_watch_follows_the_live_rings_of_a_run_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # GIVEN a job of two armed processes under `blackbox run`, running
    stop = tmp_path / "stop"
    job = subprocess.Popen([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "runs"), "--quiet", "--",
                            sys.executable, "-c", TWO_PROCESSES, str(stop)], env=ENV,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list((tmp_path / "runs").glob("run-*/rings/*.ring"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        (run,) = (tmp_path / "runs").glob("run-*")
        rings = sorted(p.name for p in (run / "rings").glob("*.ring"))
        assert len(rings) == 2
        # WHEN its run folder is watched
        assert main(["watch", str(run), "--once"]) == 0
        out = capsys.readouterr().out
        # THEN the frame says which rings it follows, and gives each one's lines
        assert out.startswith(f"blackbox watch  {run / 'rings'}: following 2 live rings (of 2)\n")
        assert all(f"== {name}\n" in out for name in rings) and out.count("[running]") == 2
        assert "rank None" not in out and "host RSS" in out
    finally:
        stop.touch()
        assert job.wait(timeout=60) == 0
    # once the job has ended, watch shows how its rings ended and returns by itself
    assert main(["watch", str(run), "--interval", "0.1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"blackbox watch  {run / 'rings'}: no live ring (of ") and "[running]" not in out
    # a bundle is no ring: one line, naming what reads it
    assert main(["watch", str(run / "bundle")]) == 1
    err = _one_error_line(capsys.readouterr().err)
    expected = "expected a ring file, a folder of rings or a `blackbox run` folder, found a bundle"
    assert f"{run / 'bundle'}: {expected}" in err
