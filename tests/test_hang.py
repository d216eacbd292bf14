"""Hangs, as jobs really hang and are really ended: a rank stuck in its data source while the others wait
in the all-reduce inside backward, until `timeout` ends torchrun; a single process stuck on a lock, ended
by `timeout` (SIGTERM) or `timeout -s KILL`. Armed and unarmed side by side; the verdict checked against
the planted truth: the stuck rank and its stack, the ranks that waited and where, how long, and the chain
of senders (timeout -> torchrun -> ranks), never the rank whose SIGTERM landed first."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, free_port

ENV = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
STUCK_FOR = 3.0  # seconds the test lets the planted hang last before `timeout` ends it
TORCHRUN = Path(sys.executable).with_name("torchrun")

DDP_JOB = """\
import datetime, os, sys, threading, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

def wait_for_batch(step, rank):
    if rank == 1 and step == 20:
        open(sys.argv[1], "w").close()  # the planted truth: rank 1 is stuck from now on
        threading.Event().wait()  # its data source never delivers
    return torch.randn(16, 32)

def watchdog(rank, last):  # what NCCL's watchdog does on a collective's timeout, for gloo: dump the recorder
    import torch._C._distributed_c10d as c10d
    while last[0] is None or time.monotonic() - last[0] < 2.0:  # no step for 2 s, once training began
        time.sleep(0.1)
    with open(os.environ["TORCH_FR_DUMP_TEMP_FILE"] + str(rank), "wb") as f:
        f.write(c10d._dump_fr_trace())

def aborter(pending):  # what NCCL's watchdog does by default on a collective's timeout: abort the process
    while pending[0] is None or time.monotonic() - pending[0] < float(os.environ["ABORT_AFTER_S"]):
        time.sleep(0.1)
    os.abort()

def main():
    dist.init_process_group("gloo")  # gloo's default timeout: 30 minutes
    rank = dist.get_rank()
    last, pending = [None], [None]
    if "TORCH_FR_DUMP_TEMP_FILE" in os.environ:
        threading.Thread(target=watchdog, args=(rank, last), daemon=True).start()
    if "ABORT_AFTER_S" in os.environ:
        threading.Thread(target=aborter, args=(pending,), daemon=True).start()
    group = None
    if "PG_TIMEOUT_S" in os.environ:  # a short one for training only, once every rank is up
        dist.barrier()
        group = dist.new_group(timeout=datetime.timedelta(seconds=float(os.environ["PG_TIMEOUT_S"])))
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)),
                process_group=group)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(10**6):
        x = wait_for_batch(step, rank)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        pending[0] = time.monotonic()
        loss.backward()  # DDP all-reduces the gradients here: ranks 0 and 2 wait in it for rank 1
        pending[0] = None
        opt.step()
        last[0] = time.monotonic()
        os.write(1, f"rank {rank} step {step}\\n".encode())  # one write: the ranks share torchrun's stdout
        time.sleep(0.02)

main()
"""


def _end_when_stuck(
    jobs: list[tuple[list[str], Path, dict[str, str]]], stuck_for: float = STUCK_FOR
) -> list[subprocess.Popen[str]]:
    """Run each command under `timeout 120`, side by side; once each one's ``stuck`` file appears and
    ``stuck_for`` more seconds pass, SIGALRM makes its `timeout` act as if its time had run out (a shorter run
    than waiting for it). The `timeout` processes, ended, their output read (``.out``, ``.err``)."""
    procs = [subprocess.Popen(["timeout", "120", *cmd], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(ENV, TORCH_FR_BUFFER_SIZE="200", **env)) for cmd, _, env in jobs]  # fmt: skip
    deadline = time.monotonic() + 150
    for (_, stuck, _), proc in zip(jobs, procs, strict=True):
        while not stuck.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
    time.sleep(stuck_for)
    for proc in procs:
        proc.send_signal(signal.SIGALRM)
    for proc in procs:
        proc.out, proc.err = proc.communicate(timeout=120)  # type: ignore[attr-defined]
    return procs


def _torchrun_both(
    tmp_path: Path, job: str, args: list[str], stuck_for: float
) -> tuple[subprocess.Popen[str], subprocess.Popen[str], Path]:
    """``job`` as train.py under torchrun (3 ranks, c10d on a free port; its first argument the file it makes once
    stuck, then ``args``), unarmed and under `blackbox run` side by side (``_end_when_stuck``): both ended, and the
    armed run's folder."""
    script, runs = tmp_path / "train.py", tmp_path / "runs"
    script.write_text(job)
    torchrun = [str(TORCHRUN), "--nproc-per-node=3", "--max-restarts=0", "--rdzv-backend=c10d"]
    unarmed, armed = _end_when_stuck([
        ([*torchrun, f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script), str(tmp_path / "stuck0"), *args],
         tmp_path / "stuck0", {}),
        ([sys.executable, "-m", "blackbox", "run", "--dir", str(runs), "--", *torchrun,
          f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script), str(tmp_path / "stuck1"), *args],
         tmp_path / "stuck1", {}),
    ], stuck_for=stuck_for)  # fmt: skip
    return unarmed, armed, runs


def _bundle(runs: Path) -> dict[str, Any]:
    (bundle,) = runs.glob("run-*/bundle")
    meta: dict[str, Any] = json.loads((bundle / "metadata.json").read_text())
    meta["_summary"] = (bundle / "summary.md").read_text()
    return meta


