"""Step-time overhead of the recorder on a CPU training loop: a small MLP, or a small GPT (a realistic step).

    .venv/bin/python tools/bench_overhead.py [--model mlp|gpt] [--rounds N] [--steps N] [--interleaved-only]
    .venv/bin/python tools/bench_overhead.py --model gpt --ab 100   # allocation sampling alone, with its interval

Configurations: not armed; default ``arm()`` (allocation sampling on, as every
job now gets it); ``arm(allocations=False)`` (sampling off); ``arm(modules=True)``.
Three measurements:

1. fresh processes, configurations alternating round by round, each process's
   median step time (wall);
2. in one process, blocks of steps of each configuration in shuffled order,
   alternating, wall and CPU time per step (CPU: the whole process, the
   sampler thread's included; the machine's other load disturbs it less than
   wall time); medians over the blocks of each process, then over 3 processes;
3. what the recorder itself adds, measured directly (events per step x the
   cost of one, the sampler's tick; samples per step of allocation sampling).

Budget: default at most 1% (never above 3%), of which allocation sampling at
most 0.5% of a realistic step; ``modules=True`` at most 5%.
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
import json, os, sys, time, statistics
config, steps, ring_dir, model = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, os.path.join(os.environ["BENCH_ROOT"], "tools"))
import blackbox
SETTINGS = {"default": {}, "noalloc": {"allocations": False}, "modules": {"modules": True}}
if config in SETTINGS:
    blackbox.arm(ring_dir, **SETTINGS[config])
import torch
from small_gpt import gpt_step, mlp_step
run = gpt_step() if model == "gpt" else mlp_step()
def step():
    t0 = time.perf_counter_ns()
    run()
    return time.perf_counter_ns() - t0
for _ in range(30 if model == "mlp" else 5):
    step()
if config == "attributed":
    # What the recorder itself adds per step, measured directly (far less noisy than A/B on a shared VM):
    # events written per step x the cost of writing one such event, and the sampler's tick.
    from blackbox.ring.reader import read_ring
    from blackbox.collect.allocs import sample_module
    n = 100 if model == "mlp" else 20
    out = {}
    for modules in (False, True):
        rec = blackbox.arm(ring_dir, capacity=1 << 16, sample_interval=3600, modules=modules, allocations=False)
        for _ in range(n):
            step()
        blackbox.disarm()
        per_step = len(read_ring(rec.path).records) / n
        rec = blackbox.arm(ring_dir, capacity=1 << 16, sample_interval=3600, allocations=False)
        ev, rss = rec._writer.event, rec._probe.rss
        t0 = time.perf_counter_ns()
        for _ in range(20000):
            ev(19, "Sequential.0", None, -1, (-1, rss()) if modules else None)
        out["modules" if modules else "default"] = {"events": per_step, "ns": (time.perf_counter_ns() - t0) / 20000}
        blackbox.disarm()
    cmod = sample_module()
    rec = blackbox.arm(ring_dir, capacity=1 << 16, sample_interval=0.1)
    before = cmod.stats()["samples"] if cmod is not None else 0
    for _ in range(n):
        step()
    out["samples_per_step"] = ((cmod.stats()["samples"] - before) / n) if cmod is not None else None
    blackbox.disarm()
    rec = blackbox.arm(ring_dir, capacity=1 << 14, sample_interval=3600)
    ticks, bare = [], []  # alternating: with the stack sample, and without it
    sampler = rec._stacks
    for _ in range(300):
        for kept, into in ((sampler, ticks), (None, bare)):
            rec._stacks = kept
            t0 = time.perf_counter_ns()
            rec.sample_now()
            rec._torch.poll()
            into.append(time.perf_counter_ns() - t0)
    rec._stacks = sampler
    blackbox.disarm()
    out["tick_ns"] = statistics.median(ticks)
    out["tick_no_stacks_ns"] = statistics.median(bare)
    # The same ticks on the sampler's own thread while the job runs: its CPU clock over n steps. On a
    # VM whose other core idles between ticks this is several times the warm loop's figure above.
    import threading
    rec = blackbox.arm(ring_dir, capacity=1 << 16)
    for _ in range(5):
        step()
    sampler_thread = next(t for t in threading.enumerate() if t.name == "blackbox-sampler")
    clock = time.pthread_getcpuclockid(sampler_thread.ident)
    c0, t0 = time.clock_gettime_ns(clock), time.perf_counter_ns()
    for _ in range(n):
        step()
    out["live_sampler_ns_per_s"] = (time.clock_gettime_ns(clock) - c0) / ((time.perf_counter_ns() - t0) / 1e9)
    blackbox.disarm()
    out["step_ns"] = statistics.median(step() for _ in range(n))
    print(json.dumps(out))
    sys.exit(0)
if config == "ab":
    # allocation sampling alone: default arm() against arm(allocations=False) (and R = 2 MiB: what R is raised to
    # where a step like this one samples 900 a second; R = 1 GiB: the hooks in, nothing sampled), blocks of 4
    # steps (one more unmeasured after arming) in shuffled order, CPU time; `steps` rounds
    import random
    random.seed(4)
    pairs = {"default": {}, "R = 2 MiB": {"allocations": 2 << 20}, "hooks only (R = 1 GiB)": {"allocations": 1 << 30},
             "off": {"allocations": False}}  # fmt: skip
    cpu = {k: [] for k in pairs}
    for _ in range(steps):
        for name in random.sample(list(pairs), len(pairs)):
            blackbox.arm(ring_dir, capacity=1 << 14, **pairs[name])
            step()
            c0 = time.process_time()
            for _ in range(4):
                step()
            cpu[name].append((time.process_time() - c0) / 4 * 1e9)
            blackbox.disarm()
    out = {}
    for name in ("default", "R = 2 MiB", "hooks only (R = 1 GiB)"):
        r = sorted(a / b for a, b in zip(cpu[name], cpu["off"]))
        n = len(r)
        lo, hi = r[max(0, int(n / 2 - 0.98 * n ** 0.5))], r[min(n - 1, int(n / 2 + 0.98 * n ** 0.5))]
        out[name] = [statistics.median(r), lo, hi]
    out["off_ns"] = statistics.median(cpu["off"])
    print(json.dumps(out))
    sys.exit(0)
if config != "interleaved":
    print(json.dumps({"median_ns": statistics.median(step() for _ in range(steps))}))
    sys.exit(0)
# In one process: blocks of steps of each configuration, in shuffled order; wall and CPU per step.
import random
random.seed(1)
block = 25 if model == "mlp" else 5
walls = {"not": [], "default": [], "noalloc": [], "modules": []}
cpus = {k: [] for k in walls}
for _ in range(max(1, steps // block)):
    order = list(walls)
    random.shuffle(order)  # no configuration always follows another
    for name in order:
        if name != "not":
            # a small ring: creating and writing back a 32 MiB file per block would be measured too
            blackbox.arm(ring_dir, capacity=1 << 14, **SETTINGS[name])
            time.sleep(0.01)  # let the sampler attach its torch hooks
        step()  # one step unmeasured in each block: what arming leaves to the first step is not a step's cost
        c0 = time.process_time()
        walls[name].append(statistics.median(step() for _ in range(block)))
        cpus[name].append((time.process_time() - c0) / block * 1e9)
        blackbox.disarm()
def ratios(per):
    return {k: statistics.median(a / b for a, b in zip(v, per["not"])) for k, v in per.items()}
print(json.dumps({"wall": {k: statistics.median(v) for k, v in walls.items()},
                  "cpu": {k: statistics.median(v) for k, v in cpus.items()},
                  "cpu_ratios": ratios(cpus), "wall_ratios": ratios(walls)}))
"""

