"""`blackbox run`'s snapshot of a job that outlives the signal sent to end it (run/snapshot.py): written while
the job still runs, replaced by the bundle of its end, and never one of the job's processes. Each job is run
armed and unarmed, side by side: the same exit status and output."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "tools"))
from cgroup_util import CgroupRefused, child_memory_cgroup, join  # noqa: E402

ENV = dict(os.environ, PYTHONPATH=str(REPO))

GRACEFUL = """\
import os, signal, sys, time
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
open(sys.argv[1], "w").close()
while not stop:
    time.sleep(0.01)
print("saving", flush=True)
if sys.argv[2] == "go":  # saving until told (the snapshot's writer waits for an idle core: a loaded machine may
    while not os.path.exists(sys.argv[1] + ".go"):  # have none for seconds)
        time.sleep(0.01)
else:
    time.sleep(float(sys.argv[2]))  # the checkpoint its handler's flag leads to
print("saved", flush=True)
"""


def _start(tmp_path: Path, job: Path, name: str, armed: bool, *args: str) -> subprocess.Popen[str]:
    run = [sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / f"runs-{name}"), "--"] if armed else []
    return subprocess.Popen([*run, sys.executable, str(job), str(tmp_path / name), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=ENV)  # fmt: skip


def _ready(tmp_path: Path, procs: dict[str, subprocess.Popen[str]]) -> None:
    deadline = time.monotonic() + 60
    while not all((tmp_path / name).exists() for name in procs) and time.monotonic() < deadline:
        assert all(p.poll() is None for p in procs.values())
        time.sleep(0.05)


def _run_folder(tmp_path: Path, name: str) -> Path:
    (folder,) = (tmp_path / f"runs-{name}").glob("run-*")
    return folder


def test_a_job_saving_after_sigterm_gets_a_snapshot_then_the_bundle_of_its_end(tmp_path: Path) -> None:
    # GIVEN a job whose SIGTERM handler leads to a save before a clean exit, SIGTERM sent to `blackbox run`'s pid
    # alone (Kubernetes: the container's first process), which passes it on; the same job unarmed
    job = tmp_path / "job.py"
    job.write_text(GRACEFUL)
    procs = {name: _start(tmp_path, job, name, name == "armed", "go") for name in ("unarmed", "armed")}
    _ready(tmp_path, procs)
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
    said_at = time.monotonic()
    # WHILE it saves, a snapshot of it is in the run's bundle folder, saying it runs still
    bundle = None
    while time.monotonic() - said_at < 60 and bundle is None:
        found = list((tmp_path / "runs-armed").glob("run-*/bundle/metadata.json"))
        bundle = json.loads(found[0].read_text()) if found else None
        time.sleep(0.05)
    assert bundle is not None, "no snapshot within 60 s of the SIGTERM"
    assert bundle["cause"] == "unknown" and bundle["death"]["alive"], bundle["death"]
    for name in procs:
        (tmp_path / f"{name}.go").touch()
    # THEN it ends as unarmed: status 0, the same output
    (out0, err0), (out1, err1) = (p.communicate(timeout=60) for p in procs.values())
    assert procs["unarmed"].returncode == procs["armed"].returncode == 0, err1
    assert out0 == out1 == "saving\nsaved\n"
    # AND the snapshot was said on stderr, then the end: the bundle of the end replaced the snapshot
    lines = [line for line in err1.splitlines() if line.startswith("blackbox run: ")]
    snap = next(i for i, line in enumerate(lines) if "the job still runs 1 s after SIGTERM from " in line)
    assert "A snapshot is in " in lines[snap] and "is still running" in lines[snap], lines[snap]
    end = next(i for i, line in enumerate(lines) if line.startswith("blackbox run: exit status 0; cause: clean_exit"))
    assert snap < end, lines
    folder = _run_folder(tmp_path, "armed")
    meta = json.loads((folder / "bundle" / "metadata.json").read_text())
    assert meta["cause"] == "clean_exit" and not meta["death"].get("alive"), meta["death"]
    # AND the snapshot's writer was never one of the job's: not named as left running, no holder left beside it
    assert "still running after it ended" not in err1 and "left_running" not in meta, err1
    assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") and any(p.iterdir())) == []


def test_a_job_that_ends_at_its_sigterm_gets_no_snapshot(tmp_path: Path) -> None:
    # GIVEN a job that takes SIGTERM as most do (its default action: it dies at once), and one whose handler saves
    # for 0.2 s, each under `blackbox run`, SIGTERM sent to `blackbox run`
    job = tmp_path / "job.py"
    job.write_text(GRACEFUL.replace("signal.signal(", "0 and signal.signal(", 1))
    quick = tmp_path / "quick.py"
    quick.write_text(GRACEFUL)
    procs = {"dies": _start(tmp_path, job, "dies", True, "0"), "quick": _start(tmp_path, quick, "quick", True, "0.2")}
    _ready(tmp_path, procs)
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
    (_, err0), (_, err1) = (p.communicate(timeout=60) for p in procs.values())
    # THEN each ends as it would (killed by SIGTERM; status 0), and neither was snapshotted
    assert procs["dies"].returncode == -signal.SIGTERM and procs["quick"].returncode == 0, (err0, err1)
    assert "the job still runs" not in err0 + err1, (err0, err1)
    assert "cause: signal" in err0 and "cause: clean_exit" in err1, (err0, err1)


def test_a_job_ending_while_its_snapshot_is_written_gets_the_bundle_of_its_end(tmp_path: Path) -> None:
    # GIVEN a job whose save after SIGTERM lasts a little longer than blackbox run waits before its snapshot: the
    # job ends while the snapshot is being written
    job = tmp_path / "job.py"
    job.write_text(GRACEFUL)
    procs = {"armed": _start(tmp_path, job, "armed", True, "1.15")}
    _ready(tmp_path, procs)
    procs["armed"].send_signal(signal.SIGTERM)
    out, err = procs["armed"].communicate(timeout=60)
    # THEN the bundle is the end's (the snapshot's writer killed as the job ended, never put in its place after)
    assert procs["armed"].returncode == 0 and out == "saving\nsaved\n", err
    folder = _run_folder(tmp_path, "armed")
    time.sleep(1.0)  # a writer left running would put its snapshot in place by now
    meta = json.loads((folder / "bundle" / "metadata.json").read_text())
    assert meta["cause"] == "clean_exit" and not meta["death"].get("alive"), meta["death"]
    assert sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") and any(p.iterdir())) == []


def test_a_job_near_its_memory_limit_gets_no_snapshot_and_is_told_why(tmp_path: Path) -> None:
    # GIVEN a job holding 300 MiB in a memory cgroup of 600 MiB (less than MIN_ROOM left), saving for 2 s after SIGTERM
    job = tmp_path / "job.py"
    first = "import os, signal, sys, time"
    job.write_text(GRACEFUL.replace(first, f"{first}\nheld = bytearray(300 << 20)\nheld[::4096] = b'x' * (300 << 8)"))
    try:
        with child_memory_cgroup(600 << 20, "snapshot-room") as (cg, _):
            run = [sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / "runs"), "--"]
            proc = subprocess.Popen([*run, sys.executable, str(job), str(tmp_path / "ready"), "2"], env=ENV,
                                    text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    preexec_fn=lambda: join(cg))  # fmt: skip
            _ready(tmp_path, {"ready": proc})
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
    except CgroupRefused as exc:
        pytest.skip(str(exc))
    # THEN it ends as it would, with no snapshot, and says why: the room left under the cgroup's limit
    assert proc.returncode == 0 and out == "saving\nsaved\n", err
    assert "the job still runs 1 s after SIGTERM from " in err and "; no snapshot: " in err, err
    assert "left under its cgroup's memory limit of 600.0 MiB, which reading its rings could take" in err, err
    assert "A snapshot is in" not in err and "cause: clean_exit" in err, err