def _start_until_go(tmp_path: Path, job: str, *args: str, wait_s: float = STUCK_FOR,
                    **kw: Any) -> subprocess.Popen[Any]:  # fmt: skip
    """``job`` run as tmp_path/job.py with its rings folder, its go file and ``args``, returned once it has written
    the go file (its plant begins there) and ``wait_s`` more seconds have passed."""
    (tmp_path / "job.py").write_text(job)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "job.py"), str(tmp_path / "rings"), str(tmp_path / "go"),
                             *args], env=ENV, **kw)  # fmt: skip
    while not (tmp_path / "go").exists() and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(wait_s)
    return proc


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_a_stuck_rank_is_named_not_the_rank_whose_sigterm_landed_first(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    script = tmp_path / "train.py"
    script.write_text(DDP_JOB)
    torchrun = [str(TORCHRUN), "--nproc-per-node=3", "--max-restarts=0", "--rdzv-backend=c10d",
                f"--rdzv-endpoint=127.0.0.1:{free_port()}"]  # fmt: skip
    # GIVEN 3 gloo ranks under torchrun, rank 1 stuck in its data source at step 20; `timeout` ends the job,
    # unarmed and under `blackbox run`; the flight recorder on, its dumps written by a watchdog thread 2 s into
    # the stall (NCCL's watchdog writes them on a collective's timeout; gloo has none)
    runs = tmp_path / "runs"
    unarmed, armed = _end_when_stuck([
        ([*torchrun, str(script), str(tmp_path / "stuck0")], tmp_path / "stuck0",
         {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "unarmed_fr_")}),
        ([sys.executable, "-m", "blackbox", "run", "--dir", str(runs), "--", *torchrun[:-1],
          f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script), str(tmp_path / "stuck1")], tmp_path / "stuck1",
         {"TORCH_FR_DUMP_TEMP_FILE": str(tmp_path / "fr_")}),
    ])  # fmt: skip
    timeout_pid = armed.pid
    # THEN the job ends as it does unarmed: timeout's status, the same steps printed, torchrun's SIGTERMs
    assert unarmed.returncode == armed.returncode == 124, (unarmed.err[-2000:], armed.err[-3000:])
    assert sorted(unarmed.out.splitlines()) == sorted(armed.out.splitlines())
    for r in (0, 1, 2):
        assert f"rank {r} step 19" in armed.out and f"rank {r} step 20" not in armed.out
    for err in (unarmed.err, armed.err):  # (timeout sends SIGTERM to torchrun, then to its group, torchrun in it:
        # where torchrun's handler ran between the two, it closes its ranks twice, armed or not: seen under load)
        assert err.count("closing signal SIGTERM") in (3, 6), err[-2000:]
    # AND the verdict is a hang of rank 1, stuck in wait_for_batch, for about as long as it was planted
    meta = _bundle(runs)
    first = meta["first_death"]
    assert (meta["cause"], meta["jobs"], first["rank"], first["cause"]) == ("hang", 1, 1, "hang"), first
    hang = first["hang"]
    assert hang["collective"] is None and hang["site"].startswith("wait_for_batch (") and hang["step"] == 20
    assert STUCK_FOR <= hang["stalled_s"] <= STUCK_FOR + 30, hang
    assert "hung: no step for" in first["headline"] and "stuck in wait_for_batch (train.py:" in first["headline"]
    assert first["headline"].endswith("; then SIGTERM from torchrun ended it."), first["headline"]
    # AND ranks 0 and 2 waited for it in backward, collateral of it; torchrun's agent ended by timeout
    (attempt,) = meta["attempts"]
    told = attempt["hang"]
    assert sorted((w["rank"], w["step"]) for w in told["waited"]) == [(0, 20), (2, 20)], told["waited"]
    assert all("backward" in w["collective"] for w in told["waited"]), told["waited"]
    by_rank = {m["rank"]: m for m in meta["rings"]}
    for r in (0, 2):
        assert by_rank[r]["death"]["collateral_of"]["rank"] == 1 and by_rank[r]["death"]["collateral_of"]["by"] == (
            "torchrun")
    agent = by_rank[None]
    assert agent["death"]["collateral_of"] == {"rank": 1, "host": first["host"], "pid": first["pid"], "by": "timeout"}
    assert (attempt["deaths"], attempt["collateral"]) == (1, 3)
    # AND the chain of senders: timeout (its pid) -> torchrun's agent -> the three ranks
    chain = told["chain"]
    assert [(c["sender"], c["sender_pid"]) for c in chain] == [("timeout", timeout_pid), ("pt_elastic", agent["pid"])]
    assert [t["pid"] for t in chain[0]["to"]] == [agent["pid"]] and chain[1]["to_count"] == 3
    # AND the summary says so, and blackbox run's own line; never "First death: rank 0" nor a plain SIGTERM death
    summary = meta["_summary"]
    assert "**First death: rank 1 " in summary and "**A hang:** rank 1 made no progress for " in summary
    assert "- ranks 0 and 2 waited for it from step 20, in backward (where DDP all-reduces the gradients)" in summary
    assert f"- then timeout (pid {timeout_pid}) sent SIGTERM to torchrun (pid {agent['pid']})" in summary
    assert f"- then torchrun (pid {agent['pid']}) sent SIGTERM to ranks 0 to 2" in summary
    assert "These rings are of 2 jobs" not in summary
    # AND the flight recorder's dumps, read without unpickling them, say the same: ranks 0 and 2 entered the
    # all-reduce that rank 1 never did
    fr = told["flight_recorder"]
    assert [e["rank"] for e in fr["entered"]] == [0, 2] and [b["rank"] for b in fr["behind"]] == [1], fr
    assert fr["collective"] == "gloo:all_reduce" and fr["behind"][0]["last_seq"] == fr["seq"] - 1
    assert by_rank[1]["death"]["hang"]["flight_recorder"]["file"] == str(tmp_path / "fr_1")
    assert not any("TORCH_FR_BUFFER_SIZE" in lever for lever in by_rank[1]["death"]["levers"])  # it is on
    assert f"entered gloo:all_reduce #{fr['seq']} (process group 0); rank 1's last was #{fr['seq'] - 1}" in summary
    # AND the job-wide account over the node bundle, which reads its metadata as untrusted input, says the same
    from blackbox._postmortem import job_account

    _, job, text = job_account([str(next(runs.glob("run-*/bundle")))])
    assert (job["cause"], job["first_death"]["rank"]) == ("hang", 1)
    assert "**A hang:** rank 1 made no progress for " in text and "- ranks 0 and 2 waited for it from step 20" in text
    assert f"rank 1's last was #{fr['seq'] - 1}" in text
    assert "cause: hang; The main process (pid " in armed.err


PREPARE_JOB = """\
import os, signal, sys, threading
import torch, torch.distributed as dist

if sys.argv[2] == "handler":  # a checkpoint on SIGTERM, then exit: the rank's end is its own handler's
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))

def prepare_data(rank):
    if rank == 1:
        open(sys.argv[1], "w").close()  # the planted truth: rank 1 is stuck from now on, before any step
        threading.Event().wait()  # PLANT: its data preparation never returns
    return torch.ones(4)

dist.init_process_group("gloo")
rank = dist.get_rank()
x = prepare_data(rank)
os.write(1, f"rank {rank} prepared\\n".encode())  # one write: torchrun's `python -u` splits a print in two
dist.barrier()  # ranks 0 and 2 wait here for rank 1
os.write(1, f"rank {rank} trained\\n".encode())
"""


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
@pytest.mark.parametrize("on_sigterm", ["default", "handler"])
def test_a_rank_stuck_before_its_first_step_is_named_by_the_ranks_that_waited_for_it(
    tmp_path: Path, on_sigterm: str
) -> None:
    pytest.importorskip("torch.distributed")
    # GIVEN 3 gloo ranks under torchrun that count no steps: rank 1 stuck in its data preparation, ranks 0 and 2 in
    # the barrier; `timeout` ends the job 12 s later (a stack unchanged for 10 s is a stall without steps), unarmed
    # and under `blackbox run`; each rank ended by torchrun's SIGTERM, or by its own handler of it (sys.exit(143):
    # it read "rank 1 exited with status 143 ... a graceful shutdown", the first death)
    unarmed, armed, runs = _torchrun_both(tmp_path, PREPARE_JOB, [on_sigterm], stuck_for=12.5)
    script = tmp_path / "train.py"
    # THEN the job ends as it does unarmed: timeout's status, the same lines printed
    assert unarmed.returncode == armed.returncode == 124, (unarmed.err[-2000:], armed.err[-3000:])
    assert sorted(unarmed.out.splitlines()) == sorted(armed.out.splitlines()) == [f"rank {r} prepared" for r in (0, 2)]
    # AND rank 1 hung there, told by the ranks that waited for it, "probable" (no steps timed it); it read "ranks 0
    # to 2 stopped by pid N (torchrun) as it went down", torchrun's agent the first death
    meta = _bundle(runs)
    first, line = meta["first_death"], PREPARE_JOB.splitlines().index(
        "        threading.Event().wait()  # PLANT: its data preparation never returns") + 1
    assert (meta["cause"], first["rank"], first["cause"], first["confidence"]) == ("hang", 1, "hang", "probable"), first
    assert first["hang"]["site"] == f"prepare_data ({script}:{line})" and first["hang"]["step"] is None
    assert 10.0 <= first["hang"]["stalled_s"] <= 12.5 + 30, first["hang"]
    ended = "SIGTERM from torchrun ended it." if on_sigterm == "default" else "its own handler ended it."
    assert first["headline"].endswith(ended) and f"stuck in prepare_data (train.py:{line}); then " in first["headline"]
    (attempt,) = meta["attempts"]
    assert sorted((w["rank"], w["collective"]) for w in attempt["hang"]["waited"]) == [(0, "barrier"), (2, "barrier")]
    by_rank = {m["rank"]: m for m in meta["rings"]}
    assert all(by_rank[r]["death"]["collateral_of"]["rank"] == 1 for r in (0, 2, None))
    # AND its own ring's death, ranks.parquet and the summary's detail say the same, with a hang's levers
    own = by_rank[1]["death"]
    assert (own["cause"], own["confidence"], own["headline"]) == ("hang", "probable", first["headline"])
    assert own["levers"][0].startswith(f"look at prepare_data (train.py:{line}): the main thread was there in every "
                                       "stack sample"), own["levers"]  # (no steps: a wait or a loop on one line)
    import pyarrow.parquet as pq

    table = pq.read_table(next(runs.glob("run-*/bundle")) / "ranks.parquet").to_pylist()
    assert [(r["rank"], r["cause"]) for r in sorted(table, key=lambda r: r["pid"]) if r["rank"] == 1] == [(1, "hang")]
    summary = meta["_summary"]
    assert "**A hang:** rank 1 made no progress for " in summary and ", before any step)" in summary, summary[:3000]
    assert "- ranks 0 and 2 waited for it, in barrier" in summary and "- 1 rank `hang` (the first death)" in summary
    assert "ranks 0 and 2 stopped by torchrun after rank 1 hung" in summary, summary[:3000]
    assert "- then torchrun (pid " in summary and ") sent SIGTERM to ranks 0 to 2 at " in summary, summary[:3000]
    assert "Cause `hang` (a hang: no progress for a long time, then ended from outside), confidence probable" in summary
    # AND the job-wide account over the node bundle says the same
    from blackbox._postmortem import job_account

    _, job, text = job_account([str(next(runs.glob("run-*/bundle")))])
    assert (job["cause"], job["first_death"]["rank"]) == ("hang", 1)
    assert "- 1 rank `hang` (the first death)" in text and "confidence probable" in text, text[:3000]


