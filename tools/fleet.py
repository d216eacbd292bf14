#!/usr/bin/env python3
"""Make a folder of rings from a large job, really: N ranks as N real processes under H host names
(one UTS namespace per host, `unshare -u`), each armed with a small ring filled with steps, all
SIGKILLed; one rank (the victim) first, the others a moment later.

    python tools/fleet.py DIR [--ranks 1000] [--hosts 4] [--ring-mib 2] [--victim 613] [--per-host] [--stagger]

--per-host: each host's rings in its own folder, DIR/node000/ ..., as node-local disks keep them.
--stagger: the ranks start one after another, in rank order, as a large job's do over minutes: the ranks
before the victim stay up; the victim is killed as soon as it is up, then those before it one after
another; each later rank is killed as soon as it is up, before the next starts. One run of one job
whose rings, by their times alone, look like a run per rank after the victim.

Prints one line: how many rings, the victim's host and pid, and the time it took. Used by the
scale test and by tools/bench_fleet.py. Needs root (or user namespaces) for `unshare -u`;
with --no-unshare every rank has this host's name.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

SLOT = 128
# A rank's sampler interval and step period. A thousand ranks share two cores in the scale test: at the
# default interval (0.1 s) and a step every 50 ms they asked for 13 times the CPU there was, and making
# the job took 386 s where it takes ~60 s with these (tools/bench_fleet.py prints the time).
SAMPLE_INTERVAL_S = 5.0
STEP_S = 0.2
HERE = Path(__file__).resolve().parent.parent


def _rank(folder: str, rank: int, local: int, world: int, capacity: int, ready: int) -> None:
    """A rank: arm, fill the ring with steps and marks, say ready ("r"), wait to be killed."""
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(local), WORLD_SIZE=str(world))
    import blackbox

    blackbox.arm(folder + "/", capacity=capacity, sample_interval=SAMPLE_INTERVAL_S)
    for step in range(capacity + capacity // 4):  # more than fits: the ring wraps, as a long job's does
        blackbox.step(step)
        if step % 64 == 0:
            blackbox.mark("loss", step)
    os.write(ready, b"r")
    step = capacity + capacity // 4
    while True:  # a training loop until the kill: its last event is its death, give or take a step
        step += 1
        blackbox.step(step)
        time.sleep(STEP_S)


def _fork_rank(args: argparse.Namespace, i: int, capacity: int, ready: int, other: int) -> int:
    """Fork rank ``args.first + i``; a rank that fails says so ("x" on ``ready``, its traceback on stderr)
    rather than leave its host waiting for it."""
    pid = os.fork()
    if pid == 0:
        os.close(other)
        try:
            _rank(args.folder, args.first + i, i, args.world, capacity, ready)
        except BaseException:
            traceback.print_exc()
            os.write(ready, b"x")
        finally:
            os._exit(1)
    return pid


def host(args: argparse.Namespace) -> int:
    """One host: set its name (in its own UTS namespace), fork its ranks, report their pids."""
    if args.hostname:
        socket.sethostname(args.hostname)
    import blackbox  # noqa: F401  (imported once here, inherited by every rank)

    capacity = args.ring_mib * (1 << 20) // SLOT
    if args.stagger:
        return _host_one_at_a_time(args, capacity)
    r, w = os.pipe()
    pids = [_fork_rank(args, i, capacity, w, r) for i in range(args.count)]
    os.close(w)
    got = b""
    while len(got) < len(pids) and b"x" not in got:
        chunk = os.read(r, 4096)
        if not chunk:
            break
        got += chunk
    if got != b"r" * len(pids):
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        print(f"fleet: {got.count(b'r')} of {len(pids)} ranks of host part {args.first} came up", file=sys.stderr)
        return 1
    print(" ".join(map(str, pids)), flush=True)
    sys.stdin.read()  # until the maker has killed the ranks
    for pid in pids:
        os.waitpid(pid, 0)
    return 0


def _host_one_at_a_time(args: argparse.Namespace, capacity: int) -> int:
    """--stagger: fork the next rank on each line read, and print its pid once it is up."""
    pids = []
    for i, _ in enumerate(sys.stdin):
        r, w = os.pipe()
        pid = _fork_rank(args, i, capacity, w, r)
        os.close(w)
        if os.read(r, 1) != b"r":
            os.kill(pid, signal.SIGKILL)
            raise SystemExit(f"fleet: rank {args.first + i} did not come up")
        os.close(r)
        pids.append(pid)
        print(pid, flush=True)
    for pid in pids:
        os.waitpid(pid, 0)
    return 0


def _staggered(args: argparse.Namespace, hosts: list[subprocess.Popen[str]], per: int) -> int:
    """--stagger: start the ranks one at a time; kill the victim first (see the module docstring)."""
    waiting: list[int] = []
    victim = 0
    for rank in range(args.ranks):
        part = hosts[rank // per]
        assert part.stdin is not None and part.stdout is not None
        part.stdin.write("fork\n")
        part.stdin.flush()
        pid = int(part.stdout.readline())
        if rank < args.victim:
            waiting.append(pid)
            continue
        if rank == args.victim:
            victim = pid
        os.kill(pid, signal.SIGKILL)
        for other in waiting:
            time.sleep(args.gap)
            os.kill(other, signal.SIGKILL)
        waiting = []
    return victim


def make(args: argparse.Namespace) -> int:
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-args.ranks // args.hosts)
    t0 = time.perf_counter()
    hosts = []
    env = dict(os.environ, PYTHONPATH=str(HERE), OMP_NUM_THREADS="1")
    for h in range(args.hosts):
        first, count = h * per, min(per, args.ranks - h * per)
        name = f"node{h:03d}"
        where = folder / name if args.per_host else folder
        where.mkdir(exist_ok=True)
        cmd = [sys.executable, __file__, "--host-part", str(where), "--first", str(first), "--count", str(count),
               "--world", str(args.ranks), "--ring-mib", str(args.ring_mib)]  # fmt: skip
        if args.stagger:
            cmd.append("--stagger")
        if args.unshare and shutil.which("unshare"):
            cmd = ["unshare", "-u", *cmd, "--hostname", name]
        hosts.append(subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env))
    if args.stagger:
        victim = _staggered(args, hosts, per)
        for p in hosts:
            assert p.stdin is not None
            p.stdin.close()
            p.wait()
        rings = len(list(folder.glob("**/*.ring")))
        print(f"fleet: {rings} rings in {folder}; rank {args.victim} (pid {victim}) killed first; ranks started "
              f"one after another; {time.perf_counter() - t0:.1f} s")  # fmt: skip
        return 0
    pids: list[int] = []
    for p in hosts:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise SystemExit(f"fleet: a host part failed (exit {p.wait()})")
        pids += [int(x) for x in line.split()]
    victim = pids[args.victim]
    os.kill(victim, signal.SIGKILL)
    time.sleep(args.gap)
    for pid in pids:
        if pid != victim:
            os.kill(pid, signal.SIGKILL)
    for p in hosts:
        assert p.stdin is not None
        p.stdin.close()
        p.wait()
    rings = len(list(folder.glob("**/*.ring")))
    print(f"fleet: {rings} rings in {folder}; rank {args.victim} (pid {victim}) killed first; "
          f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder")
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ring-mib", type=int, default=2)
    ap.add_argument("--victim", type=int, default=613)
    ap.add_argument("--gap", type=float, default=0.2, help="seconds between the victim's kill and the others'")
    ap.add_argument("--no-unshare", dest="unshare", action="store_false")
    ap.add_argument("--per-host", action="store_true", help="each host's rings in DIR/<host>/")
    ap.add_argument("--stagger", action="store_true", help="ranks start one after another (module docstring)")
    ap.add_argument("--host-part", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--hostname", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--count", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.host_part:
        return host(args)
    return make(args)


if __name__ == "__main__":
    sys.exit(main())
