"""`torchrun --no-python blackbox run -- python train.py`: each rank under its own `blackbox run`.

When one rank dies, torchrun tears the others down with SIGTERM, through their
`blackbox run`: their records name torchrun (and its pid) as the sender, never
blackbox. In torchrun's log, each rank's `blackbox run` prints one line (its
cause and bundle) and the full account is printed once, by the rank that failed
first.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, free_port

pytest.importorskip("torch.distributed", reason="torchrun needs torch")

TORCHRUN = Path(sys.executable).parent / "torchrun"
SCRIPT = Path(sys.executable).parent / "blackbox"
BLACKBOX = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "blackbox"]
TRAIN = """\
import os, signal, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(5):
    x = torch.ones(1)
    dist.all_reduce(x)
dist.barrier()
if rank == 1:
    os.kill(os.getpid(), signal.SIGKILL)  # the rank that dies of its own cause
time.sleep(120)  # the others wait outside any collective: torchrun tears them down
"""


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_torchrun_teardown_names_torchrun_and_the_account_is_printed_once(tmp_path: Path) -> None:
    # GIVEN three gloo ranks under torchrun, each in its own blackbox run; rank 1 SIGKILLs itself
    (tmp_path / "train.py").write_text(TRAIN)
    work = tmp_path / "runs"
    cmd = [str(TORCHRUN), "--nproc-per-node", "3", "--max-restarts=0", f"--rdzv-endpoint=127.0.0.1:{free_port()}",
           "--rdzv-backend=c10d", "--no-python", *BLACKBOX, "run", "--dir", str(work), "--", sys.executable,
           str(tmp_path / "train.py")]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    _, log = proc.communicate(timeout=300)
    assert proc.returncode != 0, log[-3000:]
    metas = {}
    for run in work.glob("run-*"):
        meta = json.loads((run / "bundle" / "metadata.json").read_text())
        metas[meta["rank"]] = meta
    assert set(metas) == {0, 1, 2}, log[-3000:]
    # THEN rank 1 died of its SIGKILL; ranks 0 and 2 of torchrun's SIGTERM, sent by torchrun (its own pid): to
    # the rank's process group, which the job shares with its `blackbox run`, so the job's own record names the
    # agent by its thread's name, pt_elastic, as it does unarmed
    assert metas[1]["death"]["cause"] == "killed"
    for r in (0, 2):
        death = metas[r]["death"]
        assert death["cause"] == "signal", death
        assert (death["killed_by"]["sender"], death["killed_by"]["sender_pid"]) == ("pt_elastic", proc.pid), death
        assert "SIGTERM from pt_elastic" in death["headline"]
    assert "from blackbox" not in log
    # AND the log holds one line per rank and the full account once: rank 1's, the first to fail
    for r in (0, 1, 2):
        assert log.count(f"blackbox run: rank {r}: exit status ") == 1, log[-3000:]
    assert log.count("# blackbox: ") == 1, log[-5000:]
    account = log[log.index("# blackbox: ") :]
    assert f"pid {metas[1]['pid']} rank 1" in account.splitlines()[0], account[:300]
    assert "blackbox run: rings in" not in log  # the rank's one line names its bundle


RANK_RAISES = """\
import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
for step in range(3):
    x = torch.ones(1)
    dist.all_reduce(x)
if dist.get_rank() == 1:
    raise ValueError("rank 1 fails")
time.sleep(120)  # rank 0 waits outside any collective: torchrun tears it down
"""


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_blackbox_run_of_torchrun_is_one_job_with_its_agent_named(tmp_path: Path) -> None:
    # GIVEN `blackbox run -- torchrun --standalone` (torchrun picks a random rendezvous id of its own) of two
    # gloo ranks, rank 1 raising; run unarmed, then armed
    (tmp_path / "train.py").write_text(RANK_RAISES)
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", "--max-restarts=0", str(tmp_path / "train.py")]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    plain = subprocess.run(torchrun, capture_output=True, text=True, timeout=300, env={**env, "PYTHONPATH": ""})
    armed = subprocess.run([*BLACKBOX, "run", "--quiet", "--dir", str(tmp_path / "run"), "--", *torchrun],
                           capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    # THEN both end alike (torchrun's status for a failed rank)
    assert armed.returncode == plain.returncode == 1, (plain.stderr[-2000:], armed.stderr[-2000:])
    (run,) = (tmp_path / "run").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    # AND the agent's ring and the ranks' are of one job, the run's; the agent is named as such; the first death
    # is rank 1's ValueError
    assert meta["jobs"] == 1 and {r["job"] for r in meta["rings"]} == {run.name}, [r["job"] for r in meta["rings"]]
    agent = next(r for r in meta["rings"] if r["rank"] is None and r["role"] == "main")
    assert agent["death"]["victim"]["role"] == "torchrun agent", agent["death"]
    assert (meta["first_death"]["rank"], meta["first_death"]["cause"]) == (1, "exception"), meta["first_death"]
    summary = (run / "bundle" / "summary.md").read_text()
    assert "These rings are of 2 jobs" not in summary
    # AND the agent's ChildFailedError is its report of rank 1's death, not a death of its own cause
    assert agent["death"]["collateral_of"]["reported"] is True and meta["attempts"][0]["deaths"] == 1, agent["death"]
    told = next(line for line in summary.splitlines() if line.startswith("3 processes: "))
    assert f"pid {agent['pid']} reported rank 1's death and ended (`exception`)" in told and "own cause" not in told


CHECKPOINT_ON_SIGTERM = """\
import os, signal, sys, time
import torch, torch.distributed as dist

