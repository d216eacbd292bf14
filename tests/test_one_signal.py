"""One signal to many processes (``timeout``'s SIGTERM to its process group, a terminal's Ctrl-C, Slurm's signal to
every task): the job's topmost process is the death told, the others ended with it (attempts._one_signal), not
whichever process the kernel happened to reach first."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from blackbox.recovery.attempts import deaths

T = "2026-01-01T00:00:{:09.6f}Z"


def _ring(pid: int, ppid: int, at: float, *, rank: int | None = None, role: str = "main", sender: str = "timeout",
          sender_pid: int = 9, sig: str = "SIGTERM", cause: str = "signal") -> dict[str, Any]:  # fmt: skip
    killer = {"signal": sig, "sender": sender, "sender_pid": sender_pid, "time": T.format(at)}
    return {"rank": rank, "host": "h", "pid": pid, "ppid": ppid, "role": role,
            "death": {"cause": cause, "time": T.format(at), "killed_by": killer}}  # fmt: skip


def test_a_group_signal_that_reached_the_workers_first_tells_the_main_process() -> None:
    # GIVEN `timeout`'s SIGTERM to the job's group: its two DataLoader workers recorded it 0.4 ms before the main
    main, w1, w2 = _ring(10, 9, 1.0004), _ring(11, 10, 1.0, role="worker"), _ring(12, 10, 1.0001, role="worker")
    # WHEN the attempt's deaths are read
    first, collateral, hang = deaths([w1, main, w2])
    # THEN the main process is the death told (it read "The DataLoader worker (pid 11) was ended by SIGTERM")
    assert first is main and hang is None
    assert {m["pid"] for m in collateral} == {11, 12}
    for m in collateral:
        assert m["death"]["collateral_of"] == {"rank": None, "host": "h", "pid": 10, "by": "timeout",
                                               "same_signal": "SIGTERM"}  # fmt: skip


def test_spawned_ranks_ended_with_their_parent_by_one_signal_are_not_deaths_of_their_own() -> None:
    # GIVEN an mp.spawn job: ranks 0 and 1 under the main process, one SIGINT from the terminal (pid 0) to all
    ranks = [_ring(20 + r, 10, 2.0 + r / 1e4, rank=r, role="worker", sender="the kernel", sender_pid=0, sig="SIGINT")
             for r in range(2)]  # fmt: skip
    main = _ring(10, 9, 2.001, sender="the kernel", sender_pid=0, sig="SIGINT", cause="interrupted")
    first, collateral, _ = deaths([*ranks, main])
    assert first is main and {m["rank"] for m in collateral} == {0, 1}


def test_siblings_ended_by_one_signal_are_told_as_the_first_and_the_others_with_it() -> None:
    # GIVEN three Slurm tasks (siblings under slurmstepd, which has no ring) ended by its SIGTERM at the time limit
    tasks = [_ring(30 + r, 5, 3.0 + (2 - r) / 1e3, rank=r, sender="slurmstepd", sender_pid=5) for r in range(3)]
    first, collateral, _ = deaths(tasks)
    # THEN the one the signal reached first is told, the others ended with it (before: "2 others died of their own")
    assert first is tasks[2] and {m["rank"] for m in collateral} == {0, 1}
    assert all(m["death"]["collateral_of"]["by"] == "slurmstepd" for m in collateral)


@pytest.mark.parametrize("apart", ["another sender", "another signal", "seconds apart", "the job's own sender"])
def test_signals_that_are_not_one_signal_to_many_keep_their_deaths_apart(apart: str) -> None:
    main = _ring(10, 9, 3.5 if apart == "seconds apart" else 1.5)
    worker = {"another sender": _ring(11, 10, 1.0, role="worker", sender="kill", sender_pid=77),
              "another signal": _ring(11, 10, 1.0, role="worker", sig="SIGHUP"),
              "seconds apart": _ring(11, 10, 1.0, role="worker"),
              "the job's own sender": _ring(11, 10, 1.0, role="worker", sender="python", sender_pid=12)}[apart]
    rings = [main, worker] + ([_ring(12, 10, 1.2, role="worker", cause="exception")] if apart.startswith("the") else [])
    first, collateral, _ = deaths(rings)
    assert first is worker and "same_signal" not in str(collateral)


def test_a_main_process_that_took_the_group_signal_and_exited_0_leaves_no_death() -> None:
    # GIVEN `timeout`'s SIGTERM to the group: the main process saved a checkpoint in its own handler and exited 0,
    # its two spawned workers died of it (they have no handler), 0.2 ms sooner
    main = _ring(10, 9, 1.0002, cause="clean_exit")
    main["death"]["handled_by"] = main["death"].pop("killed_by")
    w1, w2 = _ring(11, 10, 1.0, role="worker"), _ring(12, 10, 1.0001, role="worker")
    first, collateral, _ = deaths([w1, w2, main])
    # THEN no death is the job's: the workers ended with the main process's clean end (it read "The DataLoader
    # worker (pid 11) was ended by SIGTERM from timeout", and `blackbox run` "a process of it died before")
    assert first is None and {m["pid"] for m in collateral} == {11, 12}
    assert all(m["death"]["collateral_of"]["pid"] == 10 for m in collateral)


JOB = """\
import multiprocessing as mp, os, signal, sys, time
def spin(ready):
    open(ready, "w").close()
    while True:
        time.sleep(0.01)
