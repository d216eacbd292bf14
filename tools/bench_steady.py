"""Allocation sampling's cost in the steady state of a realistic step: long-lived processes taking turns.

    .venv/bin/python tools/bench_steady.py [--rounds 100] [--processes 3] [--warmup 60] [--model gpt]

``bench_overhead.py --ab`` arms afresh for every block of steps, so it measures a ring's first
seconds (new tables, first stacks, first pages) over and over. A long job pays those once. Here
each configuration runs in ``--processes`` processes of its own, armed once and warmed up for
``--warmup`` steps, side by side (the sampling interval has settled by then where a continuous run of
the step puts it: the tick raises R where a job samples more than 500 blocks a second of the time it
ran, its wait for a core left out; 4 MiB for the GPT step here, as alone), and then every process of
every configuration runs a block of steps in turn (one unmeasured step, then ``--block`` measured),
in a new shuffled order each round: only one process runs at a time, so every block meets the same
machine, and drift in the machine's load falls on all configurations alike. (Before the rate left
out the wait for a core, taking turns kept R at 1 MiB, what no continuous run of the step pays.)

Configurations: not armed; ``arm(allocations=False)``; default ``arm()`` (sampling on); the hooks
in with nothing sampled (R = 1 GiB). Figures: CPU time per step (the whole process: the sampler
thread's share included; its main thread's alone; and the wall time of the step, which the process
running alone makes mean what a user times), each round's mean over a configuration's processes against
``allocations=False`` (what sampling costs) and against not armed (what arming costs in all), the
median over the rounds with its 95% interval; and the processes' own medians, whose spread is the
part of the difference that a process's memory layout makes and that no number of rounds removes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

WORKER = r"""
import json, os, resource, sys, time
config, warmup, ring_dir, model = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, os.path.join(os.environ["BENCH_ROOT"], "tools"))
import blackbox
SETTINGS = {"off": {"allocations": False}, "default": {}, "hooks": {"allocations": 1 << 30}}
if config in SETTINGS:
    blackbox.arm(ring_dir, **SETTINGS[config])
from blackbox.collect.allocs import sample_module
cmod = sample_module() if config in ("default", "hooks") else None
import torch
from small_gpt import gpt_step, mlp_step
run = gpt_step() if model == "gpt" else mlp_step()
for _ in range(warmup):
    run()
print("ready", flush=True)
for line in sys.stdin:
    n = int(line)
    run()  # the other processes' turns left this one's caches cold: the same for every configuration
    s0 = cmod.stats()["samples"] if cmod is not None else 0
    f0, c0, m0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.process_time_ns(), time.thread_time_ns()
    w0 = time.perf_counter_ns()
    for _ in range(n):
        run()
    w1 = time.perf_counter_ns()
    c1, m1, f1 = time.process_time_ns(), time.thread_time_ns(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    s1 = cmod.stats()["samples"] if cmod is not None else 0
    print(json.dumps({"cpu_ns": (c1 - c0) / n, "main_ns": (m1 - m0) / n, "wall_ns": (w1 - w0) / n,
                      "faults": (f1 - f0) / n, "samples": (s1 - s0) / n}), flush=True)
"""

TOGGLE = r"""
import json, os, random, sys, time
rounds, warmup, ring_dir, model, block, settle = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4],
                                                  int(sys.argv[5]), int(sys.argv[6]))
sys.path.insert(0, os.path.join(os.environ["BENCH_ROOT"], "tools"))
import blackbox
from blackbox.collect.allocs import sample_module
cmod = sample_module()
saved = {}
def keep(name):  # the arguments arm() gives the hooks, to start them again the same way
    real = getattr(cmod, name)
    def call(*args):
        saved[name] = args
        return real(*args)
    setattr(cmod, name, call)
keep("start"); keep("set_tail")
rec = blackbox.arm(ring_dir)
rec._allocs._adapt = lambda: None  # R stays what each block sets
import torch
from small_gpt import gpt_step, mlp_step
run = gpt_step() if model == "gpt" else mlp_step()
for _ in range(warmup):
    run()