def on_sigterm(signum, frame):  # save a checkpoint, then exit: torchrun's teardown ends the rank by its own hand
    os.write(1, f"rank {dist.get_rank()} saving\\n".encode())  # one write: torchrun's `python -u` splits a print
    sys.exit(0 if sys.argv[1] == "exit0" else 1)

signal.signal(signal.SIGTERM, signal.default_int_handler if sys.argv[1] == "interrupt" else on_sigterm)
dist.init_process_group("gloo")
for step in range(10**6):
    x = torch.ones(1)
    dist.all_reduce(x)
    if dist.get_rank() == 1 and step == 20:
        raise ValueError("rank 1 fails")
    if step == 20:
        time.sleep(120)  # the others wait outside any collective until torchrun's SIGTERM
    time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
@pytest.mark.parametrize("handler", ["exit", "exit0", "interrupt"])
def test_ranks_whose_handler_exits_on_torchruns_sigterm_are_stopped_by_torchrun_not_deaths(
    tmp_path: Path, handler: str
) -> None:
    # GIVEN 3 gloo ranks under torchrun that each save and exit(1) on SIGTERM (or exit(0), or take it as Python's
    # SIGINT: a KeyboardInterrupt), rank 1 raising at step 20; unarmed, then under `blackbox run`
    (tmp_path / "train.py").write_text(CHECKPOINT_ON_SIGTERM)
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", "3", "--max-restarts=0", str(tmp_path / "train.py"),
                handler]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    plain = subprocess.run(torchrun, capture_output=True, text=True, timeout=300, env={**env, "PYTHONPATH": ""})
    armed = subprocess.run([*BLACKBOX, "run", "--quiet", "--dir", str(tmp_path / "run"), "--", *torchrun],
                           capture_output=True, text=True, timeout=300, env=env)  # fmt: skip
    # THEN both end alike: torchrun's status, ranks 0 and 2 saving
    assert armed.returncode == plain.returncode == 1, (plain.stderr[-2000:], armed.stderr[-2000:])
    saving = ["rank 0 saving", "rank 2 saving"] if handler != "interrupt" else []
    assert sorted(armed.stdout.splitlines()) == sorted(plain.stdout.splitlines()) == saving
    # AND rank 1's ValueError is the one death; ranks 0 and 2, ended by their own handler of torchrun's SIGTERM, are
    # collateral (they read "2 others died of their own causes"; by exit(0), "2 ended cleanly"), their ring saying
    # which signal it took
    (run,) = (tmp_path / "run").glob("run-*")
    meta = json.loads((run / "bundle" / "metadata.json").read_text())
    assert (meta["first_death"]["rank"], meta["first_death"]["cause"]) == (1, "exception"), meta["first_death"]
    assert meta["attempts"][0]["deaths"] == 1, meta["attempts"][0]
    by_rank = {r["rank"]: r["death"] for r in meta["rings"]}
    for r in (0, 2):  # (a KeyboardInterrupt read "interrupted (Ctrl-C or SIGINT)", a death of its own)
        took = by_rank[r]["killed_by"] if handler == "interrupt" else by_rank[r]["handled_by"]
        cause = {"exit": "nonzero_exit", "exit0": "clean_exit", "interrupt": "interrupted"}[handler]
        assert by_rank[r]["cause"] == cause, by_rank[r]
        assert took["signal"] == "SIGTERM" and took["sender"] == "pt_elastic", by_rank[r]
        assert by_rank[r]["collateral_of"]["rank"] == 1 and by_rank[r]["collateral_of"]["by"] == "torchrun"
    summary = (run / "bundle" / "summary.md").read_text()
    assert "ranks 0 and 2 stopped by torchrun after rank 1 died" in summary and "own cause" not in summary, summary
    assert "ended cleanly" not in summary and "`clean_exit`" not in summary, summary