def save_then_exit(signum, frame):  # a checkpoint saved, then the exit (fork workers inherit it)
    time.sleep(0.2)
    if sys.argv[2] == "0":
        sys.exit(0)
    os._exit(1)  # (as handlers do that must not wait for the job's threads)
if __name__ == "__main__":
    if sys.argv[2] != "none":
        signal.signal(signal.SIGTERM, save_then_exit)
    workers = [mp.get_context(sys.argv[1]).Process(target=spin, args=(f"w{i}.ready",)) for i in range(2)]
    for w in workers:
        w.start()
    os.write(1, b"pids %d %d %d\\n" % (os.getpid(), workers[0].pid, workers[1].pid))
    for w in workers:
        w.join()
"""


def _job(tmp_path: Path, armed: bool, method: str, how: str, handler: str) -> tuple[int, list[int]]:
    """Run JOB in a session of its own (armed under `blackbox run`, else bare), wait until both workers are up,
    then signal it: the whole group (``killpg``) or, one by one, the workers first and the main process last (as
    a scheduler signals every task). Returns the exit status and the pids (main, worker, worker)."""
    work = tmp_path / ("armed" if armed else "bare")
    work.mkdir()
    (work / "job.py").write_text(JOB)
    run = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(work / "run"), "--"] if armed else []
    env = dict(os.environ, PYTHONPATH=str(REPO) if armed else "")
    proc = subprocess.Popen([*run, sys.executable, "job.py", method, handler], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()[1:]]
    deadline = time.monotonic() + 120
    while not all((work / f"w{i}.ready").exists() for i in range(2)) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # (each worker's ring armed and sampled once)
    if how == "group":
        os.killpg(proc.pid, signal.SIGTERM)
    else:
        subprocess.run(["kill", "-TERM", str(pids[1]), str(pids[2]), str(pids[0])], check=True)
    proc.communicate(timeout=180)
    return proc.returncode, pids


@pytest.mark.slow
@pytest.mark.parametrize(("method", "how", "handler"), [("fork", "group", "none"), ("spawn", "workers first", "none"),
                                                       ("spawn", "group", "0"), ("fork", "group", "1")])  # fmt: skip
def test_one_sigterm_to_a_job_and_its_workers_tells_the_main_process(tmp_path: Path, method: str, how: str,
                                                                     handler: str) -> None:  # fmt: skip
    # GIVEN a job with two multiprocessing workers, run bare and under `blackbox run`, each SIGTERMed with its workers;
    # its main process with no handler, or one that saves a checkpoint and exits: sys.exit(0), or os._exit(1) (fork
    # workers inherit it; such an end read "the process called os._exit(1)", the signal its handler took untold)
    bare, _ = _job(tmp_path, False, method, how, handler)
    armed, (main, *workers) = _job(tmp_path, True, method, how, handler)
    # THEN it ends the same either way
    assert armed == bare == (-signal.SIGTERM if handler == "none" else int(handler)), (armed, bare)
    # AND the main process is the death told (none where it exited 0), its workers ended with it by the same signal
    (run,) = (tmp_path / "armed" / "run").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    first, sender = meta["first_death"], "python" if how == "group" else "kill"
    text = (run / "bundle" / "summary.md").read_text()
    if handler == "0":
        assert first is None and meta["cause"] == "clean_exit", first
        assert f"No process died of its own cause: one SIGTERM from {sender} reached them at once; pid {main}" in text
    else:
        assert first["pid"] == main and first["cause"] == ("signal" if handler == "none" else "nonzero_exit"), first
        said = f"by SIGTERM from {sender}" if handler == "none" else f"after SIGTERM from {sender}, which its own"
        assert said in first["headline"], first["headline"]
    by_pid = {m["pid"]: m for m in meta["rings"]}
    for pid in workers:  # (fork workers that took it in the inherited handler, then os._exit(1), are told so too)
        after = by_pid[pid]["death"].get("collateral_of") or {}
        assert after.get("pid") == main and after["same_signal"] == "SIGTERM" and after["by"] == sender, (
            by_pid[pid]["death"], first)
    assert f"ended with it by the same SIGTERM from {sender} (one signal to them all)" in text
