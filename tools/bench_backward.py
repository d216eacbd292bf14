"""What recording the backward phase costs per ``backward()`` call: none, the Python wrapper blackbox used
before, and the C extension's ``PhaseCall`` (no Python frame), side by side in one process.

    .venv/bin/python tools/bench_backward.py [--rounds 15] [--calls 2000] [--width 64]

Each round times ``--calls`` backward passes of a small model (a 2-layer MLP of ``--width``, batch 8: a
backward short enough that a per-call cost shows) through each way in turn, writing the phase's two
events into a real armed ring; prints the median over rounds of the time per call, and each way's
difference from the unwrapped call measured in the same rounds; then the same around a function that does
nothing, which isolates the wrapping's own cost from the backward's noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import blackbox  # noqa: E402
from blackbox.ring import format as fmt  # noqa: E402
from blackbox.ring.writer import built_module  # noqa: E402

BEGIN, END = fmt.KIND_CODES["phase_begin"], fmt.KIND_CODES["phase_end"]


def python_wrapper(original: Any, event: Any) -> Any:
    """The wrapper torch_hooks.py put around torch.autograd.backward before PhaseCall."""

    def backward(*args: Any, **kwargs: Any) -> Any:
        t0 = event(BEGIN, "backward")
        try:
            return original(*args, **kwargs)
        finally:
            event(END, "backward", time.monotonic_ns() - t0 if t0 else None)

    return backward


def _noop(loss: Any) -> None:
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--calls", type=int, default=2000)
    p.add_argument("--width", type=int, default=64)
    a = p.parse_args()
    torch.set_num_threads(1)
    cmod = built_module()
    if cmod is None:
        raise SystemExit("the C extension is not built: nothing to compare")
    with tempfile.TemporaryDirectory() as tmp:
        rec = blackbox.Recorder.arm(Path(tmp) / "b.ring", sample_interval=3600, stacks=False)
        event = rec._event
        original = torch.autograd.backward
        ways = {"unwrapped": original, "Python wrapper (before)": python_wrapper(original, event),
                "PhaseCall (C, no frame)": cmod.PhaseCall(original, event, BEGIN, END, "backward")}  # fmt: skip
        model = torch.nn.Sequential(torch.nn.Linear(a.width, a.width), torch.nn.ReLU(), torch.nn.Linear(a.width, 1))
        x = torch.randn(8, a.width)
        per_call: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(a.rounds):
            for name, backward in ways.items():
                losses = [model(x).sum() for _ in range(a.calls)]
                t0 = time.perf_counter_ns()
                for loss in losses:
                    backward(loss)
                per_call[name].append((time.perf_counter_ns() - t0) / a.calls)
        noop_ways = {"unwrapped": _noop, "Python wrapper (before)": python_wrapper(_noop, event),
                     "PhaseCall (C, no frame)": cmod.PhaseCall(_noop, event, BEGIN, END, "backward")}  # fmt: skip
        noop: dict[str, list[float]] = {name: [] for name in noop_ways}
        for _ in range(a.rounds):
            for name, fn in noop_ways.items():
                t0 = time.perf_counter_ns()
                for _ in range(100_000):
                    fn(None)
                noop[name].append((time.perf_counter_ns() - t0) / 100_000)
        rec.disarm()
    print(f"{a.rounds} rounds x {a.calls} backward calls (MLP width {a.width}, batch 8, 1 thread); ns per call")
    print(f"{'way':<26} {'median':>10} {'vs unwrapped':>14}")
    for name, values in per_call.items():
        m = statistics.median(values)
        diffs = [v - u for v, u in zip(values, per_call["unwrapped"], strict=True)]
        print(f"{name:<26} {m:>10.0f} {statistics.median(diffs):>+14.0f}")
    print(f"\nthe same around a no-op (the wrapping's own cost, {a.rounds} rounds x 100,000 calls); ns per call")
    for name, values in noop.items():
        diffs = [v - u for v, u in zip(values, noop["unwrapped"], strict=True)]
        print(f"{name:<26} {statistics.median(values):>10.0f} {statistics.median(diffs):>+14.0f}")


if __name__ == "__main__":
    main()