TWO_NODES = """\
import time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
for step in range(3):
    x = torch.ones(1)
    dist.all_reduce(x)
if dist.get_rank() == 3:
    raise ValueError("rank 3 fails")
dist.barrier()  # the others lose their peer here (a node left waiting would wait in torchrun's exit barrier)
"""


def _two_nodes(tmp_path: Path, name: str, armed: bool) -> list[subprocess.CompletedProcess[str]]:
    """Two torchrun nodes of one world of 4 on this host (c10d rendezvous), each under its own `blackbox run
    --dir D<n>` where ``armed``; both ended."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(REPO) if armed else "", OMP_NUM_THREADS="1")
    procs = []
    for n in (0, 1):
        torchrun = [str(TORCHRUN), "--nnodes=2", "--nproc-per-node=2", "--max-restarts=0", "--rdzv-backend=c10d",
                    f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={name}", str(tmp_path / "train.py")]  # fmt: skip
        run = [*BLACKBOX, "run", "--quiet", "--dir", str(tmp_path / f"{name}{n}"), "--"] if armed else []
        procs.append(subprocess.Popen([*run, *torchrun], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      env=env))  # fmt: skip
    ended = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=240)
            ended.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            with contextlib.suppress(OSError):
                p.kill()
    return ended


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_two_nodes_each_under_its_own_blackbox_run_are_one_job(tmp_path: Path) -> None:
    from blackbox._postmortem import job_account

    # GIVEN a job of two torchrun nodes (2 ranks each), each under `blackbox run` with its own folder (as on two
    # hosts), rank 3 raising after three all-reduces; unarmed, then armed
    (tmp_path / "train.py").write_text(TWO_NODES)
    plain, armed = _two_nodes(tmp_path, "plain", armed=False), _two_nodes(tmp_path, "d", armed=True)
    # THEN each node ends as it does unarmed
    assert [p.returncode for p in armed] == [p.returncode for p in plain] == [1, 1], [p.stderr[-1500:] for p in armed]
    # AND the two nodes' bundles are one job (each node's rings carry its own run's id: it read "These rings are of
    # 2 jobs", the other node's ranks "left no ring"): rank 3's ValueError the first death, every other end collateral
    _, meta, text = job_account([str(tmp_path / "d0"), str(tmp_path / "d1")])
    assert meta["jobs"] == 1 and len(meta["attempts"]) == 1, [a["job"] for a in meta["attempts"]]
    first = meta["first_death"]
    assert (first["rank"], first["cause"]) == (3, "exception"), first
    assert meta["attempts"][0]["deaths"] == 1 and meta["attempts"][0]["collateral"] == 5, meta["attempts"][0]
    assert "These rings are of 2 jobs" not in text and "left no ring" not in text, text[:3000]
    assert "reported rank 3's death" in text and "own cause" not in text, text[:3000]


LONG = """\
import sys, time
import torch, torch.distributed as dist
import blackbox
dist.init_process_group("gloo")
for step in range(100000):
    blackbox.step(step)
    x = torch.ones(1)
    dist.all_reduce(x)
    if step == 3 and dist.get_rank() == 0:
        print("training", flush=True)
    time.sleep(0.02)
"""


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_a_time_limits_sigterm_to_torchrun_is_that_signal_not_the_agents_exception(tmp_path: Path) -> None:
    # GIVEN a torchrun job ended by `timeout` (a scheduler's time limit), unarmed and under `blackbox run`
    (tmp_path / "train.py").write_text(LONG)
    torchrun = [str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(tmp_path / "train.py")]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    runs = [subprocess.run(["timeout", "-s", "TERM", "15", *prefix, *torchrun], capture_output=True, text=True,
                           env=env, cwd=tmp_path, timeout=300)
            for prefix in ([], [*BLACKBOX, "run", "--dir", str(tmp_path / "runs"), "--quiet", "--"])]  # fmt: skip
    unarmed, armed = runs
    # THEN it ends as unarmed (timeout's status), and the verdict is timeout's SIGTERM, which torchrun's handler
    # turned into its SignalException (it read "died of an uncaught ...SignalException", cause exception)
    assert unarmed.returncode == armed.returncode == 124 and "training" in armed.stdout, armed.stderr[-3000:]
    (bundle,) = (tmp_path / "runs").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    first = meta["first_death"]
    assert meta["cause"] == first["cause"] == "signal", first
    assert first["headline"].startswith("The torchrun agent (pid ") and first["headline"].endswith(
        ") was ended by SIGTERM from timeout: its handler raised "
        "torch.distributed.elastic.multiprocessing.api.SignalException."), first["headline"]  # fmt: skip
    # AND the ranks it stopped with that SIGTERM are told as stopped by it as it went down (not "after it died")
    summary = (bundle / "summary.md").read_text()
    pid = first["pid"]
    assert f"3 processes: pid {pid} ended by a signal; ranks 0 and 1 stopped by pid {pid} (torchrun) as it went " \
           "down." in summary, summary[:1500]  # fmt: skip


ORPHANED = """\
import os, sys, time
import torch, torch.distributed as dist
import blackbox
dist.init_process_group("gloo")
rank = dist.get_rank()
open(os.path.join(sys.argv[1], f"rank-{rank}"), "w").write(str(os.getpid()))
for step in range(100000):
    blackbox.step(step)
    dist.all_reduce(torch.ones(1))
    if rank == 1 and step == 20:
        while True:
            time.sleep(0.5)  # PLANT: rank 1 stalls in its own code
    time.sleep(0.05)
