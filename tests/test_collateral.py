"""Ranks torn down by their launcher after another rank died: collateral, never deaths of their own.

Real launchers and real signals: torchrun stopping its other ranks once one is SIGKILLed, and, across two
hosts (each its own UTS namespace), a host's launcher stopping its rank after a rank of the other host died,
which only the job-wide account over both node bundles can tell.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from conftest import REPO, free_port

from blackbox._postmortem import job_account, write_postmortem
from blackbox.ring.writer import c_writer_module

pytestmark = pytest.mark.skipif(
    c_writer_module() is None, reason="signals are recorded by the C extension, which is not built"
)

TORCHRUN_JOB = """
import os, signal, sys, time
import torch.distributed as dist
import blackbox
rank = int(os.environ["RANK"])
blackbox.arm(os.path.join(sys.argv[1], f"rank{rank}.ring"), capacity=4096, sample_interval=0.05)
dist.init_process_group("gloo")
dist.barrier()
for step in range(100000):
    blackbox.step(step)
    if rank == 1 and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)  # the rank that dies; torchrun then stops the others
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_ranks_torchrun_stops_after_a_rank_died_are_collateral(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed", reason="torchrun needs torch")
    script, rings, out = tmp_path / "train.py", tmp_path / "rings", tmp_path / "bundle"
    script.write_text(TORCHRUN_JOB)
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    # GIVEN a torchrun job of 3 ranks whose rank 1 is SIGKILLed at step 20, with no restart allowed
    proc = subprocess.run(
        [*launcher, "--nproc-per-node=3", "--max-restarts=0", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script), str(rings)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert proc.returncode != 0, proc.stderr[-3000:]
    # WHEN its rings are recovered
    meta = write_postmortem([rings], out, plot=False)
    by_rank = {m["rank"]: m for m in meta["rings"]}
    dead = by_rank[1]
    # THEN ranks 0 and 2 ended by a signal from torchrun's agent (their parent), after rank 1 died
    for r in (0, 2):
        killer = by_rank[r]["death"]["killed_by"]
        assert killer["sender_pid"] == by_rank[r]["ppid"] == dead["ppid"], killer
        assert by_rank[r]["death"]["cause"] == "signal"  # what happened to it stays its cause
        # AND they are collateral of rank 1's death, stopped by torchrun
        assert by_rank[r]["death"]["collateral_of"] == {"rank": 1, "host": dead["host"], "pid": dead["pid"],
                                                        "by": "torchrun"}  # fmt: skip
    assert "collateral_of" not in dead["death"]
    # AND rank 1's is the first death and the only one counted
    assert (meta["first_death"]["rank"], meta["first_death"]["cause"]) == (1, "killed")
    (attempt,) = meta["attempts"]
    assert (attempt["deaths"], attempt["collateral"]) == (1, 2)
    summary = (out / "summary.md").read_text()
    assert "3 ranks: rank 1 killed; ranks 0 and 2 stopped by torchrun after rank 1 died." in summary
    assert "- 2 ranks stopped by torchrun after rank 1 died" in summary and "`signal`" not in summary.split(
        "## How they ended")[1].split("##")[0]  # fmt: skip
    rows = {r["rank"]: r for r in pq.read_table(out / "ranks.parquet").to_pylist()}
    assert [(rows[r]["collateral_of"], rows[r]["stopped_by"]) for r in (0, 1, 2)] == [
        (dead["pid"], "torchrun"), (None, None), (dead["pid"], "torchrun")]  # fmt: skip
    # AND the job-wide account over the node bundle says the same
    _, job, text = job_account([str(out)])
    assert (job["attempts"][0]["deaths"], job["attempts"][0]["collateral"]) == (1, 2)
    assert "3 ranks: rank 1 killed; ranks 0 and 2 stopped by torchrun after rank 1 died." in text


HOST_LAUNCHER = """
import os, signal, subprocess, sys
folder, rank = sys.argv[1], sys.argv[2]
rank_code = (
    "import sys, time, blackbox\\n"
    "blackbox.arm(sys.argv[1] + '/', capacity=1024, sample_interval=0.05)\\n"
    "print('up', flush=True)\\n"
    "step = 0\\n"
    "while True:\\n"
    "    blackbox.step(step); step += 1; time.sleep(0.01)\\n"
)
env = dict(os.environ, RANK=rank, WORLD_SIZE="2")
child = subprocess.Popen([sys.executable, "-c", rank_code, folder], env=env, stdout=subprocess.PIPE, text=True)
assert child.stdout.readline().strip() == "up"
print(child.pid, flush=True)
if sys.stdin.readline().strip() == "stop":  # told that a rank on another host died: stop ours
    child.send_signal(signal.SIGTERM)
child.wait()
"""


def _host(name: str, folder: Path, rank: int) -> tuple[subprocess.Popen[str], int]:
    """A host's launcher, in a UTS namespace of its own named ``name``, with its one rank up."""
    code = textwrap.dedent(HOST_LAUNCHER)
    cmd = ["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', name, sys.executable, "-c", code, str(folder),
           str(rank)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=str(REPO)))  # fmt: skip
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


@pytest.mark.slow
@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -u")
def test_a_rank_stopped_after_a_death_on_another_host_is_collateral_job_wide(tmp_path: Path) -> None:
    # GIVEN two hosts, a launcher and one rank on each; rank 0 (node-a) is SIGKILLed, and half a second
    # later (more than the two clocks' error) node-b's launcher stops its rank 1 with SIGTERM
    a, rank0 = _host("node-a", tmp_path / "rings" / "node-a", 0)
    b, rank1 = _host("node-b", tmp_path / "rings" / "node-b", 1)
    os.kill(rank0, 9)
    time.sleep(0.5)
    for launcher, word in ((b, "stop\n"), (a, "")):
        assert launcher.stdin is not None
        launcher.stdin.write(word)
        launcher.stdin.close()
        assert launcher.wait(timeout=60) == 0
    # WHEN each host's rings are recovered on their own, then the job from both node bundles
    for host in ("node-a", "node-b"):
        write_postmortem([tmp_path / "rings" / host], tmp_path / "bundles" / host, plot=False)
    node_b = pq.read_table(tmp_path / "bundles" / "node-b" / "ranks.parquet").to_pylist()
    job_pass, meta, text = job_account([str(tmp_path / "bundles")])
    # THEN node-b's bundle alone cannot tell: rank 1's is the only death it holds
    assert [(r["pid"], r["cause"], r["collateral_of"]) for r in node_b] == [(rank1, "signal", None)]
    # AND job-wide rank 1 is collateral of rank 0, whose death is the first and the only one counted
    assert (meta["first_death"]["pid"], meta["first_death"]["host"]) == (rank0, "node-a")
    assert (meta["attempts"][0]["deaths"], meta["attempts"][0]["collateral"]) == (1, 1)
    rows = {r["pid"]: r for r in job_pass.ranks().to_pylist()}
    assert (rows[rank1]["collateral_of"], rows[rank0]["collateral_of"]) == (rank0, None)
    assert rows[rank1]["stopped_by"] is None  # its parent is no launcher blackbox knows by name
    assert "2 ranks: rank 0 killed; rank 1 stopped by the parent process after rank 0 died." in text


RANK_UNDER_RUN = """
import os, signal, time
import torch.distributed as dist
import blackbox
rank = int(os.environ["RANK"])
dist.init_process_group("gloo")
dist.barrier()
for step in range(100000):
    blackbox.step(step)
    if rank == 1 and step == 20:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_ranks_each_under_blackbox_run_stopped_by_torchrun_are_collateral_and_blackbox_is_not_named(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch.distributed", reason="torchrun needs torch")
    script, runs = tmp_path / "train.py", tmp_path / "runs"
    script.write_text(RANK_UNDER_RUN)
    # GIVEN torchrun starting each of its 3 ranks under its own `blackbox run` (README: "Under torchrun"),
    # whose rank 1 is SIGKILLed: torchrun's SIGTERM reaches ranks 0 and 2 through their `blackbox run`
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3", "--max-restarts=0",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--no-python",
         sys.executable, "-m", "blackbox", "run", "--dir", str(runs), "--quiet", "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert proc.returncode != 0, proc.stderr[-3000:]
    # WHEN the job is read from the three ranks' bundles
    job_pass, meta, text = job_account([str(runs)])
    rows = {r["rank"]: r for r in job_pass.ranks().to_pylist()}
    # THEN rank 1's is the first death, and ranks 0 and 2 are collateral of it, by torchrun where the relayed
    # signal's sender was recorded, else by "the launcher": never by blackbox, which only passed it on
    assert (meta["first_death"]["rank"], meta["first_death"]["cause"]) == (1, "killed")
    assert (meta["attempts"][0]["deaths"], meta["attempts"][0]["collateral"]) == (1, 2)
    assert [rows[r]["collateral_of"] for r in (0, 1, 2)] == [rows[1]["pid"], None, rows[1]["pid"]]
    assert {rows[0]["stopped_by"], rows[2]["stopped_by"]} <= {"torchrun", None}
    by = rows[0]["stopped_by"] or "the launcher"
    assert f"3 ranks: rank 1 killed; ranks 0 and 2 stopped by {by} after rank 1 died." in text
    assert "by blackbox" not in text


def test_the_first_death_is_not_counted_within_the_time_after_itself() -> None:
    from blackbox.views.across import ended_lines

    # GIVEN rank 1 killed first, then rank 3 killed 0.4 s later, and rank 0 SIGKILLed 1.2 s later too
    first = {"rank": 1, "host": "a", "pid": 11, "cause": "killed", "time": "2026-12-02T00:00:00.000000Z"}
    rows = [{"rank": 1, "host": "a", "pid": 11, "cause": "killed", "death_time": "2026-12-02T00:00:00.000000Z"},
            {"rank": 3, "host": "a", "pid": 13, "cause": "killed", "death_time": "2026-12-02T00:00:00.400000Z"},
            {"rank": 0, "host": "a", "pid": 10, "cause": "killed", "death_time": "2026-12-02T00:00:01.200000Z"}]
    # THEN the group holding it says it is the first, and how soon the other two came (it read "3 ranks `killed`
    # within 1.2 s after the first death", the first death among them)
    (line,) = [line for line in ended_lines(first, rows) if line.startswith("- ")]
    assert line == "- 3 ranks `killed` (the first death, then 2 more within 1.2 s)", line
    # AND a group without it still says how long after it came
    (line,) = [line for line in ended_lines(first, rows[1:]) if line.startswith("- ")]
    assert line == "- 2 ranks `killed` within 1.2 s after the first death", line


def test_the_first_deaths_own_row_is_the_first_death_whatever_its_tables_rounding() -> None:
    from blackbox.views.across import ended_lines

    # GIVEN the first death at ns precision and its ranks.parquet row at us (a job-wide account read "1 rank
    # `hang`, from -0 ms to -0 ms around the first death")
    first = {"rank": 1, "host": "a", "pid": 11, "cause": "hang", "time": "2026-12-02T00:00:00.635501588Z"}
    rows = [{"rank": 1, "host": "a", "pid": 11, "cause": "hang", "death_time": "2026-12-02T00:00:00.635501Z"}]
    (line,) = [line for line in ended_lines(first, rows) if line.startswith("- ")]
    assert line == "- 1 rank `hang` (the first death)", line


def test_a_ranks_worker_is_named_as_its_worker_never_as_the_rank() -> None:
    from blackbox.views.across import across_lines

    # GIVEN rank 1's DataLoader worker (it inherits RANK) hung, rank 1 and rank 0 waiting; a red team's summary read
    # "rank 1 hung ... rank 1 waited for it"
    t = "2026-12-02T00:00:10.000000Z"
    first = {"rank": 1, "host": "a", "pid": 21, "role": "worker", "cause": "hang", "time": t, "headline": "hung"}
    rows = [{"rank": 0, "host": "a", "pid": 10, "role": "main", "cause": "signal", "death_time": t, "collateral_of": 21,
             "stopped_by": "torchrun"},
            {"rank": 1, "host": "a", "pid": 11, "role": "main", "cause": "signal", "death_time": t, "collateral_of": 21,
             "stopped_by": "torchrun"},
            {"rank": 1, "host": "a", "pid": 21, "role": "worker", "cause": "hang", "death_time": t}]  # fmt: skip
    hang = {"stuck": [{"rank": 1, "host": "a", "pid": 21, "role": "worker", "since": t, "stalled_s": 15.0,
                       "step": None, "stack": "work (job.py:3)"}],
            "waited": [{"rank": 1, "host": "a", "pid": 11, "role": "main", "step": None, "site": "main (job.py:9)"},
                       {"rank": 0, "host": "a", "pid": 10, "role": "main", "step": None, "collective": "barrier"}],
            "stuck_count": 1, "waited_count": 2, "chain": []}  # fmt: skip
    meta = {"first_death": first, "attempts": [{"job": "j", "first_death": first, "hang": hang, "rings": 3}]}
    text = "\n".join(across_lines(meta, rows))
    assert "**First death: rank 1's worker (host a, pid 21)**" in text, text
    assert "**A hang:** rank 1's worker (pid 21) made no progress for 15.0 s" in text, text
    assert "- rank 1 waited for it, at `main (job.py:9)`" in text and "- rank 0 waited for it, in barrier" in text
    assert "ranks 0 and 1 stopped by torchrun after rank 1's worker (pid 21) hung" in text, text

    # AND an mp.spawn rank (a multiprocessing worker whose rank no other process has) is named as the rank
    spawned = [{**r, "role": "worker"} for r in rows[:2]]
    first = {**spawned[1], "cause": "exception", "time": t, "headline": "raised"}
    meta = {"first_death": first, "attempts": [{"job": "j", "first_death": first, "rings": 2}]}
    text = "\n".join(across_lines(meta, [spawned[0], {**spawned[1], "cause": "exception", "collateral_of": None}]))
    assert "**First death: rank 1 (host a, pid 11)**" in text and "worker" not in text, text