LOCKED = """\
import sys, threading, time
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
lock = threading.Lock()
lock.acquire()  # a lock another thread was meant to release

def next_batch(step):
    if step == 30:
        open(sys.argv[2], "w").close()  # the planted truth: stuck from now on
        lock.acquire()
    return step

for step in range(10**6):
    blackbox.step(step)
    next_batch(step)
    print(step, flush=True)
    time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.parametrize("kill", [[], ["-s", "KILL"]], ids=["timeout", "timeout -s KILL"])
def test_a_single_process_stuck_on_a_lock_is_a_hang_not_a_signal_death(tmp_path: Path, kill: list[str]) -> None:
    # GIVEN a job stuck on a lock at step 30, ended by timeout (SIGTERM, or SIGKILL), unarmed and armed
    (tmp_path / "job.py").write_text(LOCKED)
    (tmp_path / "unarmed.py").write_text(LOCKED.replace('blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)', "0"))
    procs = [subprocess.Popen(["timeout", *kill, "120", sys.executable, str(tmp_path / name), str(tmp_path / "rings"),
                               str(tmp_path / f"{name}.stuck")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=ENV) for name in ("unarmed.py", "job.py")]  # fmt: skip
    for name, proc in zip(("unarmed.py", "job.py"), procs, strict=True):  # side by side, ended together
        while not (tmp_path / f"{name}.stuck").exists() and proc.poll() is None:
            time.sleep(0.05)
    time.sleep(STUCK_FOR)
    for proc in procs:
        proc.send_signal(signal.SIGALRM)
    (out0, err0), (out1, err1) = [proc.communicate(timeout=60) for proc in procs]
    # THEN it ends as it does unarmed (`timeout -s KILL` kills its own process group, itself too)
    status0, status1 = (proc.returncode for proc in procs)
    assert status0 == status1 == (124 if not kill else -signal.SIGKILL), (status0, status1, err0, err1)
    assert out0 == out1 == "".join(f"{i}\n" for i in range(30)) and err0 == err1 == ""
    # AND the verdict is a hang: no step for about as long as planted, stuck in next_batch, ended by timeout
    from blackbox.recovery.pipeline import recover_rings

    death = recover_rings([tmp_path / "rings"]).meta["death"]
    assert (death["cause"], death["confidence"], death["step"]) == ("hang", "strong", 30), death
    assert death["hang"]["site"].startswith("next_batch (") and death["hang"]["collective"] is None
    # (a SIGKILL's time is the last record's: the last sample, up to a sample interval before the kill)
    assert STUCK_FOR - 0.5 <= death["hang"]["stalled_s"] <= STUCK_FOR + 20, death["hang"]
    line = next(i for i, ln in enumerate(LOCKED.splitlines(), 1) if ln.strip() == "lock.acquire()" and i > 5)
    ender = "SIGTERM from timeout" if not kill else "SIGKILL"
    assert death["headline"].endswith(f"stuck in next_batch (job.py:{line}); then {ender} ended it."), death
    assert len(list((tmp_path / "rings").glob("*.ring"))) == 1  # the unarmed run left none
    assert death["levers"] == [f"look at next_batch (job.py:{line}): the process stayed there for "
                               f"{death['hang']['stalled_s']:.0f} s (waiting on a data source, a lock or I/O, or "
                               "looping on that one line)"]  # fmt: skip


HANDLED = """\
import signal, sys, threading, time
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
if sys.argv[4] == "interrupt":  # Python's SIGINT handler for SIGTERM too: a KeyboardInterrupt ends it
    signal.signal(signal.SIGTERM, signal.default_int_handler)
else:  # a checkpoint on SIGTERM, then exit
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(int(sys.argv[4])))
lock = threading.Lock()
lock.acquire()

for step in range(10**6):
    blackbox.step(step)
    if step == 30:
        open(sys.argv[2], "w").close()  # the planted truth: stuck from now on, or at work as ever
        if sys.argv[3] == "stuck":
            lock.acquire()  # PLANT: stuck
    time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.parametrize(("state", "handler"), [("stuck", "143"), ("training", "143"), ("stuck", "0"),
                                                 ("stuck", "interrupt")])  # fmt: skip
def test_a_job_whose_handler_exits_on_sigterm_is_a_hang_only_where_it_had_stopped(
    tmp_path: Path, state: str, handler: str
) -> None:
    # GIVEN a job whose SIGTERM handler exits (status 143 or 0, or raises KeyboardInterrupt), stuck on a lock at
    # step 30 or training on, ended by `timeout` (SIGTERM) 3 s later (a red team's exit 0 read "exited cleanly ...
    # a graceful shutdown", its KeyboardInterrupt "interrupted (Ctrl-C or SIGINT)")
    (tmp_path / "job.py").write_text(HANDLED)
    stuck = tmp_path / "stuck"
    proc = subprocess.Popen(["timeout", "120", sys.executable, str(tmp_path / "job.py"), str(tmp_path / "rings"),
                             str(stuck), state, handler], env=ENV, stderr=subprocess.PIPE, text=True)  # fmt: skip
    while not stuck.exists() and proc.poll() is None:
        time.sleep(0.05)
    time.sleep(STUCK_FOR)
    proc.send_signal(signal.SIGALRM)  # (timeout acts as if its time had run out)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 124, err[-2000:]
    import blackbox

    blackbox.recover(tmp_path / "rings", tmp_path / "bundle")
    death = json.loads((tmp_path / "bundle" / "metadata.json").read_text())["death"]
    took = death["killed_by"] if handler == "interrupt" else death["handled_by"]  # (what raised its KeyboardInterrupt)
    assert took["signal"] == "SIGTERM" and took["sender"] == "timeout", death
    if state == "training":  # THEN a job at work that its handler ended is a graceful shutdown, no hang
        assert death["cause"] == "nonzero_exit" and "hang" not in death, death
        assert "after SIGTERM from timeout, which its own handler took (a graceful shutdown)" in death["headline"]
        return
    # THEN a stuck one hung (it read "exited with status 143 ... a graceful shutdown"): where, and that its handler
    # ended it when the SIGTERM came, 3 s after its last step
    line = HANDLED.splitlines().index("            lock.acquire()  # PLANT: stuck") + 1
    assert death["cause"] == "hang" and death["hang"]["step"] == 30, death
    assert STUCK_FOR - 0.5 <= death["hang"]["stalled_s"] <= STUCK_FOR + 20, death["hang"]
    assert f"hung: no step for {death['hang']['stalled_s']:.1f} s" in death["headline"], death["headline"]
    assert death["headline"].endswith(f"stuck in <module> (job.py:{line}); then SIGTERM from timeout came at "
                                      f"{death['hang']['handled']['time']}, and its own handler ended it."), death
    # (timeout sends its SIGTERM to the job, then to its group: the handler took two; the first is told)


