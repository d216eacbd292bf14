"""A rank starved of CPU before it was SIGKILLed looks as if it died early: its last record is older than its
death. The first death is still the rank that really died first, each death carries how long after its
time it may have come, and the summary says which ranks were starved and that their order is not known."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from blackbox._postmortem import write_postmortem
from blackbox._times import epoch_ns

RANK = """\
import sys, time, blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.25)
for step in range(10**9):
    blackbox.step(step)
    if step == 5:
        print("up", flush=True)
    time.sleep(0.02)
"""
STOPPED, RUNNING = 0.8, 0.05  # the starved rank's duty cycle: what a CPU it shares with many gives it


@pytest.mark.slow
def test_a_starved_rank_is_not_named_first_and_is_said_to_be_starved(tmp_path: Path) -> None:
    rings, out = tmp_path / "rings", tmp_path / "bundle"
    env = dict(os.environ, PYTHONPATH=str(REPO), WORLD_SIZE="3")
    ranks = [subprocess.Popen([sys.executable, "-c", RANK, str(rings)], stdout=subprocess.PIPE, text=True,
                              env=dict(env, RANK=str(r))) for r in range(3)]  # fmt: skip
    for p in ranks:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
    victim, starved, other = ranks[1], ranks[2], ranks[0]
    # GIVEN rank 2 starved of CPU for 3 s (stopped, then let run a moment, as a crowded scheduler does)
    for _ in range(4):
        starved.send_signal(signal.SIGSTOP)
        time.sleep(STOPPED)
        starved.send_signal(signal.SIGCONT)
        time.sleep(RUNNING)
    starved.send_signal(signal.SIGSTOP)
    time.sleep(0.3)
    # WHEN rank 1 is SIGKILLed first (the planted truth), ranks 0 and 2 0.2 s later, as a fleet's are
    victim.kill()
    time.sleep(0.2)
    for p in (other, starved):
        p.kill()
    for p in ranks:
        p.wait(timeout=30)
    meta = write_postmortem([rings], out, plot=False)
    by_rank = {m["rank"]: m for m in meta["rings"]}
    # THEN rank 2's last record is older than rank 1's death: by its time alone it would be named first
    assert by_rank[2]["death"]["time"] < by_rank[1]["death"]["time"] < by_rank[0]["death"]["time"]
    # AND rank 2 is said to be starved, its death's time uncertain by about how long it was stopped
    death = by_rank[2]["death"]
    assert death["starved"]["interval_s"] == 0.25 and STOPPED - 0.4 <= death["starved"]["late_s"] <= STOPPED + 1.0
    assert STOPPED - 0.1 <= death["time_error_s"] <= STOPPED + 1.0, death
    assert by_rank[1]["death"]["starved"] is None and by_rank[1]["death"]["time_error_s"] < STOPPED / 2
    # AND rank 1, which ran on time until it was killed, is the first death
    assert (meta["first_death"]["rank"], meta["first_death"]["cause"]) == (1, "killed"), meta["first_death"]
    # AND the summary says that rank 2's order is not known and that it was starved
    summary = (out / "summary.md").read_text()
    assert "**First death: rank 1 " in summary
    known = summary.split("Order not known: ", 1)[1].split("\n", 1)[0]
    assert known.startswith("rank 2 (host ") and " ms before it by their last records" in known, known
    assert "Starved at the end: rank 2 (1 of 3): their samplers ran up to " in summary
    # AND rank 2's own account says how well its death's time is known and that it was starved
    from blackbox.views.summary import ring_summary

    own = ring_summary(by_rank[2])
    assert "Its time is its last record: the death came after it, within " in own
    assert "It was starved at its end (of CPU, or of the GIL): its sampler, asked to run every 0.25 s" in own


GLOO_RANK = """\
import os, sys, time, blackbox
blackbox.arm(sys.argv[1] + "/", sample_interval=0.1)
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:" + sys.argv[2], rank=int(os.environ["RANK"]),
                        world_size=2)
x = torch.ones(4)
for step in range(10**9):
    blackbox.step(step)
    dist.all_reduce(x)
    if step == 20:
        print("up", flush=True)
    time.sleep(0.02)
"""


@pytest.mark.slow
def test_a_starved_rank_killed_first_is_not_displaced_by_the_peer_that_lost_it(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed", reason="gloo needs torch")
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    rings, out = tmp_path / "rings", tmp_path / "bundle"
    env = dict(os.environ, PYTHONPATH=str(REPO), WORLD_SIZE="2", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-c", GLOO_RANK, str(rings), port]
    pipe = subprocess.PIPE
    ranks = [subprocess.Popen(cmd, stdout=pipe, stderr=pipe, text=True, env=dict(env, RANK=str(r))) for r in range(2)]
    for p in ranks:
        assert p.stdout is not None and p.stdout.readline().strip() == "up"
    peer, victim = ranks
    # GIVEN rank 1 starved of CPU (stopped, let run a moment, as a crowded scheduler does), under the hang's 2 s
    for _ in range(3):
        victim.send_signal(signal.SIGSTOP)
        time.sleep(0.3)
        victim.send_signal(signal.SIGCONT)
        time.sleep(0.03)
    victim.send_signal(signal.SIGSTOP)
    time.sleep(0.1)
    # WHEN it is SIGKILLed (the planted first death): rank 0, waiting in the all-reduce, loses its peer
    victim.kill()
    assert victim.wait(timeout=30) == -signal.SIGKILL
    assert peer.wait(timeout=60) != 0
    meta = write_postmortem([rings], out, plot=False)
    by_rank = {m["rank"]: m for m in meta["rings"]}
    killed, lost = by_rank[1]["death"], by_rank[0]["death"]
    # THEN rank 0 died of gloo's error, on time, inside the window where rank 1's death may have come; gloo says
    # "reset" where the kernel answered its socket with RST (unread bytes in the dead rank's buffer), else "closed"
    gone = ("Connection reset by peer", "Connection closed by peer")
    assert lost["cause"] == "exception" and lost["peer_lost"] in gone, lost
    assert killed["cause"] == "killed" and killed["starved"] is not None and lost["starved"] is None, killed
    t1, t0 = (epoch_ns(killed["time"]), epoch_ns(lost["time"]))
    assert t1 is not None and t0 is not None and t1 < t0 <= t1 + killed["time_error_s"] * 1e9, (killed, lost)
    # AND the starved rank that was killed is still the first death: the peer's error came after it
    assert (meta["first_death"]["rank"], meta["first_death"]["cause"]) == (1, "killed"), meta["first_death"]
    assert meta["first_death"]["peer_lost"] is None
    # AND rank 0 is collateral of it, said so: it counted as a death of its own cause
    assert by_rank[0]["death"]["collateral_of"]["lost_peer"] is True, by_rank[0]["death"]
    (attempt,) = meta["attempts"]
    assert (attempt["deaths"], attempt["collateral"]) == (1, 1), attempt
    assert "- 1 rank lost a peer after rank 1 died" in (out / "summary.md").read_text()
