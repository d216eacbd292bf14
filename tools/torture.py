"""Randomised SIGKILL torture: nothing acknowledged is ever lost, no torn record is ever returned.

    .venv/bin/python tools/torture.py [--trials 50] [--threads 4] [--capacity 65536] [--seed S] [--allocations B]

Each trial starts a writer process: several threads mark without pause, the
sampler runs every 2 ms, and a forked child stays alive (the parent's ring must
survive it). Each thread acknowledges on stdout every 128th value it has
written. At a random instant the writer is SIGKILLed; the ring is then read
and checked: for every thread, the values in the ring are consecutive (no gap,
no duplicate), every value acknowledged before the kill is there unless
wrap-around overwrote it, and at most one slot per thread is torn. Prints one
line per trial and a total.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import numpy as np  # noqa: E402

from blackbox.ring import format as fmt  # noqa: E402
from blackbox.ring.reader import read_ring  # noqa: E402

WRITER = r"""
import os, sys, threading, time, blackbox
ring, capacity, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.setswitchinterval(float(sys.argv[4]))
rec = blackbox.arm(ring, capacity=capacity, sample_interval=0.002)
child = os.fork()
if child == 0:          # a forked child (a DataLoader worker, say) that lives on and marks too
    while True:
        blackbox.mark("child", 1)   # on_fork="disarm": this must never reach the parent's ring
        time.sleep(0.001)
out, lock = sys.stdout, threading.Lock()
churn = bool(os.environ.get("BLACKBOX_ALLOCATIONS"))  # allocation sampling on: allocate as the marks go
def work(k):
    mark, label, i, kept = rec.mark, f"t{k}", 0, []
    while True:
        mark(label, i)
        if churn:
            kept.append(bytearray(i & 8191))
            del kept[: len(kept) - 64]
        if i % 128 == 0:
            with lock:
                out.write(f"{k} {i}\n"); out.flush()
        i += 1
out.write("go\n"); out.flush()
for k in range(threads):
    threading.Thread(target=work, args=(k,), daemon=True).start()
time.sleep(3600)
"""


def trial(
    path: Path,
    capacity: int,
    threads: int,
    kill_after: float,
    switch: float,
    backend: str = "",
    allocations: int = 0,
    address_space: int = 0,
) -> dict[str, int]:
    """One trial; ``allocations``: the threads also allocate, sampled one per that many bytes (0: off);
    ``address_space``: the writer runs under that RLIMIT_AS in bytes (`ulimit -v`; 0: none), where the sampler
    thread allocates from its own heap (collect/_own_heap.h)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("BLACKBOX_ALLOCATIONS", None)
    if backend:
        env["BLACKBOX_WRITER"] = backend
    if allocations:
        env["BLACKBOX_ALLOCATIONS"] = str(allocations)
    args = [sys.executable, "-c", WRITER, str(path), str(capacity), str(threads), str(switch)]
    limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))) if address_space else None
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, env=env, start_new_session=True, preexec_fn=limit)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    if first.strip() != b"go":
        raise RuntimeError(f"writer did not start: {first!r}")
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    deadline = time.monotonic() + kill_after
    while time.monotonic() < deadline:  # drain the acknowledgements so the writers never block on the pipe
        readable, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if readable:
            try:
                chunks.append(os.read(fd, 1 << 20))
            except BlockingIOError:
                pass
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the forked child, which holds the pipe open too
    except ProcessLookupError:
        pass
    os.set_blocking(fd, True)
    while chunk := os.read(fd, 1 << 20):  # acknowledgements already in the pipe when it died
        chunks.append(chunk)
    proc.stdout.close()
    rest = b"".join(chunks)
    acked: dict[int, int] = {}
    for line in rest.split(b"\n"):
        parts = line.split()
        if len(parts) == 2:
            k, i = int(parts[0]), int(parts[1])
            acked[k] = max(acked.get(k, -1), i)
    ring = read_ring(path)
    r, rec = ring.records, ring.recovery
    labels = [ring.strings.get(int(i)) for i in r["label"]]
    lost = 0
    problems: list[str] = []
    if rec.torn > threads + 1:  # each writer thread and the sampler may leave one
        problems.append(f"{rec.torn} torn slots for {threads} threads")
    if rec.heap_torn > threads + 1:  # each allocating thread may leave one heap slot half-written
        problems.append(f"{rec.heap_torn} torn heap slots for {threads} threads")
    if allocations and not rec.heap_live and not (r["kind"] == fmt.KIND_CODES["alloc_sample"]).any():
        problems.append("allocation sampling was on, yet nothing was sampled")
    if "child" in labels:
        problems.append("the forked child wrote into the parent's ring")
    if len(r) and not ((r["commit"] == r["seq"]).all() and (r["seq"][1:] > r["seq"][:-1]).all()):
        problems.append("a returned record fails the commit rule or seq order")
    wrapped = rec.overwritten > 0
    for k, last in acked.items():
        values = [int(v) for v, lab in zip(r["value"], labels, strict=True) if lab == f"t{k}"]
        if not values:
            if not wrapped:
                lost += last + 1
            continue
        if values != list(range(values[0], values[0] + len(values))):
            problems.append(f"thread {k}: a gap or a duplicate")
        if values[-1] < last:
            lost += last - values[-1]
        if not wrapped and values[0] != 0:
            lost += values[0]
    if problems:
        raise AssertionError(f"{path.name}: " + "; ".join(problems))
    samples = int((r["kind"] == fmt.KIND_CODES["sample"]).sum())
    allocs = int(np.isin(r["kind"], [fmt.KIND_CODES["alloc_sample"], fmt.KIND_CODES["free_sample"]]).sum())
    return {"events": len(r), "acked": sum(v + 1 for v in acked.values()), "lost": lost, "torn": rec.torn,
            "samples": samples, "wrapped": int(wrapped), "allocs": allocs, "heap_live": rec.heap_live}  # fmt: skip