BUSY = """\
import random, sys, time
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)

def attention(x):
    return sum(i * i for i in range(x))

def mlp(x):
    return sum(i + 1 for i in range(x))

def norm(x):
    return max(i % 7 for i in range(x))

def embed(x):
    return min(i - 3 for i in range(x))

def rotary(x):
    return sum(i & 5 for i in range(x))

def head(x):
    return max(i ^ 9 for i in range(x))

def evaluate(batches):  # a long evaluation: no optimizer step, the time spread over its layers (of sizes that
    for b in range(batches):  # vary, as batches do: a fixed loop's period can beat with the sampler's, one layer
        for layer in (embed, attention, rotary, mlp, norm, head):  # then taking every sample, seen under load)
            layer(random.randint(5000, 40000))

for step in range(40):
    blackbox.step(step)
    time.sleep(0.01)
open(sys.argv[2], "w").close()
while True:
    evaluate(10**6)
"""


# An evaluation as a model's really is: one layer (a matmul) takes most of its time, so most samples are there,
# yet the stack keeps moving between the layers (it read as stuck in that layer: "hung", before BUSY_MOVES)
SPREAD = "        for layer in (embed, attention, rotary, mlp, norm, head):"
DOMINATED = BUSY.replace(SPREAD, "        for layer in (embed, *[attention] * 12, mlp, head):  # attention: 80% of it")


@pytest.mark.slow
@pytest.mark.parametrize("job", [BUSY, DOMINATED], ids=["spread", "one-layer-dominates"])
def test_a_process_busy_without_steps_when_killed_keeps_its_cause(tmp_path: Path, job: str) -> None:
    # GIVEN a job that evaluates for seconds after its last step (its stack always changing), then the
    # scheduler's SIGTERM: no step for 30x its step time, but it was working, not stuck
    assert job == BUSY or ("[attention] * 12" in job and SPREAD not in job)
    # twice as long: enough stack samples, under load too, that no layer has half of them
    proc = _start_until_go(tmp_path, job, wait_s=2 * STUCK_FOR)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    from blackbox.recovery.pipeline import recover_rings

    death = recover_rings([tmp_path / "rings"]).meta["death"]
    # THEN its cause stays the signal, and the stall is kept, said busy, where it worked
    assert death["cause"] == "signal" and death["hang"]["busy"] is True, death
    assert death["hang"]["stalled_s"] >= STUCK_FOR - 0.5
    assert death["hang"]["share"] < 0.5 if job == BUSY else death["hang"]["share"] >= 0.5, death["hang"]
    said = " ".join(death["evidence"])
    assert "between consecutive samples): busy in " in said and ", not stuck (no hang called)" in said, said
    assert "hung" not in death["headline"]


BUSY_RANK = """\
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
import blackbox

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.Tanh(), torch.nn.Linear(256, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)

def evaluate():  # rank 0's evaluation through the DDP model, as nanoGPT's estimate_loss: at work, no step
    with torch.no_grad():
        while True:
            x = torch.randn(512, 64)
            loss = model(x).pow(2).mean()
            loss.item()

for step in range(10**6):
    blackbox.step(step)
    if step == 30 and rank == 0:
        os.write(1, b"rank 0 evaluates\\n")  # one write: the ranks share torchrun's stdout
        open(sys.argv[1], "w").close()
        evaluate()
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward()  # ranks 1 and 2 wait here, in DDP's all-reduce, for rank 0's evaluation
    opt.step()
    opt.zero_grad()
    time.sleep(0.02)
"""


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
def test_ranks_that_waited_for_a_rank_at_work_when_the_time_limit_came_name_no_hang_and_no_rank_first(
    tmp_path: Path,
) -> None:
    pytest.importorskip("torch.distributed")
    # GIVEN 3 gloo DDP ranks under torchrun: at step 30 rank 0 evaluates through the DDP model (its stack moving),
    # ranks 1 and 2 wait for it in the next step's backward, until `timeout` ends torchrun (a time limit), unarmed
    # and under `blackbox run` (nanoGPT's shape: only its master process evaluates)
    unarmed, armed, runs = _torchrun_both(tmp_path, BUSY_RANK, [], stuck_for=2 * STUCK_FOR)
    script = tmp_path / "train.py"
    # THEN the job ends as it does unarmed
    assert unarmed.returncode == armed.returncode == 124, (unarmed.err[-2000:], armed.err[-3000:])
    assert unarmed.out == armed.out == "rank 0 evaluates\n"
    # AND timeout's SIGTERM to torchrun is the first death, the three ranks stopped by it: none failed, none hung (it
    # read "rank 0 was ended by SIGTERM from pt_elastic (a scheduler ...)", the first death, "A hang: rank 0 ...")
    meta = _bundle(runs)
    first = meta["first_death"]
    assert (first["rank"], first["cause"]) == (None, "signal"), first
    assert first["headline"].startswith(f"The torchrun agent (pid {first['pid']}) was ended by SIGTERM from timeout")
    by_rank = {m["rank"]: m for m in meta["rings"] if m["rank"] is not None}
    assert all(by_rank[r]["death"]["collateral_of"]["pid"] == first["pid"] for r in range(3)), by_rank
    assert by_rank[0]["death"]["cause"] == "signal" and not by_rank[0]["death"]["headline"].count("hung")
    # AND the wait is told beside: rank 0 at work, in its evaluation (DDP's forward with the job's model deeper: it
    # read as a wait in a collective, so no rank was the one waited for); ranks 1 and 2 waited for it in backward
    (attempt,) = meta["attempts"]
    hang = attempt["hang"]
    assert hang["busy"] is True and [s["rank"] for s in hang["stuck"]] == [0], hang
    waited = "backward (where DDP all-reduces the gradients)"
    assert sorted((w["rank"], w["collective"]) for w in hang["waited"]) == [(1, waited), (2, waited)], hang
    assert hang["stuck"][0]["work"] == f"evaluate ({script})" and hang["stuck"][0]["collective"] is None, hang
    summary = meta["_summary"]
    assert "**Waiting for a rank at work:** rank 0 took no step for " in summary and "**A hang" not in summary
    assert f"- ranks 1 and 2 waited for it from step 30, in {waited}" in summary, summary[:3000]
    assert "at work in `evaluate (train.py)`, its stack changing all along" in summary, summary[:3000]
    # AND ranks 1 and 2, a hang by their own stall, were ended by torchrun's SIGTERM as they waited for rank 0: no
    # hang of their own (they read "hung: no step for 6.0 s ... waiting in backward"), in ranks.parquet too
    import pyarrow.parquet as pq

    rows = {r["rank"]: r for r in pq.read_table(next(runs.glob("run-*/bundle")) / "ranks.parquet").to_pylist()}
    for r in (1, 2):
        own = by_rank[r]["death"]
        assert (own["cause"], own["waited_for"]["rank"], rows[r]["cause"]) == ("signal", 0, "signal"), own
        assert own["headline"].endswith("for rank 0, at work in evaluate (train.py): no hang of its own."), own
    # AND rank 0's SIGTERM is its launcher's stopping of its ranks, not a scheduler's time limit
    said = " ".join(by_rank[0]["death"]["evidence"])
    assert "(the launcher stopping its ranks: " in said and "a scheduler" not in said, said


GIL_HELD = """\
import re, sys, time
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
for step in range(40):
    blackbox.step(step)
    time.sleep(0.01)
end = time.monotonic() + 1.0
while time.monotonic() < end:  # a second of work at this line: its stack samples come before the plant
    pass
open(sys.argv[2], "w").close()
re.match(r"(a+)+$", "a" * 40 + "b")  # PLANT: minutes in C, the GIL held: the stack sampler cannot run
"""