MEANS = {"off": None, "R = 4 MiB (where the step settles)": 4 << 20, "hooks": 1 << 30}
got = {k: [] for k in MEANS}
started = True
for _ in range(rounds):
    for name in random.sample(list(MEANS), len(MEANS)):
        rec._allocs.started = False  # the sampler thread's tick leaves the hooks alone meanwhile
        if started:
            cmod.stop(False)
            started = False
        if MEANS[name] is not None:
            a = saved["start"]
            cmod.start(*a[:6], float(MEANS[name]), *a[7:])
            cmod.set_tail(*saved["set_tail"])
            started = rec._allocs.started = True
        each = []
        for _ in range(settle + block):
            c0 = time.process_time_ns()
            run()
            each.append(time.process_time_ns() - c0)
        s1 = cmod.stats()["samples"] if started else 0
        got[name].append({"cpu_ns": sum(each[settle:]) / block, "samples": s1 / (settle + block), "each": each})
print(json.dumps(got))
"""

CONFIGS = {"not": "not armed", "off": "allocations=False", "default": "default (sampling on)",
           "hooks": "hooks in, nothing sampled (R = 1 GiB)"}  # fmt: skip


def pct(med: float, lo: float, hi: float) -> str:
    return f"{100 * (med - 1):+.2f}% ({100 * (lo - 1):+.2f} .. {100 * (hi - 1):+.2f})"


def interval(ratios: list[float]) -> tuple[float, float, float]:
    """The median and its 95% interval by order statistics (no assumption about the distribution)."""
    r = sorted(ratios)
    n = len(r)
    lo, hi = r[max(0, int(n / 2 - 0.98 * n**0.5))], r[min(n - 1, int(n / 2 + 0.98 * n**0.5))]
    return statistics.median(r), lo, hi


def between(a: list[float], b: list[float], draws: int = 4000) -> tuple[float, float, float]:
    """The ratio of two configurations' mean process medians, with a 95% interval from resampling the
    processes (each a memory layout of its own): the interval holds what layout makes of a process, which
    the rounds' intervals do not."""
    rng = random.Random(1)
    ratio = statistics.fmean(a) / statistics.fmean(b)
    boot = sorted(statistics.fmean(rng.choices(a, k=len(a))) / statistics.fmean(rng.choices(b, k=len(b)))
                  for _ in range(draws))  # fmt: skip
    return ratio, boot[int(0.025 * draws)], boot[int(0.975 * draws)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=("mlp", "gpt"), default="gpt")
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--processes", type=int, default=3, help="processes per configuration")
    ap.add_argument("--warmup", type=int, default=60, help="steps each process runs before the first round")
    ap.add_argument("--block", type=int, default=4, help="measured steps per turn")
    ap.add_argument("--settle", type=int, default=2, help="--toggle: steps unmeasured after the hooks start")
    ap.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS),
                    help="configurations to run (fewer: more processes each for the same memory)")
    ap.add_argument("--toggle", action="store_true", help="in one process: the hooks stopped and started again")
    args = ap.parse_args()
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_ROOT=str(ROOT))
    env.pop("BLACKBOX_ALLOCATIONS", None)
    if args.toggle:
        return toggle(args, env)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        procs = {(c, i): subprocess.Popen([sys.executable, "-c", WORKER, c, str(args.warmup), d, args.model],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
                 for c in args.configs for i in range(args.processes)}  # fmt: skip
        try:
            for key, p in procs.items():  # started together, warmed up side by side
                assert p.stdout is not None
                if p.stdout.readline().strip() != "ready":
                    raise SystemExit(f"worker {key} did not start")
            got: dict[tuple[str, int], list[dict[str, float]]] = {k: [] for k in procs}
            order = list(procs)
            for _ in range(args.rounds):
                random.shuffle(order)
                for key in order:
                    p = procs[key]
                    assert p.stdin is not None and p.stdout is not None
                    p.stdin.write(f"{args.block}\n")
                    p.stdin.flush()
                    got[key].append(json.loads(p.stdout.readline()))
        finally:
            for p in procs.values():
                if p.stdin is not None:
                    p.stdin.close()
                p.wait()
    report(got, args)
    return 0


def toggle(args: argparse.Namespace, env: dict[str, str]) -> int:
    """One process armed once; each block stops the hooks (allocations=False from then on) and, for the
    sampled configurations, starts them again as arm() did with the block's R (4 MiB, where a running GPT step
    settles; 1 GiB, the hooks in with nothing sampled); ``--settle`` steps unmeasured."""
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        argv = [str(a) for a in (args.rounds, args.warmup, d, args.model, args.block, args.settle)]
        out = subprocess.run([sys.executable, "-c", TOGGLE, *argv], capture_output=True, text=True, env=env, check=True)
    got: dict[str, list[dict[str, Any]]] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.model}: one process, {args.warmup} steps of warm-up, {args.rounds} rounds of {args.block} steps "
          f"per configuration; load average now {os.getloadavg()[0]:.1f}")  # fmt: skip
    print("\n| configuration | CPU per step | against the hooks stopped (95%) | samples a step |\n|---|---:|---:|---:|")
    off = [b["cpu_ns"] for b in got["off"]]
    for name, blocks in got.items():
        cpu = [b["cpu_ns"] for b in blocks]
        against = "" if name == "off" else pct(*interval([a / b for a, b in zip(cpu, off, strict=True)]))
        print(f"| {name} | {statistics.median(cpu) / 1e6:.2f} ms | {against} |"
              f" {statistics.median(b['samples'] for b in blocks):.0f} |")  # fmt: skip
    print("\nStep by step after the hooks started (the unmeasured ones first), median against the same step of 'off':")
    for name, blocks in got.items():
        if name != "off":
            each = [interval([a["each"][i] / b["each"][i] for a, b in zip(blocks, got["off"], strict=True)])[0]
                    for i in range(args.settle + args.block)]  # fmt: skip
            print(f"  {name}: " + " ".join(f"{100 * (r - 1):+.1f}" for r in each))
    return 0


