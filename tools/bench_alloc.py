"""Allocation sampling's cost, side by side: unarmed, armed by default (sampling on), armed with it off.

    python tools/bench_alloc.py [--rounds 7] [--n 300000] [--no-gpt]

Each round runs every workload under the three settings in turn, in one process
(arm and disarm between them), so the machine's noise hits all three alike; the
figures are medians over the rounds of CPU time per iteration, and the ratios
are taken within a round. Workloads: small Python objects (a list, a dict and a
str per iteration: PyMem's OBJ domain), numpy arrays of 64 KiB (malloc), numpy
arrays of 4 MiB (every one sampled: the cost of a sample, its free included),
torch CPU tensors of 256 KiB (c10's posix_memalign; skipped without torch),
each allocated and freed, so sampling and the free-path lookups both run; the
training step of tools/bench_overhead.py's MLP; and the realistic step, a small
GPT on the CPU (tools/small_gpt.py, 20 to 100 ms), in CPU time, which the
machine's other load disturbs less than wall time. Last, what the GPT step
makes: allocations per step (counted by sampling every byte, R = 1), blocks
sampled per step at the default R, and so the cost attributed to sampling.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def numpy_sampled(n: int) -> None:
    for _ in range(n // 100):
        a = np.empty(1 << 19)  # 4 MiB: sampled with probability 1 - e^-4 at R = 1 MiB
        a[0] = 1.0
        del a


def torch_tensors(n: int) -> None:
    import torch

    for _ in range(n // 10):
        t = torch.empty(65536)
        del t


WORKLOADS: dict[str, Callable[[int], None]] = {"python objects": python_objects, "numpy 64 KiB": numpy_arrays,
                                                "numpy 4 MiB": numpy_sampled}  # fmt: skip


def training_steps() -> Callable[[int], None]:
    """tools/bench_overhead.py's loop (tools/small_gpt.py's ``mlp_step``), one step per 10,000 iterations."""
    return _per_10000(_tool_step("mlp_step"))


def gpt_steps() -> Callable[[int], None]:
    """The realistic step (tools/small_gpt.py), one per 10,000 iterations."""
    return _per_10000(_tool_step("gpt_step"))


def _tool_step(name: str) -> Callable[[], None]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import small_gpt

    step: Callable[[], None] = getattr(small_gpt, name)()
    return step


def _per_10000(step: Callable[[], None]) -> Callable[[int], None]:
    def steps(n: int) -> None:
        for _ in range(max(1, n // 10000)):
            step()

    return steps


def timed(fn: Callable[[int], None], n: int) -> float:
    t0 = time.process_time()
    fn(n)
    return (time.process_time() - t0) / n


def attributed(step: Callable[[int], None], folder: str) -> tuple[float, float] | None:
    """(allocations, blocks sampled) per GPT step: every allocation is a sample at R = 1 byte."""
    from blackbox.collect.allocs import sample_module

    cmod = sample_module()
    if cmod is None:
        return None
    out = []
    for mean in (None, 1.0):
        blackbox.arm(folder + "/", sample_interval=3600)
        if mean is not None:
            cmod.set_mean(mean)
        step(10000)  # the countdowns drawn with R
        before = cmod.stats()["samples"]
        step(5 * 10000)
        out.append((cmod.stats()["samples"] - before) / 5)
        blackbox.disarm()
    return out[1], out[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--n", type=int, default=300_000)
    ap.add_argument("--no-gpt", action="store_true", help="leave the realistic step out (about 0.1 s a round)")
    args = ap.parse_args()
    try:
        import torch  # noqa: F401

        WORKLOADS["torch 256 KiB"] = torch_tensors
        WORKLOADS["training step"] = training_steps()
        if not args.no_gpt:
            WORKLOADS["GPT step"] = gpt_steps()
    except ImportError:
        pass
    settings: dict[str, dict[str, Any] | None] = {"unarmed": None, "default": {}, "off": {"allocations": False}}
    results: dict[str, dict[str, list[float]]] = {w: {s: [] for s in settings} for w in WORKLOADS}
    with tempfile.TemporaryDirectory() as folder:
        for fn in WORKLOADS.values():
            fn(args.n // 10)  # warm-up: imports, caches
        for _ in range(args.rounds):
            for name, fn in WORKLOADS.items():
                for setting, kwargs in settings.items():
                    rec = None
                    if kwargs is not None:
                        rec = blackbox.arm(folder + "/", sample_interval=0.1, **kwargs)
                    results[name][setting].append(timed(fn, args.n))
                    if rec is not None:
                        blackbox.disarm()
        made = attributed(WORKLOADS["GPT step"], folder) if "GPT step" in WORKLOADS else None
    print("CPU time per iteration (a training step counts as 10,000 iterations), medians of the rounds:")
    print(f"{'workload':<16} {'unarmed':>10} {'default':>10} {'off':>10} {'default/unarmed':>16} {'off/unarmed':>12} "
          f"{'default/off':>12}")  # fmt: skip
    for name, per in results.items():
        med = {s: statistics.median(v) for s, v in per.items()}
        ratio = {(a, b): statistics.median(x / y for x, y in zip(per[a], per[b], strict=True))
                 for a, b in (("default", "unarmed"), ("off", "unarmed"), ("default", "off"))}  # fmt: skip
        print(f"{name:<16} {med['unarmed'] * 1e9:>8.0f}ns {med['default'] * 1e9:>8.0f}ns {med['off'] * 1e9:>8.0f}ns "
              f"{ratio['default', 'unarmed']:>16.4f} {ratio['off', 'unarmed']:>12.4f} {ratio['default', 'off']:>12.4f}")
    if made is not None:
        allocs, samples = made
        print(f"\nGPT step: {allocs:.0f} allocations (malloc family and PyMem) and {samples:.1f} blocks sampled a step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
