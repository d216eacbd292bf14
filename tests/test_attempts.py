"""Second times: a requeued command, a torchrun restart and retention at an explicit path, each recovered
with its attempts apart (each attempt's own first death; the summary leads with the last)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import REPO, run_py, spawn_py

from blackbox.recovery.attempts import deaths, group_attempts, slim
from blackbox.recovery.metadata import bundle_metadata
from blackbox.recovery.pipeline import recover_rings
from blackbox.recovery.timeline import iso_ns
from blackbox.ring.reader import read_ring
from blackbox.ring.retention import YOUNG_S
from blackbox.views.summary import bundle_summary

STEPS = """
import sys, time, blackbox
blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.05)
for step in range(int(sys.argv[2])):
    blackbox.step(step)
    if step == 20:
        print("at 20", flush=True)
    time.sleep(0.01)
"""


def test_a_requeued_command_is_recovered_with_both_attempts(tmp_path: Path) -> None:
    # GIVEN one command run twice at one ring path: SIGKILLed in its first run (a preemption), clean in its second
    ring = tmp_path / "rings" / "train.ring"
    first = spawn_py(STEPS, str(ring), "100000", stdout=subprocess.PIPE)
    assert first.stdout is not None and first.stdout.readline().strip() == "at 20"
    time.sleep(0.2)
    first.kill()
    first.wait()
    run_py(STEPS, str(ring), "30")
    # WHEN the folder is recovered
    meta = recover_rings([ring.parent]).meta
    # THEN both attempts are there, each with its own account, and the job's cause is the last attempt's
    attempts = meta["attempts"]
    assert [a["attempt"] for a in attempts] == [1, 2]
    assert attempts[0]["cause"] == "killed" and attempts[0]["first_death"]["step"] >= 20
    assert attempts[1]["cause"] == "clean_exit" and attempts[1]["last_step"] == 29
    assert meta["cause"] == "clean_exit" and meta["first_death"] is None
    text = bundle_summary(meta)
    assert f"- attempt 1 of 2: killed at step {attempts[0]['first_death']['step']:,}" in text
    assert "attempt 2 of 2 (the last)" in text


TORCHRUN_JOB = """
import os, pathlib, sys, time, blackbox
rank, attempt = int(os.environ["RANK"]), int(os.environ["TORCHELASTIC_RESTART_COUNT"])
blackbox.arm(os.path.join(sys.argv[1], f"rank{rank}.ring"), capacity=4096, sample_interval=0.05)
armed = pathlib.Path(sys.argv[1], f"rank0-attempt{attempt}.armed")
for step in range(40):
    blackbox.step(step)
    if rank == 0 and step == 0:
        armed.touch()  # rank 1 dies only once rank 0 records: under load rank 0 may start seconds later
    if attempt == 0 and rank == 1 and step == 25:
        deadline = time.monotonic() + 240
        while not armed.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), 9)  # rank 1 is killed in the first attempt
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_torchrun_restart_is_recovered_with_both_attempts(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    script, rings = tmp_path / "train.py", tmp_path / "rings"
    script.write_text(TORCHRUN_JOB)
    # GIVEN a torchrun job allowed one restart, whose rank 1 is SIGKILLed in the first attempt (once rank 0
    # records); --standalone: torchrun's store takes a free port itself (a port picked here and released
    # may be taken by another process on a busy machine before torchrun binds it)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "--max-restarts=1",
           str(script), str(rings)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # WHEN its ring folder (the killed attempt's ring kept aside by the second) is recovered
    assert len(list(rings.glob("*.ring"))) == 4
    meta = recover_rings([rings]).meta
    # THEN each attempt has its own first death: rank 1 killed in the first; the second ended cleanly
    attempts = meta["attempts"]
    assert [(a["attempt"], a["launcher_attempt"], a["rings"]) for a in attempts] == [(1, 0, 2), (2, 1, 2)]
    first = attempts[0]["first_death"]
    assert (first["rank"], first["cause"], first["step"]) == (1, "killed", 25)
    assert attempts[1]["cause"] == "clean_exit" and meta["cause"] == "clean_exit"
    assert "- attempt 1 of 2: killed at step 25 (rank 1 on " in bundle_summary(meta)


def test_blackbox_keep_applies_to_an_explicit_ring_path_s_folder(tmp_path: Path) -> None:
    # GIVEN a folder of five dead runs of one command (kept aside as train.N.ring), all older than a rank arming
    folder = tmp_path / "rings"
    for _ in range(5):
        run_py("import sys, blackbox; blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600); "
               "import os; os.kill(os.getpid(), 9)", str(folder / "train.ring"), check=False)  # fmt: skip
    for i, p in enumerate(sorted(folder.glob("*.ring"), key=lambda p: p.stat().st_mtime)):
        t = time.time() - YOUNG_S - 100 + i
        os.utime(p, (t, t))
    ages = {read_ring(p).meta["identity"]["pid"]: p.stat().st_mtime for p in folder.glob("*.ring")}
    assert len(ages) == 5
    # WHEN the command runs again at that path with BLACKBOX_KEEP=count=3
    proc = spawn_py(
        "import sys, blackbox; blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600); print(1, flush=True); "
        "sys.stdin.read()", str(folder / "train.ring"), env={"BLACKBOX_KEEP": "count=3"},
        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "1"
        # THEN the oldest kept-aside attempts went (counted like any ring), and the new run records at the path
        left = {read_ring(p).meta["identity"]["pid"] for p in folder.glob("*.ring")}
        youngest = sorted(ages, key=ages.__getitem__)[-2:]  # the new ring counts as one of the three
        assert left == {proc.pid, *youngest}, (left, ages)
        assert read_ring(folder / "train.ring").meta["identity"]["pid"] == proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def _ring(pid: int, rank: int | None, start: str | None, end: str | None, **more: object) -> dict[str, object]:
    at = "2026-11-23T{}:00.000000Z"
    return {"pid": pid, "rank": rank, "role": "main", "host": "n1", "started_at": start and at.format(start),
            "last_event_at": end and at.format(end), **more}  # fmt: skip


def _pids(groups: list[list[dict[str, object]]]) -> list[list[object]]:
    return [[r["pid"] for r in g] for g in groups]


def test_a_ring_whose_start_is_unknown_joins_an_attempt_and_opens_none() -> None:
    # GIVEN one run of three ranks, and a fourth rank whose start could not be read and which wrote last
    one_run = [_ring(10, 0, "10:00", "10:05"), _ring(11, 1, "10:00", "10:05"), _ring(12, 2, "10:01", "10:04")]
    assert _pids(group_attempts([*one_run, _ring(13, 3, None, "10:06")])) == [[10, 11, 12, 13]]
    # AND two runs (a requeue: rank 0 starts again after its ring ended): an undated ring joins the run that
    # had begun when it last wrote
    requeue = [*one_run, _ring(20, 0, "11:00", "11:05")]
    groups = group_attempts([*requeue, _ring(15, 5, None, "10:03"), _ring(16, 6, None, "12:00"),
                             _ring(17, 7, None, None), _ring(18, 8, None, "09:00")])  # fmt: skip
    assert _pids(groups) == [[10, 11, 12, 15, 18], [20, 16, 17]]


def test_the_launchers_restart_count_and_a_rank_starting_again_open_attempts_timing_alone_never() -> None:
    # GIVEN ranks 0-3 started one after another, each after the one before had ended (as a large job's do)
    staggered = [_ring(10 + r, r, f"10:0{r}", f"10:0{r}") for r in range(4)]
    # AND a DataLoader worker of rank 3 (its rank inherited), started later still
    worker = _ring(30, 3, "10:05", "10:06", role="worker")
    # THEN they are one attempt
    assert _pids(group_attempts([*staggered, worker])) == [[10, 11, 12, 13, 30]]
    # AND rank 2 starting again after its ring ended is a second attempt, which a later worker joins
    again = [*staggered, _ring(22, 2, "10:07", "10:09"), _ring(31, 2, "10:08", "10:09", role="worker")]
    assert _pids(group_attempts(again)) == [[10, 11, 12, 13], [22, 31]]
    # AND the launcher's own count says which attempt a ring is of, whatever the times
    counted = [_ring(40, 0, "10:00", "10:09", attempt=0), _ring(41, 1, "10:01", "10:02", attempt=1),
               _ring(42, 1, "10:03", "10:04", attempt=0)]  # fmt: skip
    assert _pids(group_attempts(counted)) == [[40, 42], [41]]


def test_rings_of_several_jobs_are_grouped_by_job_and_rings_without_an_id_join_the_job_then_running() -> None:
    # GIVEN two jobs whose ranks overlap in time, and a launcher's own ring (no job id) during the second
    jobs = [_ring(1, 0, "10:00", "10:05", job="7001"), _ring(2, 0, "10:01", "10:06", job="7002"),
            _ring(3, 1, "10:02", "10:04", job="7001"), _ring(4, None, "10:05", "10:06", host="n2"),
            _ring(5, None, "11:00", "11:01", host="n2")]  # fmt: skip
    # THEN each job is apart, in the order they started; a ring without an id joins the job running when
    # it started, else the rings without an id are one job of their own
    assert _pids(group_attempts(jobs)) == [[1, 3], [2, 4], [5]]
    meta = bundle_metadata([_full(m) for m in jobs])
    assert meta["jobs"] == 3 and [(a["job"], a["attempt"]) for a in meta["attempts"]] == [
        ("7001", 1), ("7002", 1), (None, 1)]  # fmt: skip


def _full(m: dict[str, Any]) -> dict[str, Any]:
    """A ring's metadata around the few fields grouping takes."""
    return {**m, "recovery": {}, "format_version": 3, "clean": True, "events": 1,
            "death": {"cause": "clean_exit", "time": m["last_event_at"]}}  # fmt: skip


FLEET = REPO / "tools" / "fleet.py"


@pytest.mark.slow
def test_staggered_ranks_of_one_job_are_one_attempt_with_its_real_first_death(tmp_path: Path) -> None:
    # GIVEN 60 ranks of one job on two hosts, started one after another: rank 5 is killed as soon as it is
    # up, then ranks 0-4, then each later rank as soon as it is up (by their times alone, 56 runs in a row)
    proc = subprocess.run(
        [sys.executable, str(FLEET), str(tmp_path / "rings"), "--ranks", "60", "--hosts", "2", "--ring-mib", "1",
         "--victim", "5", "--stagger", *([] if os.geteuid() == 0 else ["--no-unshare"])],
        check=True, capture_output=True, text=True, timeout=600, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    victim = int(re.search(r"rank 5 \(pid (\d+)\) killed first", proc.stdout)[1])  # type: ignore[index]
    # WHEN the folder is recovered
    meta = recover_rings([tmp_path / "rings"]).meta
    # THEN it is one attempt of 60 rings, and its first death is rank 5's
    assert [(a["attempt"], a["rings"]) for a in meta["attempts"]] == [(1, 60)]
    assert (meta["first_death"]["rank"], meta["first_death"]["pid"], meta["cause"]) == (5, victim, "killed")
    assert meta["attempts"][0]["deaths"] == 60
    text = bundle_summary(meta)
    assert "## Attempts" not in text
    assert f"**First death: rank 5 (host {meta['first_death']['host']}, pid {victim})**" in text
    assert "- 60 ranks `killed`" in text and len(text.splitlines()) <= 200


RESTARTED = """
import os, signal, sys
import blackbox
os.environ["RANK"] = "0"
for i in range(int(sys.argv[2])):
    pid = os.fork()
    if pid == 0:
        blackbox.arm(sys.argv[1] + "/", capacity=256, sample_interval=3600)
        blackbox.step(i)
        os.kill(os.getpid(), signal.SIGKILL)
    os.waitpid(pid, 0)
    print(pid, flush=True)
"""


@pytest.mark.slow
def test_hundreds_of_attempts_keep_the_summary_within_200_lines(tmp_path: Path) -> None:
    # GIVEN rank 0 of a job started 250 times, each killed before the next started
    pids = [int(p) for p in run_py(RESTARTED, str(tmp_path), "250", timeout=600).stdout.split()]
    # WHEN the folder is recovered
    meta = recover_rings([tmp_path]).meta
    # THEN each start is an attempt, the account is of the last, and the summary lists the earlier ones
    # within its 200 lines: the first and last few, and how many more
    assert [a["first_death"]["pid"] for a in meta["attempts"]] == pids
    assert meta["first_death"]["pid"] == pids[-1]
    text = bundle_summary(meta)
    assert len(text.splitlines()) <= 200
    assert "This account is of attempt 250 of 250 (the last)." in text
    assert "- attempt 1 of 250: killed at step 0 " in text and "- attempt 249 of 250: killed at step 248 " in text
    assert "- ... and 239 more (metadata.json: attempts)" in text


RANK_OF_A_JOB = """
import sys, time, blackbox
blackbox.arm(sys.argv[1] + "/", capacity=1024, sample_interval=0.05)
print("up", flush=True)
step = 0
while True:
    blackbox.step(step)
    step += 1
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_rings_of_two_jobs_in_one_folder_are_read_as_two_jobs(tmp_path: Path) -> None:
    # GIVEN two Slurm jobs of two ranks each, running at once with one ring folder (the default folder holds
    # every job of a user); job 7001's rank 1 is killed first, then job 7002's rank 0, then the others
    procs = {}
    for job, rank in (("7001", 0), ("7001", 1), ("7002", 0), ("7002", 1)):
        env = {"SLURM_JOB_ID": job, "RANK": str(rank), "WORLD_SIZE": "2"}
        procs[job, rank] = spawn_py(RANK_OF_A_JOB, str(tmp_path), env=env, stdout=subprocess.PIPE)
        assert procs[job, rank].stdout.readline().strip() == "up"  # type: ignore[union-attr]
    for key in (("7001", 1), ("7002", 0), ("7001", 0), ("7002", 1)):
        procs[key].kill()
        procs[key].wait()
        time.sleep(0.2)
    # WHEN the folder is recovered
    meta = recover_rings([tmp_path]).meta
    # THEN the rings are two jobs, each with its own first death; the account is of the job that started last
    assert meta["first_death"]["pid"] == procs["7002", 0].pid
    attempts = [(a.get("job"), a["attempt"], a["rings"], a["first_death"]["pid"]) for a in meta["attempts"]]
    assert attempts == [("7001", 1, 2, procs["7001", 1].pid), ("7002", 1, 2, procs["7002", 0].pid)]
    assert meta["jobs"] == 2
    text = bundle_summary(meta)
    assert "These rings are of 2 jobs. This account is of the job that started last, job `7002`" in text
    assert "- job `7001`, attempt 1 of 1: killed at step " in text


ARM = "import sys, blackbox; blackbox.arm(sys.argv[1], capacity=64, sample_interval=3600)"
JOB_ENVS = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "BLACKBOX_RUN_ID", "RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@pytest.mark.parametrize(
    ("env", "job"),
    [
        ({"SLURM_JOB_ID": "123", "TORCHELASTIC_RUN_ID": "abc", "BLACKBOX_RUN_ID": "run-x"}, "123"),
        ({"TORCHELASTIC_RUN_ID": "abc", "BLACKBOX_RUN_ID": "run-x", "RANK": "0"}, "abc"),
        ({"TORCHELASTIC_RUN_ID": "none", "BLACKBOX_RUN_ID": "run-x", "RANK": "0"}, None),  # torchrun's default
        ({"BLACKBOX_RUN_ID": "run-x"}, "run-x"),
        ({"BLACKBOX_RUN_ID": "run-x", "OMPI_COMM_WORLD_RANK": "3"}, None),  # one `blackbox run` per rank
        ({}, None),
    ],
)
def test_a_ring_records_the_id_of_its_job(tmp_path: Path, env: dict[str, str], job: str | None) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in JOB_ENVS}
    ring = tmp_path / "r.ring"
    subprocess.run([sys.executable, "-c", ARM, str(ring)], check=True, timeout=60,
                   env={**clean, "PYTHONPATH": str(REPO), **env})  # fmt: skip
    assert read_ring(ring).meta["identity"]["job"] == job


def test_blackbox_run_gives_its_job_the_run_folders_name_as_job_id(tmp_path: Path) -> None:
    clean = {k: v for k, v in os.environ.items() if k not in JOB_ENVS}
    subprocess.run([sys.executable, "-m", "blackbox", "run", "--dir", str(tmp_path), "--quiet", "--", sys.executable,
                    "-c", "pass"], check=True, timeout=120, env={**clean, "PYTHONPATH": str(REPO)})  # fmt: skip
    (run,) = tmp_path.glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    assert meta["job"] == run.name and meta["attempts"][0]["job"] == run.name


LAUNCHER = """
import os, subprocess, sys, blackbox
blackbox.arm(sys.argv[1] + "/", capacity=4096, sample_interval=0.05)
rank = subprocess.Popen([sys.executable, "-c", sys.argv[2], sys.argv[1]],
                        env=dict(os.environ, RANK="1", LOCAL_RANK="1", WORLD_SIZE="2"))
print(rank.pid, flush=True)
status = rank.wait()
raise RuntimeError(f"rank 1 failed with {status}")  # as torchrun's agent: ChildFailedError, uncaught, exit 1
"""
LEAKING_RANK = """
import sys, time, blackbox
blackbox.arm(sys.argv[1] + "/", capacity=4096, sample_interval=0.05)
kept = []
for step in range(100000):
    blackbox.step(step)
    kept.append(b"\\x01" * (4 << 20))
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_a_ranks_kernel_oom_kill_is_the_first_death_not_its_launchers_reading_of_it(
    tmp_path: Path,
    memory_cgroup: Any,
) -> None:
    # GIVEN a launcher (its own process armed, no rank, as torchrun's agent under `blackbox run`) whose rank 1
    # leaks until the kernel's OOM killer kills it in their memory cgroup; the launcher then exits 1
    cg = memory_cgroup(256 << 20)
    kills = cg.oom_kills()
    rings = tmp_path / "rings"
    proc = spawn_py(LAUNCHER, str(rings), LEAKING_RANK, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    preexec_fn=cg.join)  # fmt: skip
    out, err = proc.communicate(timeout=120)
    rank_pid = int(out.split()[0])
    assert proc.returncode == 1 and cg.oom_kills() == kills + 1, err[-2000:]
    # WHEN the rings are recovered: both tell of the one kill, the rank's ring of its own death, the launcher's
    # of its child's, each converting the kernel's one stamp with its own clock pair
    meta = recover_rings([rings]).meta
    by_pid = {m["pid"]: m for m in meta["rings"]}
    launcher = next(m for pid, m in by_pid.items() if pid != rank_pid)
    assert by_pid[rank_pid]["death"]["cause"] == "host_oom_kill"
    # THEN the launcher's ring, which read the kill as its child's, tells its own end after it (its RuntimeError)
    assert launcher["death"]["cause"] == "exception" and launcher["death"]["victim"]["pid"] == launcher["pid"]
    assert any("RuntimeError: rank 1 failed" in e for e in launcher["death"]["evidence"]), launcher["death"]
    assert launcher["death"]["after"]["pid"] == rank_pid, launcher["death"]
    # AND the first death is rank 1's, from its own ring (its step, its role)
    first = meta["first_death"]
    assert (first["pid"], first["rank"], first["victim"]["role"]) == (rank_pid, 1, "main process"), first
    assert first["step"] is not None
    # AND a ring telling a child's kill (as one whose child's ring is not read would) is never the first death,
    # whichever way the two clocks round the stamp: the launcher's reading made the earlier
    slims = [slim(m) for m in meta["rings"]]
    own = next(m for m in slims if m["pid"] == rank_pid)
    other = next(m for m in slims if m["pid"] != rank_pid)
    other["death"].update(cause="host_oom_kill", victim={"pid": rank_pid})
    other["death"]["time"] = iso_ns(int(np.datetime64(own["death"]["time"].rstrip("Z"), "ns").astype(np.int64)) - 1)
    assert deaths(slims)[0] is own


def _dead(pid: int, rank: int | None, cause: str, at_ms: int, ppid: int = 50, **death: Any) -> dict[str, Any]:
    """A ring's slim metadata for deaths(): died ``at_ms`` after 12:00:00 on host h."""
    return {"rank": rank, "host": "h", "pid": pid, "ppid": ppid,
            "death": {"cause": cause, "time": f"2026-01-01T12:00:00.{at_ms:03d}000Z", **death}}  # fmt: skip


def test_a_starved_rank_killed_first_is_not_displaced_by_the_teardown_it_caused() -> None:
    # GIVEN torchrun's agent (pid 50) whose rank 1 was SIGKILLed while starved of CPU (its last record at .100,
    # its death up to 0.5 s later); rank 0 then raised gloo's "Connection reset by peer", the agent raised
    # (a child failed) and stopped rank 2 with SIGTERM: every one of those within rank 1's window
    sigterm = {"signal": "SIGTERM", "sender": "pt_elastic", "sender_pid": 50, "time": "2026-01-01T12:00:00.250000Z"}
    rings = [
        _dead(10, 0, "exception", 130, peer_lost="Connection reset by peer"),
        _dead(11, 1, "killed", 100, time_error_s=0.5, starved={"late_s": 0.3, "interval_s": 0.1}),
        _dead(12, 2, "signal", 250, killed_by=sigterm),
        _dead(50, None, "exception", 400, ppid=1) | {"raised": "ChildFailedError"},
    ]
    # WHEN the attempt's deaths are ordered
    first, collateral, _ = deaths(rings)
    # THEN rank 1 died first: a launcher's teardown and the launcher's own end came after a death, never before
    assert first is not None and first["rank"] == 1, first
    # AND rank 2, stopped by torchrun, rank 0, dead of its peer's loss, and the agent's exception, its report of
    # rank 1's death, are collateral of it, not deaths
    assert [m["rank"] for m in collateral] == [2, 0, None]
    assert collateral[1]["death"]["collateral_of"] == {"rank": 1, "host": "h", "pid": 11, "by": None,
                                                       "lost_peer": True}  # fmt: skip
    assert collateral[2]["death"]["collateral_of"] == {"rank": 1, "host": "h", "pid": 11, "by": None,
                                                       "reported": True}  # fmt: skip


@pytest.mark.parametrize(("raised", "role", "reported"), [
    ("ChildFailedError", None, True), ("ProcessRaisedException", "main process", True),
    ("CalledProcessError", "accelerate launcher", True), ("CalledProcessError", "main process", False),
    ("KeyError", "torchrun agent", False), ("KeyError", "main process", False),
])  # fmt: skip
def test_a_launchers_end_is_its_report_of_a_death_only_by_the_exception_launchers_raise_for_it(
    raised: str, role: str | None, reported: bool
) -> None:
    # GIVEN rank 1 dead at .100, then the process that started it (pid 50) dead of an uncaught exception at .300
    rings = [_dead(11, 1, "killed", 100),
             _dead(50, None, "exception", 300, ppid=1, victim={"pid": 50, "role": role}) | {"raised": raised}]
    first, collateral, _ = deaths(rings)
    # THEN a launcher's exception for a failed child is its report of rank 1's death, collateral; its own bug (a
    # KeyError in a script that started ranks with subprocess) is a death of its own
    assert first is not None and first["rank"] == 1
    assert [m["pid"] for m in collateral] == ([50] if reported else []), collateral


def test_a_rank_killed_while_it_shut_down_is_not_the_first_death_before_a_rank_that_failed() -> None:
    # GIVEN an attempt of 3 ranks where rank 2 exited with status 3 at .300 (sys.exit(3)); rank 1 had ended its
    # work (its clean end at .100, exit handlers run) and then, while it shut down, was killed with no record of
    # it (torchrun's teardown SIGTERMs it after its handlers were put back): the field matrix, nanoGPT exit3
    rings = [
        _dead(11, 1, "killed", 100, in_shutdown=True),
        _dead(12, 2, "nonzero_exit", 300),
    ]
    # THEN rank 2 is the first death: rank 1's time is only when it began to shut down
    first, _, _ = deaths(rings)
    assert first is not None and first["rank"] == 2, first
    # AND alone, a death while it shut down is the first death all the same
    first, _, _ = deaths(rings[:1])
    assert first is not None and first["rank"] == 1, first


def test_workers_sigkilled_with_their_parent_leave_the_parent_as_the_first_death() -> None:
    # GIVEN a job's main process (pid 10) and its two DataLoader workers (11, 12), SIGKILLed in one kill (the
    # group's, a container's end): the workers' last records came 72 and 29 ms before the main process's, each
    # within the time its death may lie after its last record (106 ms)
    rings = [
        _dead(10, None, "killed", 172, ppid=1, time_error_s=0.021),
        _dead(11, None, "killed", 100, ppid=10, time_error_s=0.106),
        _dead(12, None, "killed", 143, ppid=10, time_error_s=0.106),
    ]
    # WHEN the attempt's deaths are ordered
    first, _, _ = deaths(rings)
    # THEN the first death told is the main process's: a parent that outlived its worker would have noticed
    assert first is not None and first["pid"] == 10, first
    # AND a worker killed longer before its parent's kill than its death can lie after its last record died first
    rings[1]["death"]["time_error_s"] = 0.05
    rings[2]["death"]["time_error_s"] = 0.02
    first, _, _ = deaths(rings)
    assert first is not None and first["pid"] == 11, first
    # AND so does a worker killed whose parent then died otherwise (it raised: "worker killed by signal")
    rings[1]["death"]["time_error_s"] = rings[2]["death"]["time_error_s"] = 0.106
    rings[0]["death"]["cause"] = "exception"
    first, _, _ = deaths(rings)
    assert first is not None and first["pid"] == 11, first
    # AND a rank SIGKILLed with torchrun's agent, its parent (no rank of its own), stays the first death
    ranks = [_dead(50, None, "killed", 172, ppid=1, time_error_s=0.021),
             _dead(11, 0, "killed", 100, time_error_s=0.106)]  # fmt: skip
    first, _, _ = deaths(ranks)
    assert first is not None and first["pid"] == 11, first


GROUP_JOB = """
import multiprocessing as mp, os, sys, time
def work():
    while True:
        sum(range(1000))
        time.sleep(0.001)
if __name__ == "__main__":
    ctx = mp.get_context("fork")
    workers = [ctx.Process(target=work) for _ in range(3)]
    for w in workers:
        w.start()
    open(sys.argv[1], "w").write(str(os.getpid()))
    work()
"""


@pytest.mark.slow
def test_a_group_sigkill_of_a_job_and_its_workers_is_told_as_the_jobs_death(tmp_path: Path) -> None:
    # GIVEN a job under `blackbox run` whose main process forked three workers, every process armed
    (tmp_path / "job.py").write_text(GROUP_JOB)
    up = tmp_path / "up"
    proc = subprocess.Popen([sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "run"), "--",
                             sys.executable, str(tmp_path / "job.py"), str(up)], env=dict(os.environ,
                            PYTHONPATH=str(REPO)), start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 60
    while not (up.exists() and up.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)
    # WHEN the whole group is SIGKILLed at once (`kill -KILL -PGID`, a scheduler's end), blackbox run with it
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    rings = next((tmp_path / "run").glob("run-*/rings"))
    meta = recover_rings([rings]).meta
    # THEN the first death is the job's own process, its workers' deaths told as that close to it
    assert len(list(rings.glob("*.ring"))) == 4
    first = meta["first_death"]
    assert first["pid"] == int(up.read_text()) and first["cause"] == "killed", first
    assert "4 processes `killed`" in bundle_summary(meta)


@pytest.mark.slow
def test_a_process_still_running_is_no_first_death_where_an_earlier_one_died(tmp_path: Path) -> None:
    # GIVEN a ring folder holding a process SIGKILLed, then another armed later and still running (two notebook
    # kernels, one after the other, in one folder): it was told "First death: pid N ... `unknown` ... still running"
    rings = tmp_path / "rings"
    killed = run_py("import os, signal, sys, time, blackbox\nblackbox.arm(sys.argv[1])\ntime.sleep(0.3)\n"
                    "os.kill(os.getpid(), signal.SIGKILL)\n", f"{rings}/", check=False)  # fmt: skip
    assert killed.returncode == -signal.SIGKILL
    live = spawn_py("import sys, time, blackbox\nblackbox.arm(sys.argv[1])\nprint('armed', flush=True)\n"
                    "time.sleep(60)\n", f"{rings}/", stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == "armed"
        meta = recover_rings([rings]).meta
    finally:
        live.kill()
        live.communicate()
    summary = bundle_summary(meta)
    # THEN the one still running is said to be running, no death; the death is the earlier attempt's
    assert f"**No death: pid {live.pid} on host " in summary and "is still running**" in summary, summary[:2000]
    assert "First death: pid" not in summary, summary[:2000]
    assert re.search(r"- attempt 1 of 2: killed at step - \(pid \d+ on ", summary), summary[:2000]


def _node(job: str, ranks: range, world: int, start: str, end: str, pid: int) -> list[dict[str, Any]]:
    """One node's rings of a torchrun job under its own `blackbox run`: its ranks, each with its run's id."""
    return [{"job": job, "host": f"node-{job}", "pid": pid + r, "ppid": pid, "rank": r, "world_size": world,
             "role": "main", "started_at": start, "last_event_at": end,
             "death": {"cause": "signal", "time": end}} for r in ranks]  # fmt: skip


def test_the_nodes_of_one_world_each_under_its_own_blackbox_run_are_one_job() -> None:
    # GIVEN two nodes of one torchrun job (world of 4), each under `blackbox run`, so each node's rings carry its
    # run's id (a red team's two-node job read "These rings are of 2 jobs", the stuck rank under "earlier attempts")
    a = "2026-12-02T00:00:00.000000Z", "2026-12-02T00:01:00.000000Z"
    b = "2026-12-02T00:00:01.500000Z", "2026-12-02T00:01:00.300000Z"
    node0, node1 = _node("run-a", range(0, 2), 4, *a, 100), _node("run-b", range(2, 4), 4, *b, 200)
    (job,) = group_attempts([*node0, *node1])
    assert sorted(m["rank"] for m in job) == [0, 1, 2, 3]


def test_nodes_are_one_world_only_where_their_ranks_make_exactly_one_running_at_once() -> None:
    a = "2026-12-02T00:00:00.000000Z", "2026-12-02T00:01:00.000000Z"
    later = "2026-12-02T00:02:00.000000Z", "2026-12-02T00:03:00.000000Z"
    # two worlds of 4 at once on two nodes (a rank in two jobs): four jobs, as recorded
    four = [*_node("A0", range(0, 2), 4, *a, 100), *_node("A1", range(2, 4), 4, *a, 200),
            *_node("B0", range(0, 2), 4, *a, 300), *_node("B1", range(2, 4), 4, *a, 400)]  # fmt: skip
    assert len(group_attempts(four)) == 4
    # one node's ranks alone, rank 3 missing: not all of the world
    assert len(group_attempts([*_node("A0", range(0, 2), 4, *a, 100), *_node("A1", range(2, 3), 4, *a, 200)])) == 2
    # the other node's ranks an hour later: not at once
    assert len(group_attempts([*_node("A0", range(0, 2), 4, *a, 100), *_node("A1", range(2, 4), 4, *later, 200)])) == 2
    # a world of another size
    assert len(group_attempts([*_node("A0", range(0, 2), 4, *a, 100), *_node("A1", range(2, 4), 8, *a, 200)])) == 2
    # a world size a bundle made up (2**31 - 1: a job-wide account reads bundles as untrusted), in bounded time
    # and memory: never a set of its ranks
    import tracemalloc

    tracemalloc.start()
    huge = (1 << 31) - 1
    assert len(group_attempts([*_node("A0", range(0, 2), huge, *a, 100), *_node("A1", range(2, 4), huge, *a, 200)
                               ])) == 2  # fmt: skip
    assert tracemalloc.get_traced_memory()[1] < 16 << 20
    tracemalloc.stop()
