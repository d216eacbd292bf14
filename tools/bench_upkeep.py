"""The sampler's upkeep, once a tick (signal re-wrap checks, faulthandler and descriptor checks): its time, per tree.

    .venv/bin/python tools/bench_upkeep.py [--before TREE] [--runs 7] [--calls 2000]

Each tree (this one, and ``--before``: another checkout with its C extension built) runs in a process of its
own: ``arm(allocations=False)`` with the tick held off, then ``upkeep`` called ``--calls`` times, ``--runs``
times; printed: the median microseconds a call and each run's. The trees alternate, so a slower moment of the
machine falls on both. The upkeep runs on the sampler thread with the GIL held: it is time the job's threads
wait for, ten times a second.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

RUN = r"""
import sys, tempfile, time
sys.path.insert(0, sys.argv[1])
import blackbox
from blackbox._recorder_collect import upkeep
rec = blackbox.arm(tempfile.mkdtemp() + "/", allocations=False, sample_interval=1000)
calls = int(sys.argv[2])
t0 = time.perf_counter_ns()
for _ in range(calls):
    upkeep(rec)
print((time.perf_counter_ns() - t0) / calls / 1000)
blackbox.disarm()
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="another checkout, its C extension built")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args(argv)
    trees = [ROOT, *([args.before.resolve()] if args.before else [])]
    times: dict[Path, list[float]] = {tree: [] for tree in trees}
    for _ in range(args.runs):
        for tree in trees:
            out = subprocess.run([sys.executable, "-c", RUN, str(tree), str(args.calls)], capture_output=True,
                                 text=True, check=True, cwd="/")  # fmt: skip
            times[tree].append(float(out.stdout.split()[-1]))
    for tree, runs in times.items():
        print(f"{tree}: upkeep {statistics.median(runs):.1f} us a call (runs {', '.join(f'{r:.1f}' for r in runs)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