def report(got: dict[tuple[str, int], list[dict[str, float]]], args: argparse.Namespace) -> None:
    def rounds(key: str) -> dict[str, list[float]]:
        return {c: [statistics.fmean(got[c, i][r][key] for i in range(args.processes)) for r in range(args.rounds)]
                for c in args.configs}  # fmt: skip

    per_round, main_thread, wall = rounds("cpu_ns"), rounds("main_ns"), rounds("wall_ns")
    print(f"{args.model}: {args.processes} processes per configuration, {args.warmup} steps of warm-up, "
          f"{args.rounds} rounds of {args.block} steps; load average now {os.getloadavg()[0]:.1f}")  # fmt: skip
    medians = {c: [statistics.median(b["cpu_ns"] for b in got[c, i]) for i in range(args.processes)]
               for c in args.configs}  # fmt: skip
    print("\n| configuration | CPU per step | against allocations=False (95%) | against not armed (95%) |"
          " the job's thread alone, against allocations=False | wall time a step, against allocations=False |"
          " between processes, against allocations=False (95%) | processes' medians | faults a step |"
          " samples a step | other threads' CPU a step |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for c in args.configs:
        name, cols = CONFIGS[c], []
        for table, base in ((per_round, "off"), (per_round, "not"), (main_thread, "off"), (wall, "off")):
            if c == base or base not in table:
                cols.append("")
                continue
            ratios = [a / b for a, b in zip(table[c], table[base], strict=True)]
            cols.append(pct(*interval(ratios)))
        cols.append("" if c == "off" or "off" not in medians else pct(*between(medians[c], medians["off"])))
        each = ", ".join(f"{statistics.median(b['cpu_ns'] for b in got[c, i]) / 1e6:.2f}"
                         for i in range(args.processes))  # fmt: skip
        faults = statistics.median(b["faults"] for i in range(args.processes) for b in got[c, i])
        samples = statistics.median(b["samples"] for i in range(args.processes) for b in got[c, i])
        others = statistics.median(b["cpu_ns"] - b["main_ns"] for i in range(args.processes) for b in got[c, i])
        print(f"| {name} | {statistics.median(per_round[c]) / 1e6:.2f} ms | {' | '.join(cols)} | {each} ms |"
              f" {faults:.0f} | {samples:.0f} | {others / 1e3:.0f} us |")  # fmt: skip
    spread = [100 * (statistics.median(b["cpu_ns"] for b in got[c, i]) / statistics.median(per_round[c]) - 1)
              for c in args.configs for i in range(args.processes)]  # fmt: skip
    print(
        f"\nA process's own median against its configuration's: {min(spread):+.2f} .. {max(spread):+.2f}% "
        "(what layout makes of one process; the rounds' intervals above do not include it)"
    )


if __name__ == "__main__":
    sys.exit(main())
