"""The sampler's tick beside a job thread busy in Python: its wall time, CPU and rate, reads releasing the GIL or not.

    .venv/bin/python tools/bench_tick_gil.py [--repeats 3] [--seconds 8]

A system call made through ``os.pread`` or a ctypes CDLL function releases the GIL; when the job's main
thread is busy in Python it takes the GIL and keeps it for the switch interval (5 ms) before the sampler
thread gets it back, so a tick of ~25 such calls stretches over tens of milliseconds. ``released`` is
blackbox before 2026-11-29 (os.pread, os.open, os.close, sigaction through CDLL); ``held`` is now (libc's
through ctypes.PyDLL). Identity checks (os.fstat), memory.stat (its read may flush per-CPU statistics for
milliseconds) and the sampler's own wait release it either way.
Each run is a process of its own: ``arm(allocations=False)``, then the main thread counting words in a
dict for ``--seconds``; printed: ticks a second (10 is the interval), a tick's wall time and CPU, and the
main thread's step (and each run's), medians over ``--repeats``; ``not armed`` for the step alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = r"""
import ctypes, json, os, statistics, sys, time
sys.path.insert(0, os.environ["BENCH_ROOT"])
mode, ring_dir, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
from blackbox.collect import death_signals, host
if mode == "released":
    host.PREAD, host._OPEN, host._CLOSE = os.pread, os.open, os.close  # (before arm: its Sources take PREAD)
    death_signals._libc_sigaction.cache_clear()
    death_signals._libc_sigaction = lambda: ctypes.CDLL(None, use_errno=True).sigaction
import blackbox
wall, cpu = [], []
rec = blackbox.arm(ring_dir, allocations=False) if mode != "not armed" else None
sample = rec.sample_now if rec is not None else None
def timed():
    t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
    try:
        return sample()
    finally:
        wall.append(time.perf_counter_ns() - t0)
        cpu.append(time.thread_time_ns() - c0)
if rec is not None:
    rec.sample_now = timed
words = [f"w{i % 977}" for i in range(300000)]
steps, t0 = 0, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    counts = {}
    for w in words:
        counts[w] = counts.get(w, 0) + 1
    steps += 1
elapsed = time.perf_counter() - t0
print(json.dumps({"ticks_s": len(wall) / elapsed, "wall_us": statistics.median(wall or [0]) / 1e3,
                  "cpu_us": statistics.median(cpu or [0]) / 1e3, "step_ms": elapsed / steps * 1e3}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    modes = ("not armed", "released", "held")
    got: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
    env = {"BENCH_ROOT": str(ROOT), "PATH": "/usr/bin:/bin"}
    for _ in range(args.repeats):
        for mode in modes:
            with tempfile.TemporaryDirectory(prefix="bench-tick-gil-") as d:
                out = subprocess.run([sys.executable, "-c", RUN, mode, d + "/", str(args.seconds)], env=env,
                                     capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
            got[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"the tick beside a main thread busy in Python, arm(allocations=False), medians of {args.repeats}")
    print(f"  {'reads':>9} {'ticks/s':>8} {'tick wall':>11} {'tick CPU':>10} {'main step':>10}")
    for mode in modes:
        runs = got[mode]

        def med(key: str, runs: list[dict[str, float]] = runs) -> float:
            return statistics.median(r[key] for r in runs)

        steps = ", ".join(f"{r['step_ms']:.1f}" for r in runs)
        print(f"  {mode:>9} {med('ticks_s'):8.1f} {med('wall_us'):8.0f} us {med('cpu_us'):7.0f} us "
              f"{med('step_ms'):7.2f} ms  ({steps})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