@pytest.mark.slow
def test_a_stall_that_starved_the_stack_sampler_names_no_place_from_before_it(tmp_path: Path) -> None:
    # GIVEN a job that, after 40 steps and a second of work, runs a regex for minutes in C with the GIL held (as
    # torch.save into a pipe does), SIGTERMed 3 s in: its stack sampler, a Python thread, sampled only the work
    proc = _start_until_go(tmp_path, GIL_HELD)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    from blackbox.recovery.pipeline import recover_rings

    death = recover_rings([tmp_path / "rings"]).meta["death"]
    # THEN a hang, with no place named from the samples taken before it (it read "stuck in <module> (job.py:9)",
    # the second of work's line, confidence strong)
    hang = death["hang"]
    assert death["cause"] == "hang" and hang["site"] is None and hang["samples"] >= 3, (hang, death["evidence"])
    assert death["hang"]["unsampled_s"] >= STUCK_FOR - 0.5 and "no stack was sampled" in death["headline"], death
    assert "not where it stopped, which no sample says" in " ".join(death["evidence"])


TIMEOUTS = {"gloo": ({"PG_TIMEOUT_S": "5"}, "Timed out waiting 5000ms for ", "exception"),
            "watchdog abort": ({"ABORT_AFTER_S": "3"}, "SIGABRT while it waited in a collective", "signal")}


