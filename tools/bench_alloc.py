"""Allocation-heavy micro-benchmarks, side by side: unarmed, armed, armed with allocation sampling.

    python tools/bench_alloc.py [--rounds 7] [--n 300000]

Each round runs every workload under the three settings in turn, in one process
(arm and disarm between them), so the machine's noise hits all three alike; the
figures are medians over the rounds of CPU time per iteration, and the ratios
are taken within a round. Workloads: small Python objects (a list, a dict and a
str per iteration: PyMem's OBJ domain), numpy arrays of 64 KiB (malloc), torch
CPU tensors of 256 KiB (c10's posix_memalign; skipped without torch), each
allocated and freed, so sampling and the free-path lookups both run; and the
training step of tools/bench_overhead.py (an MLP, AdamW, one thread), in CPU
time, which the machine's other load disturbs less than wall time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

import blackbox  # noqa: E402


def python_objects(n: int) -> None:
    for i in range(n):
        x = [i, i]
        y = {"a": i}
        z = str(i) * 3
        del x, y, z


def numpy_arrays(n: int) -> None:
    for _ in range(n // 10):
        a = np.empty(8192)
        a[0] = 1.0
        del a


def torch_tensors(n: int) -> None:
    import torch

    for _ in range(n // 10):
        t = torch.empty(65536)
        del t


WORKLOADS: dict[str, Callable[[int], None]] = {"python objects": python_objects, "numpy 64 KiB": numpy_arrays}


def training_steps() -> Callable[[int], None]:
    """tools/bench_overhead.py's loop: 8x[Linear(256, 256), ReLU] + head, batch 64, AdamW, one thread."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def steps(n: int) -> None:
        for _ in range(max(1, n // 10000)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()

    return steps


def timed(fn: Callable[[int], None], n: int) -> float:
    t0 = time.process_time()
    fn(n)
    return (time.process_time() - t0) / n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=300_000)
    args = ap.parse_args()
    try:
        import torch  # noqa: F401

        WORKLOADS["torch 256 KiB"] = torch_tensors
        WORKLOADS["training step"] = training_steps()
    except ImportError:
        pass
    settings = {"unarmed": None, "armed": False, "armed+allocations": True}
    results: dict[str, dict[str, list[float]]] = {w: {s: [] for s in settings} for w in WORKLOADS}
    with tempfile.TemporaryDirectory() as folder:
        for fn in WORKLOADS.values():
            fn(args.n // 10)  # warm-up: imports, caches
        for _ in range(args.rounds):
            for name, fn in WORKLOADS.items():
                for setting, allocations in settings.items():
                    rec = None
                    if allocations is not None:
                        rec = blackbox.arm(folder + "/", allocations=allocations, sample_interval=0.1)
                    results[name][setting].append(timed(fn, args.n))
                    if rec is not None:
                        blackbox.disarm()
    print("CPU time per iteration (a training step counts as 10,000 iterations), medians of the rounds:")
    print(f"{'workload':<16} {'unarmed':>10} {'armed':>10} {'+alloc':>10} {'armed/unarmed':>14} {'+alloc/unarmed':>15}")
    for name, per in results.items():
        med = {s: statistics.median(v) for s, v in per.items()}
        r1 = statistics.median(a / u for a, u in zip(per["armed"], per["unarmed"], strict=True))
        r2 = statistics.median(a / u for a, u in zip(per["armed+allocations"], per["unarmed"], strict=True))
        print(f"{name:<16} {med['unarmed'] * 1e9:>8.0f}ns {med['armed'] * 1e9:>8.0f}ns "
              f"{med['armed+allocations'] * 1e9:>8.0f}ns {r1:>14.3f} {r2:>15.3f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
