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
import numpy  # (a process below a shell arms at numpy's or torch's import, as a training job's does)
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


def _start(tmp_path: Path, job: Path, name: str, armed: bool, *args: str,
           env: dict[str, str] = ENV) -> subprocess.Popen[str]:  # fmt: skip
    run = [sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / f"runs-{name}"), "--"] if armed else []
    return subprocess.Popen([*run, sys.executable, str(job), str(tmp_path / name), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip


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
    # (in a pod: the kubelet made its termination log, empty)
    job, log = tmp_path / "job.py", tmp_path / "termination-log"
    job.write_text(GRACEFUL)
    log.touch()
    env = dict(ENV, BLACKBOX_TERMINATION_LOG=str(log))
    procs = {name: _start(tmp_path, job, name, name == "armed", "go", env=env) for name in ("unarmed", "armed")}
    _ready(tmp_path, procs)
    for proc in procs.values():
        proc.send_signal(signal.SIGTERM)
    try:  # WHILE it saves, a snapshot of it is in the run's bundle folder, saying it runs still
        bundle = _wait_for_snapshot(tmp_path, "armed")
        assert bundle["cause"] == "unknown" and bundle["death"]["alive"], bundle["death"]  # type: ignore[index]
        # AND the pod's termination message says so (what `kubectl describe pod` shows, SIGKILLed after its grace)
        deadline = time.monotonic() + 30
        while not log.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        said = log.read_text()
        assert said.startswith("blackbox: still running 1 s after SIGTERM from ") and "Snapshot: " in said, said
        assert "is still running" in said, said
    finally:
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
    # AND the termination message is the end's now
    assert log.read_text().startswith("blackbox: clean_exit") and "Bundle: " in log.read_text(), log.read_text()
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


def _group_start(tmp_path: Path, name: str, armed: bool, command: list[str]) -> subprocess.Popen[str]:
    run = [sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path / f"runs-{name}"), "--"] if armed else []
    return subprocess.Popen([*run, *command], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                            start_new_session=True)  # fmt: skip


def _wait_for_snapshot(tmp_path: Path, name: str) -> dict[str, object]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = list((tmp_path / f"runs-{name}").glob("run-*/bundle/metadata.json"))
        if found:
            return dict(json.loads(found[0].read_text()))
        time.sleep(0.05)
    raise AssertionError("no snapshot within 60 s of the SIGTERM")


def test_a_shell_wrapped_job_whose_python_outlives_the_shell_gets_a_snapshot(tmp_path: Path) -> None:
    # GIVEN `bash -c "python job.py ...; exit $?"`, SIGTERM sent to its process group (a terminal's Ctrl-C, timeout):
    # the shell dies of it at once, its python takes it in a handler and saves; armed and unarmed
    job = tmp_path / "job.py"
    job.write_text(GRACEFUL)
    procs = {}
    for name in ("unarmed", "armed"):
        shell = f"{sys.executable} {job} {tmp_path / name} go; exit $?"
        procs[name] = _group_start(tmp_path, name, name == "armed", ["bash", "-c", shell])
    try:
        _ready(tmp_path, procs)
        for proc in procs.values():
            os.killpg(proc.pid, signal.SIGTERM)
        # THEN, the shell gone and its python saving, a snapshot tells that python (it had none: only the job's own
        # process, the shell, was watched)
        snap = _wait_for_snapshot(tmp_path, "armed")
        assert snap["cause"] == "unknown" and snap["death"]["alive"], snap["death"]  # type: ignore[index]
    finally:
        for name in procs:
            (tmp_path / f"{name}.go").touch()
    (out0, err0), (out1, err1) = (p.communicate(timeout=60) for p in procs.values())
    assert procs["unarmed"].returncode == procs["armed"].returncode == -signal.SIGTERM, (err0, err1)
    assert out0 == out1 == "saving\nsaved\n"
    line = next(x for x in err1.splitlines() if "the job still runs 1 s after SIGTERM" in x)
    assert "The main process (pid " in line and "is still running" in line, line


HELPERS_BESIDE = GRACEFUL.replace("stop = []\n", """stop = []
import multiprocessing
helpers = [multiprocessing.get_context("fork").Process(target=time.sleep, args=(3600,), daemon=True) for _ in "ab"]
[h.start() for h in helpers]
""", 1)


def test_a_snapshot_tells_the_main_process_not_a_helper_beside_it(tmp_path: Path) -> None:
    # GIVEN a job with two forked helper processes (SIGTERM ends them) whose main process saves after SIGTERM, sent
    # to the group
    job = tmp_path / "job.py"
    job.write_text(HELPERS_BESIDE)
    proc = _group_start(tmp_path, "armed", True, [sys.executable, str(job), str(tmp_path / "armed"), "go"])
    try:
        _ready(tmp_path, {"armed": proc})
        os.killpg(proc.pid, signal.SIGTERM)
        _wait_for_snapshot(tmp_path, "armed")
        time.sleep(0.5)  # (the line follows the verdict)
    finally:
        (tmp_path / "armed.go").touch()
    out, err = proc.communicate(timeout=60)
    # THEN its line tells the main process, not the first of the helpers the SIGTERM ended (it told a helper)
    line = next(x for x in err.splitlines() if "the job still runs 1 s after SIGTERM" in x)
    assert "The main process (pid " in line and "is still running" in line, line


def test_a_job_with_no_ring_gets_no_snapshot_and_no_error(tmp_path: Path) -> None:
    # GIVEN a job that is no Python (a shell that ignores SIGTERM for 3 s), SIGTERM sent to blackbox run
    proc = _group_start(tmp_path, "armed", True, ["bash", "-c", f"trap '' TERM; touch {tmp_path / 'armed'}; sleep 3"])
    _ready(tmp_path, {"armed": proc})
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    # THEN nothing is said of a snapshot (it said "no snapshot (RingNotFoundError: ...)")
    assert proc.returncode == 0 and "snapshot" not in err and "Error" not in err, err