@pytest.mark.slow
@pytest.mark.skipif(not TORCHRUN.exists(), reason="no torchrun beside this Python")
@pytest.mark.parametrize("how", list(TIMEOUTS))
def test_ranks_whose_collective_timed_out_waited_for_the_stuck_rank(tmp_path: Path, how: str) -> None:
    pytest.importorskip("torch.distributed")
    script = tmp_path / "train.py"
    script.write_text(DDP_JOB)
    setting, told, cause = TIMEOUTS[how]
    # GIVEN the same job where the collective times out: gloo's timeout at 5 s (ranks 0 and 2 raise gloo's "Timed
    # out waiting" in backward), or a watchdog thread that aborts a rank 3 s into a collective, as NCCL's does;
    # then torchrun stops rank 1, still stuck; unarmed and under `blackbox run`, side by side
    env = dict(ENV, **setting)
    runs = tmp_path / "runs"
    procs = [subprocess.Popen([*launcher, str(TORCHRUN), "--nproc-per-node=3", "--max-restarts=0",
                               "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", str(script),
                               str(tmp_path / f"stuck{i}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
             for i, launcher in enumerate([[], [sys.executable, "-m", "blackbox", "run", "--dir", str(runs), "--"]])]
    (out0, err0), (out1, err1) = [p.communicate(timeout=240) for p in procs]  # fmt: skip
    # THEN it ends as it does unarmed: torchrun's failure, the timeout in both logs
    assert procs[0].returncode == procs[1].returncode == 1, (err0[-2000:], err1[-3000:])
    assert sorted(out0.splitlines()) == sorted(out1.splitlines())
    shown = "Timed out waiting 5000ms" if how == "gloo" else "exitcode  : -6"
    assert shown in err0 and shown in err1, (err0[-2000:], err1[-2000:])
    # AND the first death is rank 1's hang, not the timeouts that came first; ranks 0 and 2 waited and timed out
    meta = _bundle(runs)
    first, (attempt,) = meta["first_death"], meta["attempts"]
    deaths = [(m["rank"], m["role"], m["death"]["cause"], m["death"]["headline"], m["death"].get("time"),
               m["death"].get("hang")) for m in meta["rings"]]  # fmt: skip
    assert (meta["cause"], first["rank"], first["cause"]) == ("hang", 1, "hang"), json.dumps(deaths, default=str)
    assert first["hang"]["site"].startswith("wait_for_batch (")
    # (the first to time out ends the wait: the other may time out too, or be stopped by torchrun first)
    waited = {w["rank"]: w for w in attempt["hang"]["waited"]}
    assert set(waited) == {0, 2} and all(w["step"] == 20 for w in waited.values()), json.dumps(attempt["hang"],
                                                                                              default=str)
    timed_out = [w for w in waited.values() if w["timed_out"]]
    assert timed_out and all(told in w["timed_out"] for w in timed_out), waited
    by_rank = {m["rank"]: m for m in meta["rings"]}
    assert {by_rank[w["rank"]]["death"]["cause"] for w in timed_out} == {cause}  # what happened to them
    if how == "watchdog abort":
        assert all("died of SIGABRT in native code, called from aborter (train.py:" in by_rank[w["rank"]]["death"][
            "headline"] for w in timed_out)  # fmt: skip
    assert (attempt["deaths"], attempt["collateral"]) == (1, 3)
    summary = meta["_summary"]
    assert "**First death: rank 1 " in summary and "waited for it from step 20, then timed out (" in summary
    levers = by_rank[1]["death"]["levers"]  # where to look; the recorder, off here, named for the next hang
    assert levers[0].startswith("look at wait_for_batch (train.py:") and "TORCH_FR_BUFFER_SIZE=2000" in levers[-1]


SLOW_SHUTDOWN = """\
import signal, sys, time
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)

def slow_save(signum, frame):  # a checkpoint on SIGTERM that takes longer than the grace before SIGKILL
    print("saving", flush=True)
    time.sleep(60)

signal.signal(signal.SIGTERM, slow_save)
for step in range(100000):
    blackbox.step(step)
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_graceful_shutdown_killed_before_it_finished_is_no_hang(tmp_path: Path) -> None:
    # GIVEN a job whose SIGTERM handler saves for longer than the grace `timeout -k 3` gives it before SIGKILL
    (tmp_path / "job.py").write_text(SLOW_SHUTDOWN)
    job = [sys.executable, str(tmp_path / "job.py"), str(tmp_path / "rings")]
    proc = subprocess.run(["timeout", "-k", "3", "3", *job], env=ENV, capture_output=True, text=True, timeout=60)
    # (timeout kills itself too; it sends SIGTERM to the job and then to its group: a handler that ran between the
    # two, the CPU given to the job between timeout's two calls under load, runs again, as it would unarmed)
    assert proc.returncode == -signal.SIGKILL and proc.stdout in ("saving\n", "saving\nsaving\n"), proc
    from blackbox.recovery.pipeline import recover_rings

    death = recover_rings([tmp_path / "rings"]).meta["death"]
    # THEN it was killed in its shutdown, not hung ("hung ... stuck in slow_save" before): the signal its handler
    # took, from timeout, how long the shutdown had, and where it still was; the first lever says so
    assert death["cause"] == "killed" and "hung" not in death["headline"], death
    shutdown = death["hang"]["shutdown"]
    assert (shutdown["signal"], shutdown["sender"]) == ("SIGTERM", "timeout") and 2.5 <= shutdown["lasted_s"] <= 6
    assert death["hang"]["site"].startswith("slow_save") and "outlasted the grace" in death["levers"][0], death
    # AND `blackbox recover` says the same (without pandas, where a ns time read into Python failed)
    cli = subprocess.run([sys.executable, "-m", "blackbox", "recover", str(tmp_path / "rings"), "-o",
                          str(tmp_path / "out")], env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert cli.returncode == 0 and "outlasted the grace" in (tmp_path / "out" / "summary.md").read_text(), cli.stderr


HUNG_THEN_FLAGGED = """\
import signal, sys, threading, time
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
stop = []
signal.signal(signal.SIGTERM, lambda s, f: stop.append(s))  # Lightning's way: a flag the loop reads
for step in range(1000):
    if stop:
        break
    blackbox.step(step)
    if step == 30:
        open(sys.argv[2], "w").close()
        threading.Event().wait()  # its data source never answers: hung here, long before the SIGTERM
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_job_hung_long_before_its_handler_took_the_sigterm_is_a_hang(tmp_path: Path) -> None:
    # GIVEN a job hung for STUCK_FOR seconds, then sent SIGTERM (its handler sets a flag nobody reads), then
    # SIGKILL 1 s later
    proc = _start_until_go(tmp_path, HUNG_THEN_FLAGGED)
    proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)
    proc.kill()
    assert proc.wait(timeout=30) == -signal.SIGKILL
    from blackbox.recovery.pipeline import recover_rings

    death = recover_rings([tmp_path / "rings"]).meta["death"]
    # THEN it is a hang at step 30 (it read "the shutdown outlasted its grace"), no shutdown told
    assert death["cause"] == "hang" and death["step"] == 30 and "shutdown" not in death["hang"], death


LOADER_HANG = """\
import sys, threading, time
import torch
from torch.utils.data import DataLoader, Dataset
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)

class Items(Dataset):
    def __len__(self): return 10000
    def __getitem__(self, i):
        if i == 80:  # batch 10 never comes: its worker blocks forever
            open(sys.argv[2], "w").write(str(__import__("os").getpid()))  # (the test ends it: nothing else will)
            threading.Event().wait()
        time.sleep(0.001)
        return torch.randn(4)

for step, batch in enumerate(DataLoader(Items(), batch_size=8, num_workers=2, multiprocessing_context="fork")):
    blackbox.step(step)
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_a_main_process_waiting_for_a_stuck_dataloader_worker_is_said_to_wait_for_it(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    # GIVEN a DataLoader worker stuck in the dataset at batch 10, its main process waiting for that batch, until
    # the scheduler's SIGTERM
    proc = _start_until_go(tmp_path, LOADER_HANG, stderr=subprocess.DEVNULL)
    proc.send_signal(signal.SIGTERM)
    try:
        assert proc.wait(timeout=60) == -signal.SIGTERM
    finally:  # the stuck worker never looks for its parent again: it would be left running
        with contextlib.suppress(OSError, ValueError):
            os.kill(int((tmp_path / "go").read_text()), signal.SIGKILL)
    from blackbox.recovery.pipeline import recover_rings

    death = recover_rings([tmp_path / "rings"]).meta["death"]
    # THEN a hang at step 9 whose process waited for a batch from its DataLoader's workers (it read "stuck in
    # <module>": the loop's line), with the dataset to look at first
    assert death["cause"] == "hang" and death["hang"]["loader"] is True and death["step"] == 9, death
    assert "waiting for a batch from its DataLoader's workers" in death["headline"], death["headline"]
    assert death["levers"][0].startswith("look at the dataset's __getitem__"), death["levers"]


STEPLESS = """\
import sys, threading, time
import blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.05)
lock = threading.Lock()

def stuck_here():
    lock.acquire()
    lock.acquire()  # a deadlock: the planted truth

def parse(n):
    return sum(i * i for i in range(n))

def shuffle(n):
    return max(i % 7 for i in range(n))

for i in range(20):  # a job that counts no steps (no optimizer, no blackbox.step): a data pass
    time.sleep(0.05)
open(sys.argv[2], "w").close()
if sys.argv[3] == "stuck":
    stuck_here()
while True:
    parse(30000)
    shuffle(30000)
"""


@pytest.mark.slow
@pytest.mark.parametrize("state", ["stuck", "working"])
def test_a_job_without_steps_is_told_where_its_stack_stayed(tmp_path: Path, state: str) -> None:
    # GIVEN a job that counts no steps, stuck on a lock (or working), ended by the scheduler's SIGTERM after 12 s
    proc = _start_until_go(tmp_path, STEPLESS, state, wait_s=12)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == -signal.SIGTERM
    from blackbox.recovery.pipeline import recover_rings

    death = recover_rings([tmp_path / "rings"]).meta["death"]
    assert death["cause"] == "signal", death  # no steps to time progress by: no hang is called either way
    if state == "working":  # THEN working, its stack changing: no stall is told
        assert death.get("hang") is None, death["hang"]
        return
    # THEN stuck: the place where its stack stayed, in every sample for about the 12 s, is the first lever
    line = next(i for i, ln in enumerate(STEPLESS.splitlines(), 1) if "a deadlock" in ln)
    assert (death["hang"]["step_s"], death["hang"]["busy"]) == (None, None), death["hang"]
    assert death["hang"]["site"] == f"stuck_here ({tmp_path / 'job.py'}:{line})", death["hang"]
    assert 10.0 <= death["hang"]["stalled_s"] <= 14.0, death["hang"]
    assert death["levers"][0].startswith(f"look at stuck_here (job.py:{line}): the main thread was there in every "
                                         "stack sample for the last "), death["levers"]


AGENT_STACK = ";".join([  # torchrun's agent as `blackbox run` records it, monitoring its ranks (torch 2.13)
    "<module> (/venv/bin/torchrun:6)", "main (/venv/lib/python3.11/site-packages/torch/distributed/run.py:936)",
    "run (/venv/lib/python3.11/site-packages/torch/distributed/run.py:927)",
    "__call__ (/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py:156)",
    "launch_agent (/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py:374)",
    "wrapper (/venv/lib/python3.11/site-packages/torch/distributed/elastic/metrics/api.py:138)",
    "run (/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py:711)",
    "_invoke_run (/venv/lib/python3.11/site-packages/torch/distributed/elastic/agent/server/api.py:870)",
])
RANK_STACK = ";".join([
    "main (/job/train.py:43)", "backward (/venv/lib/python3.11/site-packages/torch/_tensor.py:630)",
    "all_reduce (/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py:2800)",
])


def test_collective_of_names_a_ranks_collective_and_never_torchruns_own_loop() -> None:
    from blackbox.recovery.hang import collective_of

    # (the agent's stack, unchanged for 10 s while its ranks hung, was listed among the ranks that waited)
    assert collective_of(AGENT_STACK, ranked=False) is None
    assert collective_of(RANK_STACK, ranked=True) == "all_reduce"


def _at(seconds: float) -> str:
    return f"2026-11-30T05:43:{seconds:09.6f}Z"


def test_torchruns_agent_is_neither_the_stuck_rank_nor_a_waiter() -> None:
    from blackbox.recovery.stuck_rank import attempt_hang

    # GIVEN the deaths of a torchrun job where rank 1 stalled at step 20 (since 20 s), ranks 0 and 2 waited in
    # the all-reduce until a watchdog aborted them (23 s), the agent then stopped rank 1 (24 s) and raised
    # ChildFailedError (25 s), its stack unchanged in its monitoring loop since 5 s
    def ring(rank: int | None, pid: int, cause: str, time: float, **hang: Any) -> dict[str, Any]:
        return {"rank": rank, "host": "vm", "pid": pid, "ppid": 1 if rank is None else 10,
                "death": {"cause": cause, "time": _at(time), "hang": {"step": 20, "step_s": 0.02, **hang}}}

    waited = {"since": _at(20), "stalled_s": 3.0, "collective": "backward (where DDP all-reduces the gradients)",
              "timed_out": "SIGABRT while it waited in a collective"}  # fmt: skip
    agent = ring(None, 10, "exception", 25, since=_at(5), stalled_s=20.0, step=None, step_s=None,
                 site="launch_agent (api.py:374)", collective=None, timed_out=None, stack=AGENT_STACK)
    stuck = ring(1, 12, "hang", 24, since=_at(20), stalled_s=4.0, site="wait_for_batch (train.py:8)",
                 collective=None, timed_out=None, stack="main (train.py:39);wait_for_batch (train.py:8)")
    stuck["death"]["killed_by"] = {"signal": "SIGTERM", "sender": "pt_elastic", "sender_pid": 10, "time": _at(24)}
    dead = [agent, ring(0, 11, "signal", 23, **waited), stuck, ring(2, 13, "signal", 23, **waited)]
    # WHEN the attempt's hang is read
    found = attempt_hang(dead)
    # THEN rank 1 is the stuck one, ranks 0 and 2 waited, and the agent is neither (it was the stuck process)
    assert found is not None
    first, collateral, info = found
    assert first is stuck and agent in collateral
    assert [w["rank"] for w in info["stuck"]] == [1] and sorted(w["rank"] for w in info["waited"]) == [0, 2]


@pytest.mark.parametrize(("role", "said"), [("torchrun agent", "torchrun"),
                                            ("accelerate launcher", "accelerate launch"), (None, "torchrun")])
def test_a_stuck_ranks_headline_names_its_launcher_not_the_agents_thread(role: str | None, said: str) -> None:
    from blackbox.recovery.attempts import deaths

    # GIVEN rank 1 stalled at step 20 and stopped by SIGTERM from its launcher's agent thread (pt_elastic, pid 10),
    # ranks 0 and 2 waiting in the all-reduce; the launcher's own ring names it (or is not in the attempt)
    def ring(rank: int, pid: int, cause: str, **hang: Any) -> dict[str, Any]:
        return {"rank": rank, "host": "vm", "pid": pid, "ppid": 10, "death": {
            "cause": cause, "time": _at(24), "victim": {"pid": pid, "role": "main process"},
            "killed_by": {"signal": "SIGTERM", "sender": "pt_elastic", "sender_pid": 10, "time": _at(24)},
            "hang": {"step": 20, "step_s": 0.02, "since": _at(20), "stalled_s": 4.0, "timed_out": None, **hang}}}

    waited = {"collective": "backward (where DDP all-reduces the gradients)", "site": None}
    stuck = ring(1, 12, "hang", site="wait_for_batch (train.py:8)", collective=None,
                 stack="main (train.py:39);wait_for_batch (train.py:8)")
    group = [ring(0, 11, "signal", **waited), stuck, ring(2, 13, "signal", **waited)]
    if role is not None:
        group.append({"rank": None, "host": "vm", "pid": 10, "ppid": 1, "death": {
            "cause": "signal", "time": _at(25), "victim": {"pid": 10, "role": role}}})
    # WHEN the attempt's deaths are read
    first, _, _ = deaths(group)
    # THEN the headline says the launcher ended the stuck rank (it said "SIGTERM from pt_elastic")
    assert first is stuck
    assert stuck["death"]["headline"].endswith(f"stuck in wait_for_batch (train.py:8); then SIGTERM from {said} "
                                               "ended it."), stuck["death"]["headline"]  # fmt: skip


POOL_HANG = """\
import multiprocessing as mp, os, sys, time
import blackbox

def work(i):
    if i == 3:  # one task never returns: the planted truth
        open(sys.argv[1], "w").write(str(os.getpid()))
        time.sleep(1000)  # PLANT
    return i * i

if __name__ == "__main__":
    with mp.Pool(2) as pool:
        for step in range(1000):
            blackbox.step(step)
            pool.map(work, [1, 2] if step < 20 else [3, 4])
            time.sleep(0.02)
"""


@pytest.mark.slow
def test_a_pool_worker_stuck_in_its_task_is_named_not_the_main_process_waiting_for_it(tmp_path: Path) -> None:
    # GIVEN a Pool job under `blackbox run` whose worker never returns from one task at step 20, the main process
    # waiting in pool.map and the other worker idle, until SIGTERM to its process group (as `timeout` sends it:
    # to its child, then its group; a SIGTERM to the main alone leaves the workers running); the stuck worker has
    # no steps of its own, so it must keep one stack for 10 s before it can be said to be stuck
    job, go = tmp_path / "job.py", tmp_path / "go"
    job.write_text(POOL_HANG)
    run = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "runs"), "--"]
    proc = subprocess.Popen([*run, sys.executable, str(job), str(go)], env=ENV, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        while not go.exists() and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(12.0)
        proc.send_signal(signal.SIGTERM)
        os.killpg(proc.pid, signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(go.read_text()), signal.SIGKILL)
    assert proc.returncode == -signal.SIGTERM, err  # (blackbox run ends by the job's signal, as the job did)
    (bundle,) = (tmp_path / "runs").glob("run-*/bundle")
    meta = json.loads((bundle / "metadata.json").read_text())
    # THEN the first death is that worker, hung at the planted line (it read "the main process ... stuck in
    # <module>", the three processes lumped together), and the main process and the idle worker waited for it
    first, line = meta["first_death"], POOL_HANG.splitlines().index("        time.sleep(1000)  # PLANT") + 1
    assert first["pid"] == int(go.read_text()) and first["cause"] == "hang", first
    assert f"stuck in work (job.py:{line})" in first["headline"], first["headline"]
    hang = meta["attempts"][-1]["hang"]
    assert len(hang["waited"]) == 2 and all(w["pid"] != first["pid"] for w in hang["waited"]), hang


SAVER_HANG = """\
import sys, threading, time
from concurrent.futures import ThreadPoolExecutor
import blackbox

never = threading.Event()
pool = ThreadPoolExecutor(2, thread_name_prefix="prefetch")  # idle threads waiting for tasks, in the stdlib only
pool.submit(time.sleep, 0).result()

def save(step):
    open(sys.argv[1], "w").close()  # the planted truth: the saver is stuck from now on
    never.wait()  # PLANT: the checkpoint's upload never returns

def heartbeat():
    while True:
        time.sleep(0.1)  # a thread of the job's own that stands still too: never the one named

if sys.argv[2] == "uploader":  # the joined thread runs a library's code alone, a heartbeat of the job's beside it
    threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()

for step in range(10**6):
    blackbox.step(step)
    if step == 30:
        if sys.argv[2] == "uploader":
            open(sys.argv[1], "w").close()
            saver = threading.Thread(target=never.wait, name="uploader")  # (the standard library's frames alone)
        else:
            saver = threading.Thread(target=save, args=(step,), name="saver")
        saver.start()
        saver.join()  # the main thread waits for its saver
    print(step, flush=True)
    time.sleep(0.01)
"""


@pytest.mark.slow
@pytest.mark.parametrize("joined", ["saver", "uploader"])
def test_a_main_thread_waiting_for_its_stuck_saver_thread_names_the_saver_and_its_line(
    tmp_path: Path, joined: str
) -> None:
    # GIVEN a job under `blackbox run` with the defaults (only its main thread's stack is sampled, every tick)
    # whose checkpoint thread never returns at step 30 while the main thread joins it, two idle pool threads
    # beside (for `uploader`: the joined thread runs Event.wait, the standard library's code alone, and a
    # heartbeat thread of the job's own stands still beside it); and the same job unarmed; both ended by
    # `timeout` (SIGTERM) once stuck a while
    job = tmp_path / "job.py"
    job.write_text(SAVER_HANG)
    run = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "runs"), "--"]
    jobs = [([*run, sys.executable, str(job), str(tmp_path / "armed"), joined], tmp_path / "armed", {}),
            ([sys.executable, str(job), str(tmp_path / "unarmed"), joined], tmp_path / "unarmed", {})]  # fmt: skip
    procs = _end_when_stuck(jobs, stuck_for=8.0)  # other threads are sampled once the main one stood still 2 s
    # THEN it ends as it does unarmed, with the same output
    assert procs[0].returncode == procs[1].returncode == 124, [(p.returncode, p.err[-2000:]) for p in procs]
    assert procs[0].out == procs[1].out == "".join(f"{i}\n" for i in range(30))
    # AND the verdict names the saver thread and its planted line, not only the main thread's join
    death = _bundle(tmp_path / "runs")["death"]
    plant = SAVER_HANG.splitlines().index("    never.wait()  # PLANT: the checkpoint's upload never returns") + 1
    join = SAVER_HANG.splitlines().index("        saver.join()  # the main thread waits for its saver") + 1
    assert (death["cause"], death["step"]) == ("hang", 30), death
    hang = death["hang"]
    assert hang["joins"] and not hang["waits"] and hang["threads"][0]["thread"] == joined, hang
    assert hang["threads"][0]["joined"] and hang["threads"][0]["samples"] >= 3, hang["threads"]
    if joined == "uploader":  # (before the join was marked, the heartbeat was named: the one stuck at the job's code)
        assert f"waiting in <module> (job.py:{join}) for its thread 'uploader', in " in death["headline"], death
        assert "threading.py:" in death["headline"] and "heartbeat" not in death["headline"], death["headline"]
        return
    assert (f"waiting in <module> (job.py:{join}) for its thread 'saver', stuck in save (job.py:{plant}); "
            "then SIGTERM from timeout ended it.") in death["headline"], death["headline"]
    assert hang["threads"][0]["stuck"] and not any(t["stuck"] for t in hang["threads"][1:]), hang["threads"]
    assert death["levers"][0].startswith(f"look at save (job.py:{plant}): its thread 'saver' was there"), death



DEAD_PRODUCER = """\
import queue, sys, threading, time
import blackbox

batches = queue.Queue(maxsize=4)

def produce():
    for i in range(10**6):
        if i == 40:
            raise ValueError("corrupt shard 7")  # PLANT: the producer dies; nothing tells the main thread
        batches.put(i)

def heartbeat():
    while True:
        time.sleep(0.1)  # a live thread of the job's own beside: never the one told

threading.Thread(target=heartbeat, name="heartbeat", daemon=True).start()
threading.Thread(target=produce, name="prefetch").start()
for step in range(10**6):
    if step == 40:
        open(sys.argv[1], "w").close()  # (the four batches queued before it died are taken)
    batch = batches.get()  # WAIT: forever, once they are
    blackbox.step(step)
    print(step, flush=True)
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_main_thread_waiting_on_a_queue_whose_producer_died_names_the_dead_thread_and_its_error(
    tmp_path: Path,
) -> None:
    # GIVEN a job whose prefetch thread dies of an exception at its 40th batch while the main thread takes batches
    # from its queue (then waits forever), a heartbeat thread beside; armed and unarmed, ended by `timeout`
    job = tmp_path / "job.py"
    job.write_text(DEAD_PRODUCER)
    run = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "runs"), "--"]
    jobs = [([*run, sys.executable, str(job), str(tmp_path / "armed")], tmp_path / "armed", {}),
            ([sys.executable, str(job), str(tmp_path / "unarmed")], tmp_path / "unarmed", {})]  # fmt: skip
    procs = _end_when_stuck(jobs, stuck_for=4.0)
    # THEN it ends as unarmed (the thread's traceback on stderr both times, the same steps)
    assert procs[0].returncode == procs[1].returncode == 124, [(p.returncode, p.err[-2000:]) for p in procs]
    assert procs[0].out == procs[1].out == "".join(f"{i}\n" for i in range(40))
    assert "ValueError: corrupt shard 7" in procs[0].err and "ValueError: corrupt shard 7" in procs[1].err
    # AND the verdict says the main thread waited for a thread of its own, which had died of the planted error (it
    # read "waiting in <module> (job.py:N) for a thread of its own", the dead thread in the evidence alone)
    death = _bundle(tmp_path / "runs")["death"]
    wait = DEAD_PRODUCER.splitlines().index("    batch = batches.get()  # WAIT: forever, once they are") + 1
    assert death["cause"] == "hang", death
    assert (f"waiting in <module> (job.py:{wait}) for a thread of its own; its thread 'prefetch' had died of "
            "ValueError: corrupt shard 7 at step ") in death["headline"], death["headline"]
    dead = death["hang"]["dead_thread"]
    assert (dead["thread"], dead["error"]) == ("prefetch", "ValueError: corrupt shard 7"), dead
    assert death["levers"][0].startswith("its thread 'prefetch' died of ValueError: corrupt shard 7 at "), death
    assert "heartbeat" not in death["headline"], death["headline"]