OOM_JOB = r"""
import sys, time, blackbox
blackbox.arm(sys.argv[1], capacity=1 << 16, sample_interval=0.01)
kept = []
for step in range(1, 10**6):
    blackbox.step(step)
    blackbox.mark("leak", step)
    kept.append(bytearray(4 << 20))
    print(step, flush=True)
"""


def oom_trial(work: Path, limit: int) -> dict[str, int] | str:
    """One real kernel OOM kill in a fresh child memory cgroup; a string says why it was skipped."""
    from cgroup_util import CgroupRefused, child_memory_cgroup, join

    from blackbox.recovery.evidence import cgroup_oom_kills

    try:
        with child_memory_cgroup(limit, f"blackbox-torture-{work.name}") as (cg, version):
            before = cgroup_oom_kills(cg, version) or 0
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            work.mkdir()
            proc = subprocess.run(
                [sys.executable, "-c", OOM_JOB, str(work)], capture_output=True, text=True, env=env, timeout=120,
                preexec_fn=lambda: join(cg),
            )  # fmt: skip
            after = cgroup_oom_kills(cg, version) or 0
    except CgroupRefused as exc:
        return str(exc)
    printed = [int(x) for x in proc.stdout.split()]
    (ring_path,) = work.glob("*.ring")
    ring = read_ring(ring_path)
    steps = ring.records["step"][ring.records["step"] >= 0]
    problems = []
    if proc.returncode != -signal.SIGKILL or after != before + 1:
        problems.append(f"not a kernel OOM kill (exit {proc.returncode}, oom_kill {before} -> {after})")
    if ring.clean or ring.recovery.torn > 2:
        problems.append(f"clean={ring.clean} torn={ring.recovery.torn}")
    last = int(steps.max()) if len(steps) else -1
    if printed and last < printed[-1]:
        problems.append(f"the ring's last step {last} is before the printed {printed[-1]}")
    if problems:
        raise AssertionError(f"{work.name}: " + "; ".join(problems))
    return {"events": len(ring.records), "printed": printed[-1] if printed else 0, "last_step": last,
            "torn": ring.recovery.torn, "version": version}  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--capacity", type=int, default=None, help="slots (default: 4096, 65536 or 1M at random)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--backend", choices=["c", "python"], default="", help="write path (default: the built one)")
    ap.add_argument("--oom-trials", type=int, default=0, help="also this many real kernel OOM kills in a cgroup")
    ap.add_argument("--allocations", type=int, default=0, help="threads allocate too, sampled one per B bytes")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(
        f"seed {seed}; {args.trials} trials, {args.threads} threads, capacity {args.capacity or 'random'}, "
        f"write path {args.backend or 'default'}"
    )
    totals = {"events": 0, "acked": 0, "lost": 0, "torn": 0, "wrapped": 0}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        for n in range(args.trials):
            path = Path(d) / f"t{n}.ring"
            kill_after = rng.uniform(0.05, 0.6)
            switch = rng.choice([1e-5, 1e-4, 5e-3])
            capacity = args.capacity or rng.choice([1 << 12, 1 << 16, 1 << 20])
            res = trial(path, capacity, args.threads, kill_after, switch, args.backend, args.allocations)
            for key in totals:
                totals[key] += res[key]
            print(
                f"trial {n:3d}: {capacity:7d} slots, killed after {kill_after:.3f} s, switch {switch:g} s: "
                f"{res['events']:7d} events "
                f"({res['samples']} samples, {res['allocs']} allocation samples, {res['heap_live']} live in the heap "
                f"table), {res['acked']:7d} acknowledged, {res['lost']} lost, "
                f"{res['torn']} torn{' (wrapped)' if res['wrapped'] else ''}"
            )
            path.unlink()
    print(
        f"\n{args.trials} trials: {totals['events']:,} events recovered, {totals['acked']:,} acknowledged, "
        f"{totals['lost']} acknowledged events lost, {totals['torn']} torn slots (dropped, never returned), "
        f"{totals['wrapped']} trials wrapped"
    )
    if args.oom_trials:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
            for n in range(args.oom_trials):
                oom = oom_trial(Path(d) / f"oom{n}", rng.choice([256, 384, 512]) << 20)
                if isinstance(oom, str):
                    print(f"kernel OOM kills skipped: {oom}")
                    break
                print(
                    f"oom trial {n}: cgroup v{oom['version']} kernel OOM kill; {oom['events']} events recovered, "
                    f"last step {oom['last_step']} (job printed {oom['printed']}), {oom['torn']} torn"
                )
    return 1 if totals["lost"] else 0


if __name__ == "__main__":
    sys.exit(main())