CONFIGS = ("not armed", "default", "noalloc", "modules")
NAMES = {"not": "not armed", "default": "default (allocations sampled)", "noalloc": "allocations=False",
         "modules": "modules=True"}  # fmt: skip


def run_job(config: str, steps: int, ring_dir: str, model: str) -> dict[str, Any]:
    """Run JOB in a fresh process; its last stdout line is a JSON object."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_ROOT=str(ROOT))
    env.pop("BLACKBOX_ALLOCATIONS", None)
    out = subprocess.run(
        [sys.executable, "-c", JOB, config.split()[0], str(steps), ring_dir, model],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("mlp", "gpt"), default="gpt", help="gpt: the realistic step (default)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=None, help="steps per process (default 400 mlp, 60 gpt)")
    ap.add_argument("--processes", type=int, default=3, help="processes of interleaved blocks")
    ap.add_argument("--interleaved-only", action="store_true", help="only the in-process alternating blocks")
    ap.add_argument("--ab", type=int, metavar="ROUNDS", help="only allocation sampling against allocations=False: "
                    "ROUNDS rounds of blocks in one process, the median CPU ratio with its 95%% interval")  # fmt: skip
    args = ap.parse_args()
    if args.ab:
        with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
            ab = run_job("ab", args.ab, d, args.model)
        print(f"{args.model}: CPU per step with allocations=False {ab.pop('off_ns') / 1e6:.2f} ms; {args.ab} rounds")
        for name, (med, lo, hi) in ab.items():
            print(f"| {name} / off | {100 * (med - 1):+.2f}% (95%: {100 * (lo - 1):+.2f} .. {100 * (hi - 1):+.2f}%) |")
        return 0
    steps = args.steps or (400 if args.model == "mlp" else 60)
    results: dict[str, list[float]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        for _ in range(0 if args.interleaved_only else args.rounds):
            for config in CONFIGS:
                results[config].append(float(run_job(config, steps, d, args.model)["median_ns"]))
        inter = [run_job("interleaved", steps, d, args.model) for _ in range(args.processes)]
        attributed = run_job("attributed", 0, d, args.model)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    loop = ("small GPT (4 blocks, d=128, 4 heads, seq 64, batch 16), AdamW" if args.model == "gpt" else
            "8x[Linear(256,256), ReLU] + head, batch 64, AdamW")  # fmt: skip
    print(f"loop: {loop}, 1 thread; {steps} steps x {args.rounds} rounds")
    if not args.interleaved_only:
        _fresh_table(results)
    _attributed_table(attributed)
    print(f"\nIn one process, blocks of steps, the four configurations in shuffled order ({args.processes} processes;"
          " medians of the blocks, then of the processes):")
    print("\n| configuration | wall per step | overhead (wall) | CPU per step | overhead (CPU) | per process (CPU) |")
    print("|---|---:|---:|---:|---:|---|")
    for key, name in NAMES.items():
        wall = statistics.median(r["wall"][key] for r in inter)
        cpu = statistics.median(r["cpu"][key] for r in inter)
        wr = statistics.median(r["wall_ratios"][key] for r in inter)
        cr = statistics.median(r["cpu_ratios"][key] for r in inter)
        each = ", ".join(f"{100 * (r['cpu_ratios'][key] - 1):+.2f}%" for r in inter)
        print(f"| {name} | {wall / 1e6:.2f} ms | {100 * (wr - 1):+.2f}% | {cpu / 1e6:.2f} ms | {100 * (cr - 1):+.2f}% |"
              f" {each} |")
    return 0


def _attributed_table(a: dict[str, Any]) -> None:
    step_us, tick_us = a["step_ns"] / 1e3, a["tick_ns"] / 1e3
    sampler_pct = 100 * a["tick_ns"] / 1e8  # one tick per default 0.1 s sample interval
    print("\nWhat the recorder adds, measured directly (events per step x cost per event; sampler tick):")
    print("\n| configuration | events/step | ns/event | us/step | % of this step | + sampler |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in ("default", "modules"):
        e = a[name]
        us = e["events"] * e["ns"] / 1e3
        print(
            f"| {name} | {e['events']:.0f} | {e['ns']:.0f} | {us:.1f} | {100 * us / step_us:.3f}% | "
            f"{sampler_pct:.3f}% ({tick_us:.0f} us per tick) |"
        )
    print(f"\n(the sampler tick without its stack sample: {a['tick_no_stacks_ns'] / 1e3:.0f} us)")
    live = a["live_sampler_ns_per_s"]
    print(f"\nThe sampler thread's own CPU while the job runs (default arm(), its thread's clock): "
          f"{live / 1e3:.0f} us a second, {100 * live / 1e9:.2f}% of a core "
          f"(the warm figure above: {sampler_pct:.3f}%)")  # fmt: skip
    if a.get("samples_per_step") is not None:
        print(f"\nallocation sampling: {a['samples_per_step']:.1f} blocks sampled per step (one per MiB allocated "
              "on average)")
    print(
        f"\n(step: {step_us:.0f} us; modules=True also pays torch's global-hook dispatch, about 1.3 us per hook "
        "call, which only the A/B tables include)"
    )


def _fresh_table(results: dict[str, list[float]]) -> None:
    base = statistics.median(results["not armed"])
    print("\nFresh processes, configurations alternating round by round:")
    print("\n| configuration | median step | overhead | per-round overheads |\n|---|---:|---:|---|")
    for config in CONFIGS:
        med = statistics.median(results[config])
        name = NAMES.get(config.split()[0], config)
        paired = [100 * (v / b - 1) for v, b in zip(results[config], results["not armed"], strict=True)]
        spread = ", ".join(f"{p:+.1f}%" for p in paired) if config != "not armed" else "reference"
        print(f"| {name} | {med / 1e3:.0f} us | {100 * (med / base - 1):+.2f}% | {spread} |")


if __name__ == "__main__":
    sys.exit(main())
