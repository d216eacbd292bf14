"""Step-time overhead of the recorder on a small CPU training loop.

    .venv/bin/python tools/bench_overhead.py [--rounds N] [--steps N]

Each configuration (not armed, default ``arm()``, ``arm(modules=True)``,
``arm(allocations=True)``: allocations sampled by bytes) runs in a fresh
process; configurations alternate round by round so machine drift hits
all alike. Each process reports its median step time; the table gives the
median over rounds and the overhead against "not armed" measured in the same
run. Budget: default at most 1% (never above 3%), ``modules=True`` at most 5%;
allocation sampling goes on by default only within 0.5% (README, "Who holds the memory").
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
import json, sys, time, statistics
config, steps, ring_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
import blackbox
if config == "default":
    blackbox.arm(ring_dir)
elif config == "modules":
    blackbox.arm(ring_dir, modules=True)
elif config == "allocations":
    blackbox.arm(ring_dir, allocations=True)
import torch
torch.set_num_threads(1)
torch.manual_seed(0)
layers = []
for _ in range(8):
    layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 10))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))
def step():
    t0 = time.perf_counter_ns()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return time.perf_counter_ns() - t0
for _ in range(30):
    step()
if config == "attributed":
    # What the recorder itself adds per step, measured directly (far less noisy than A/B on a shared VM):
    # events written per step x the cost of writing one such event, and the sampler's tick.
    from blackbox.ring.reader import read_ring
    out = {}
    for modules in (False, True):
        rec = blackbox.arm(ring_dir, capacity=1 << 16, sample_interval=3600, modules=modules)
        for _ in range(100):
            step()
        blackbox.disarm()
        per_step = len(read_ring(rec.path).records) / 100
        rec = blackbox.arm(ring_dir, capacity=1 << 16, sample_interval=3600)
        ev, rss = rec._writer.event, rec._probe.rss
        t0 = time.perf_counter_ns()
        for _ in range(20000):
            ev(19, "Sequential.0", None, -1, (-1, rss()) if modules else None)
        out["modules" if modules else "default"] = {"events": per_step, "ns": (time.perf_counter_ns() - t0) / 20000}
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
    out["step_ns"] = statistics.median(step() for _ in range(100))
    print(json.dumps(out))
    sys.exit(0)
if config != "interleaved":
    print(json.dumps({"median_ns": statistics.median(step() for _ in range(steps))}))
    sys.exit(0)
# In one process: blocks of steps not armed / armed / armed with modules, alternating.
import random
random.seed(1)
blocks = {"not": [], "default": [], "modules": [], "allocations": []}
for _ in range(steps // 25):
    order = list(blocks)
    random.shuffle(order)  # no configuration always follows another
    for name in order:
        if name != "not":
            # a small ring: creating and writing back a 32 MiB file per block would be measured too
            blackbox.arm(ring_dir, capacity=1 << 14, modules=name == "modules", allocations=name == "allocations")
            time.sleep(0.01)  # let the sampler attach its torch hooks
        blocks[name].append(statistics.median(step() for _ in range(25)))
        blackbox.disarm()
print(json.dumps({k: statistics.median(v) for k, v in blocks.items()}))
"""

CONFIGS = ("not armed", "default", "modules", "allocations")


def run_job(config: str, steps: int, ring_dir: str) -> dict[str, Any]:
    """Run JOB in a fresh process; its last stdout line is a JSON object."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run(
        [sys.executable, "-c", JOB, config.split()[0], str(steps), ring_dir],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--interleaved-only", action="store_true", help="only the in-process alternating blocks")
    args = ap.parse_args()
    results: dict[str, list[float]] = {c: [] for c in CONFIGS}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        for _ in range(0 if args.interleaved_only else args.rounds):
            for config in CONFIGS:
                results[config].append(float(run_job(config, args.steps, d)["median_ns"]))
        inter = [run_job("interleaved", args.steps, d) for _ in range(3)]
        attributed = run_job("attributed", 0, d)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print(
        f"loop: 8x[Linear(256,256), ReLU] + head, batch 64, AdamW, 1 thread; {args.steps} steps x {args.rounds} rounds"
    )
    if not args.interleaved_only:
        _fresh_table(results)
    _attributed_table(attributed)
    print("\nIn one process, blocks of 25 steps, the four configurations in shuffled order (3 processes):")
    print("\n| configuration | median block step | overhead |\n|---|---:|---:|")
    for key, name in (("not", "not armed"), ("default", "default"), ("modules", "modules"),
                      ("allocations", "allocations")):  # fmt: skip
        med = statistics.median(r[key] for r in inter)
        ratios = [r[key] / r["not"] - 1 for r in inter]
        print(f"| {name} | {med / 1e3:.0f} us | {100 * statistics.median(ratios):+.2f}% |")
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
        paired = [100 * (v / b - 1) for v, b in zip(results[config], results["not armed"], strict=True)]
        spread = ", ".join(f"{p:+.1f}%" for p in paired) if config != "not armed" else "reference"
        print(f"| {config} | {med / 1e3:.0f} us | {100 * (med / base - 1):+.2f}% | {spread} |")


if __name__ == "__main__":
    sys.exit(main())
