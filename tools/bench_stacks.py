"""The sampler tick's cost with stacks, measured directly on the benchmark loop's stack.

    .venv/bin/python tools/bench_stacks.py [--runs N] [--ticks N] [--gap S] [--nest N]

Each run is a fresh process that trains the loop of ``tools/bench_overhead.py``
(8x[Linear(256,256), ReLU] + head, batch 64, AdamW, one thread) in its main
thread, while a second thread, as the sampler does, times ticks against that
live stack:

- the stack part alone (the main thread's ``stack_sample``: walk, intern, write);
- the whole tick with stacks (``Recorder.sample_now``: stacks, host probe, writes);
- the whole tick without stacks.

Each is timed back to back (caches warm) and once every ``--gap`` seconds (as the
sampler runs: caches cold, the loop somewhere else in its step), in wall time and
in the sampler thread's CPU time. ``--nest N`` runs the loop N Python frames
deeper (a framework's trainer). Each process reports its medians; the table gives
the median over processes, for the C write path and the pure-Python one. The
budget: the stack part at most 100 us per tick (0.1% of a core at 10 Hz).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

JOB = r"""
import json, statistics, sys, threading, time
ticks, gap, nest, ring_dir = int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
import torch
import blackbox
from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import read_ring
from small_gpt import mlp_step
step = mlp_step()
for _ in range(30):
    step()
rec = blackbox.arm(ring_dir, capacity=1 << 16, sample_interval=3600)  # the sampler thread stays idle
stop = threading.Event()
out = {}
def timed(name, fn, pause):
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    walls, cpus = [], []
    for _ in range(ticks):
        if pause:
            time.sleep(pause)
        t0, c0 = wall(), cpu()
        fn()
        c1, t1 = cpu(), wall()
        walls.append(t1 - t0)
        cpus.append(c1 - c0)
    out[name] = statistics.median(walls)
    out[name + "_cpu"] = statistics.median(cpus)
def without_stacks():
    sampler, rec._stacks = rec._stacks, None
    try:
        rec.sample_now()
    finally:
        rec._stacks = sampler
def measure():
    time.sleep(0.2)
    for pause, mode in ((0, "warm"), (gap, "cold")):
        timed(f"{mode}_stacks", rec._stacks.sample, pause)
        timed(f"{mode}_tick", rec.sample_now, pause)
        timed(f"{mode}_tick_no_stacks", without_stacks, pause)
    stop.set()
def train(n):
    if n:
        return train(n - 1)
    steps = 0
    while not stop.is_set():
        step()
        steps += 1
    return steps
t = threading.Thread(target=measure, name="bench-sampler")
t.start()
steps = train(nest)
t.join()
blackbox.disarm()
table = ring_table(read_ring(rec.path))
depth = [d for k, d in zip(table["kind"].to_pylist(), table["stack_depth"].to_pylist()) if k == "stack_sample"]
print(json.dumps({**out, "steps": steps, "depth": statistics.median(depth), "backend": rec.writer_backend}))
"""


def run_job(backend: str, ticks: int, gap: float, nest: int, ring_dir: str) -> dict[str, Any]:
    """Run JOB in a fresh process; its last stdout line is a JSON object."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tools")]), BLACKBOX_WRITER=backend)
    argv = [sys.executable, "-c", JOB, str(ticks), str(gap), str(nest), ring_dir]
    out = subprocess.run(argv, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise SystemExit(f"benchmark job failed ({out.returncode}):\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per write path")
    ap.add_argument("--ticks", type=int, default=200, help="ticks timed per process, each kind and mode")
    ap.add_argument("--gap", type=float, default=0.02, help="seconds between cold ticks")
    ap.add_argument("--nest", type=int, default=0, help="run the loop this many Python frames deeper")
    args = ap.parse_args()
    results: dict[str, list[dict[str, Any]]] = {"c": [], "python": []}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        for _ in range(args.runs):
            for backend in results:  # alternating, so machine drift hits both alike
                results[backend].append(run_job(backend, args.ticks, args.gap, args.nest, d))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(f"{args.runs} processes per write path, {args.ticks} ticks of each kind per mode and process, "
          f"cold ticks {args.gap} s apart; medians over processes of each process's median")  # fmt: skip
    print("\n| write path | stack depth | ticks | stacks alone (CPU) | tick with stacks (CPU) | tick without stacks |")
    print("|---|---:|---|---:|---:|---:|")
    for backend, runs in results.items():
        if not runs or runs[0]["backend"] != backend:
            print(f"| {backend} | not built | | | | |")
            continue
        for mode in ("warm", "cold"):
            med = {k: statistics.median(r[f"{mode}_{k}"] for r in runs) / 1e3
                   for k in ("stacks", "stacks_cpu", "tick", "tick_cpu", "tick_no_stacks")}  # fmt: skip
            depth = statistics.median(r["depth"] for r in runs)
            print(f"| {backend} | {depth:.0f} | {mode} | {med['stacks']:.1f} us ({med['stacks_cpu']:.1f}) | "
                  f"{med['tick']:.0f} us ({med['tick_cpu']:.0f}) | {med['tick_no_stacks']:.0f} us |")  # fmt: skip
    cold = [r["cold_stacks"] / 1e3 for r in results["c"]]
    if cold:
        print(f"\nstacks alone, cold, C path, per process: {', '.join(f'{v:.1f}' for v in cold)} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