FLAG_HANDLER = """\
import signal, sys, threading, time
import blackbox

stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(True))  # as Lightning does: a flag, read between steps

def load(step):
    if step == 30:
        open(sys.argv[1], "w").close()
        threading.Event().wait()  # PLANT: stuck here; the flag is never read again
    return step

for step in range(10**6):
    if stop:
        break
    blackbox.step(step)
    load(step)
    print(step, flush=True)
    time.sleep(0.01)
"""


@pytest.mark.slow
def test_a_hung_job_whose_handler_took_the_sigterm_tells_that_sigterm_before_the_sigkill(tmp_path: Path) -> None:
    # GIVEN a job whose SIGTERM handler sets a flag its loop reads between steps (Lightning's), stuck at step 30,
    # under `timeout -k K T`: the SIGTERM is taken and changes nothing, a SIGKILL to the group later ends it; unarmed
    # and under `blackbox run`
    job = tmp_path / "job.py"
    job.write_text(FLAG_HANDLER)
    run = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(tmp_path / "runs"), "--"]
    procs = []
    for name, armed in (("unarmed", []), ("armed", run)):
        with open(tmp_path / f"{name}.err", "w") as err:  # (a file: read while it runs)
            procs.append(subprocess.Popen(["timeout", "-k", "60", "120", *armed, sys.executable, str(job),
                                           str(tmp_path / name)], stdout=subprocess.PIPE, stderr=err, text=True,
                                          env=ENV))  # fmt: skip
    for name, proc in zip(("unarmed", "armed"), procs, strict=True):
        while not (tmp_path / name).exists() and proc.poll() is None:
            time.sleep(0.05)
    time.sleep(STUCK_FOR)
    for proc in procs:
        proc.send_signal(signal.SIGALRM)  # `timeout` acts as if its time ran out: SIGTERM to its group
    # (its SIGKILL to the group, sent here once `blackbox run` has said its snapshot: the writer waits for an idle
    # core, which a loaded machine may not have within the 3 s a `timeout -k 3` gives; alone here, 0.5 s)
    deadline = time.monotonic() + 60
    while "the job still runs" not in (tmp_path / "armed.err").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    for proc in procs:
        os.killpg(proc.pid, signal.SIGKILL)  # what `timeout -k` does: its group, itself included
    out0, out1 = [proc.communicate(timeout=60)[0] for proc in procs]
    err0, err1 = (tmp_path / "unarmed.err").read_text(), (tmp_path / "armed.err").read_text()
    # THEN both end alike (`timeout -k` kills its group, itself too, with SIGKILL), with the same output
    assert procs[0].returncode == procs[1].returncode == -signal.SIGKILL, (err0[-2000:], err1[-2000:])
    assert out0 == out1 == "".join(f"{i}\n" for i in range(30))
    # AND, recovered (the group's SIGKILL took `blackbox run` too: no bundle of its own), the hang says the SIGTERM
    # came from timeout and was taken by the job's handler, before the SIGKILL (it read "...; then SIGKILL ended
    # it.", the SIGTERM unmentioned)
    from blackbox.recovery.pipeline import recover_rings

    (rings,) = (tmp_path / "runs").glob("run-*/rings")
    death = recover_rings([rings]).meta["death"]
    plant = FLAG_HANDLER.splitlines().index("        threading.Event().wait()  # PLANT: stuck here; the flag is never "
                                            "read again") + 1  # fmt: skip
    assert death["cause"] == "hang" and f"stuck in load (job.py:{plant}); then SIGTERM from timeout came at " in death[
        "headline"], death["headline"]
    assert death["headline"].endswith("taken by the job's own handler, which could not act on it while the process "
                                      "hung; then SIGKILL ended it."), death["headline"]  # fmt: skip
    # AND `blackbox run`, before the SIGKILL took it, wrote a snapshot (a second after the SIGTERM) that tells the
    # same: where it hung, the SIGTERM its handler took; and said so on stderr (it wrote no bundle before)
    snap = json.loads((rings.parent / "bundle" / "metadata.json").read_text())["death"]
    assert snap["alive"] and f"stuck in load (job.py:{plant}). SIGTERM from timeout came at " in snap["headline"], snap
    assert snap["headline"].endswith("taken by its own handler, which cannot act on it while the process hangs."), snap
    assert "blackbox run: the job still runs 1 s after SIGTERM from timeout (pid " in err1, err1
