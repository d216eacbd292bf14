"""What allocation sampling's share of the sampler tick costs a running training step, tree against tree.

    .venv/bin/python tools/bench_alloc_tick.py [--before TREE] [--runs 3] [--seconds 30]

The tick holds the GIL while it runs: a job thread that comes back from a torch op meanwhile waits. Each
run is a fresh process of one tree (this one, and ``--before``: another checkout with its C extension
built): ``arm()`` with the defaults, the GPT step of tools/small_gpt.py in a loop, and
``AllocSampler.tick`` timed (wall and CPU of the sampler thread) once ``--warm`` seconds have passed. Runs
alternate between the trees. Printed per tree: the median tick, its 90th percentile, the tick's CPU per
step (the mean, every tick counted) and the step, medians over the runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

JOB = r"""
import json, os, statistics, sys, threading, time
sys.path.insert(0, os.path.join(os.environ["BENCH_ROOT"], "tools"))
import blackbox
from blackbox.collect import allocs
warm, seconds = float(sys.argv[2]), float(sys.argv[3])
ticks = []
original = allocs.AllocSampler.tick
def tick(self, step):
    w, c = time.perf_counter_ns(), time.thread_time_ns()
    original(self, step)
    if time.monotonic() > t0:
        ticks.append(((time.perf_counter_ns() - w) / 1e3, (time.thread_time_ns() - c) / 1e3))
allocs.AllocSampler.tick = tick
t0 = time.monotonic() + warm
blackbox.arm(sys.argv[1])
import torch
from small_gpt import gpt_step
run = gpt_step()
steps, end = 0, t0 + seconds
while time.monotonic() < end:
    run()
    steps += time.monotonic() > t0
walls = sorted(w for w, _ in ticks)
print(json.dumps({"median": statistics.median(walls), "p90": walls[int(0.9 * (len(walls) - 1))],
                  "cpu_per_step": sum(c for _, c in ticks) / max(steps, 1), "step_ms": 1e3 * seconds / max(steps, 1)}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout, its C extension built")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--warm", type=float, default=12.0, help="seconds after arming before ticks are timed")
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args(argv)
    trees = [str(ROOT)] + ([str(args.before)] if args.before else [])
    got: dict[str, list[dict[str, float]]] = {t: [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            for tree in trees:
                root = str(Path(tree).resolve())
                env = dict(os.environ, PYTHONPATH=root, BENCH_ROOT=str(ROOT))
                env.pop("BLACKBOX_ALLOCATIONS", None)
                ring = os.path.join(tmp, f"{i}-{len(got[tree])}-{abs(hash(root))}/")
                out = subprocess.run([sys.executable, "-c", JOB, ring, str(args.warm), str(args.seconds)], env=env,
                                     capture_output=True, text=True, timeout=args.warm + args.seconds + 120)
                if out.returncode != 0:
                    print(f"{tree}: run failed: {out.stderr.strip()[-500:]}", file=sys.stderr)
                    return 1
                got[tree].append(json.loads(out.stdout.strip().splitlines()[-1]))
                print(f"run {i + 1} {tree}: {got[tree][-1]}", flush=True)
    for tree, runs in got.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"{tree}: tick {med['median']:.1f} us (90th percentile {med['p90']:.1f} us), "
              f"{med['cpu_per_step']:.1f} us of the sampler's CPU a step of {med['step_ms']:.1f} ms "
              f"({100 * med['cpu_per_step'] / 1e3 / med['step_ms']:.3f}%), medians of {len(runs)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
