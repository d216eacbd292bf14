"""The sampler thread's CPU against the number of threads in the job (torch's intra-op pool: one per core).

    .venv/bin/python tools/bench_tick_threads.py [--threads 1 32 96] [--repeats 3] [--seconds 8]

Each run is a process of its own: torch's pool started with ``torch.set_num_threads(N)``, then ``arm()``
with its defaults, then the main thread idle for ``--seconds`` while the sampler thread's own CPU clock
is read. Two ways of finding the job's children (DataLoader workers and the like), alternated:
``every tick`` reads every thread's ``/proc/self/task/<tid>/children`` list at each tick (as blackbox did
until 2026-11-29), ``once a second`` is what it does now (host.FULL_SCAN_NS). Prints the median over the
repeats of the sampler thread's share of a core.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = r"""
import os, sys, threading, time
sys.path.insert(0, os.environ["BENCH_ROOT"])
import torch
threads, mode, ring_dir, seconds = int(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
torch.set_num_threads(threads)
a = torch.randn(512, 512)
for _ in range(5):
    a @ a  # the intra-op pool starts
from blackbox.collect import host
if mode == "every tick":
    host.FULL_SCAN_NS = 0
import blackbox
blackbox.arm(ring_dir)
time.sleep(1)
(sampler,) = [t for t in threading.enumerate() if t.name == "blackbox-sampler"]
clock = time.pthread_getcpuclockid(sampler.ident)
c0, t0 = time.clock_gettime_ns(clock), time.monotonic_ns()
time.sleep(seconds)
c1, t1 = time.clock_gettime_ns(clock), time.monotonic_ns()
print(len(os.listdir("/proc/self/task")), 100 * (c1 - c0) / (t1 - t0))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 32, 96])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=8.0)
    args = ap.parse_args()
    modes = ("every tick", "once a second")
    got: dict[tuple[int, str], list[float]] = {}
    tasks: dict[int, int] = {}
    env = {"BENCH_ROOT": str(ROOT), "PATH": "/usr/bin:/bin"}
    for _ in range(args.repeats):
        for n in args.threads:
            for mode in modes:
                with tempfile.TemporaryDirectory(prefix="bench-tick-threads-") as d:
                    out = subprocess.run([sys.executable, "-c", RUN, str(n), mode, d + "/", str(args.seconds)],
                                         env=env, capture_output=True, text=True, timeout=300, check=True)  # fmt: skip
                count, share = out.stdout.split()
                tasks[n] = int(count)
                got.setdefault((n, mode), []).append(float(share))
    print(f"the sampler thread's CPU, % of a core (median of {args.repeats}), an idle armed job, default arm()")
    print(f"  {'torch threads':>13} {'tasks':>6} " + " ".join(f"{m:>15}" for m in modes))
    for n in args.threads:
        row = " ".join(f"{statistics.median(got[(n, m)]):15.2f}" for m in modes)
        print(f"  {n:13d} {tasks[n]:6d} {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