"""


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_ranks_left_running_by_a_sigkilled_torchrun_are_told_as_running_with_where_each_was(tmp_path: Path) -> None:
    # GIVEN `timeout -s KILL 10 torchrun` of two gloo ranks, rank 1 stuck at step 20 and rank 0 waiting for it in
    # all_reduce: the SIGKILL reaches torchrun's group, not its ranks (sessions of their own), which run on; run
    # unarmed, then armed under `blackbox run`
    (tmp_path / "train.py").write_text(ORPHANED)
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    pids = {"unarmed": tmp_path / "unarmed", "armed": tmp_path / "armed"}
    procs = {}
    try:
        for name, where in pids.items():
            where.mkdir()
            # (its time runs out, SIGALRM, 3 s after rank 1 wrote its pid: a fixed 10 s was too short under load)
            cmd = (f"timeout -s KILL 100 {TORCHRUN} --nproc-per-node 2 --master-port {free_port()} "
                   f"{tmp_path / 'train.py'} {where} & t=$!; while [ ! -e {where}/rank-1 ]; do sleep 0.1; done; "
                   "sleep 3; kill -ALRM $t; wait $t")  # fmt: skip
            armed = [*BLACKBOX, "run", "--quiet", "--dir", str(tmp_path / "run"), "--"] if name == "armed" else []
            with open(where / "err", "w") as err:  # (a file: the ranks left running keep it open, as a pipe)
                procs[name] = subprocess.run([*armed, "bash", "-c", cmd], stdout=subprocess.DEVNULL, stderr=err,
                                             timeout=120, env=env)  # fmt: skip
        # THEN both end alike, the ranks running on in both
        assert procs["armed"].returncode == procs["unarmed"].returncode == 128 + 9, {  # (bash: its timeout killed)
            k: (p.returncode, (pids[k] / "err").read_text()[-1500:]) for k, p in procs.items()}  # fmt: skip
        for where in pids.values():
            for rank in (0, 1):
                os.kill(int((where / f"rank-{rank}").read_text()), 0)  # (raises where it ended)
        (run,) = (tmp_path / "run").glob("run-*")
        meta = json.loads((run / "bundle" / "metadata.json").read_text())
        summary = (run / "bundle" / "summary.md").read_text()
        # AND the agent's SIGKILL is the first death, with no lever at torchrun's own line; the ranks are no
        # deaths, told as running, rank 1 stuck at the planted line and rank 0 waiting in all_reduce
        attempt = meta["attempts"][-1]
        assert meta["first_death"]["victim"]["role"] == "torchrun agent" and attempt["deaths"] == 1, attempt
        agent = next(r for r in meta["rings"] if r["rank"] is None)
        assert not any("torchrun:" in lever for lever in agent["death"].get("levers") or []), agent["death"]
        running = {r["rank"]: r for r in attempt["still_running"]}
        assert set(running) == {0, 1} and attempt["still_running_count"] == 2, attempt
        plant = ORPHANED.splitlines().index("            time.sleep(0.5)  # PLANT: rank 1 stalls in its own code") + 1
        assert running[1]["headline"].endswith(f"stuck in <module> (train.py:{plant})."), running[1]
        assert "is still running" in running[0]["headline"] and "waiting in all_reduce" in running[0]["headline"]
        line = next(ln for ln in summary.splitlines() if "still running when recovered" in ln)
        assert "## Still running" in summary and line.endswith(": ranks 0 and 1") and "within" not in line, line
    finally:
        for mark in tmp_path.glob("*/rank-*"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(mark.read_text()), signal.SIGKILL)
