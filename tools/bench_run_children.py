#!/usr/bin/env python3
"""A job of many short Python processes under `blackbox run`: wall time, unarmed against armed.

    python tools/bench_run_children.py [--children 300] [--runs 3] [--baseline SRC]

The job is a shell loop running ``python -c pass`` (a short script) --children times, then the same
loop of ``python -c "import numpy"`` (a short script doing array work). Each job is timed whole,
unarmed (``sh -c LOOP``) and armed (``blackbox run -- sh -c LOOP``), the two interleaved run by run;
prints the median wall time of each and the median of the run-by-run ratios armed/unarmed.

--baseline SRC: also time ``blackbox run`` from another source tree of blackbox (a worktree of an
earlier commit: ``git worktree add /tmp/old REV``; its C extension built or copied in), in the same
interleaving, and print its ratios to unarmed too (the machines are shared and noisy: only
side-by-side ratios compare).
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
SCRIPTS = {"python -c pass": "pass", 'python -c "import numpy"': "import numpy"}


def timed(cmd: list[str], source: Path | None) -> float:
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)
    t0 = time.perf_counter()
    subprocess.run(cmd, env=env, cwd=source or HERE, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--baseline", type=Path, help="another blackbox source tree, timed side by side")
    args = parser.parse_args()
    sources: dict[str, Path] = {"this tree": HERE}
    if args.baseline:
        sources["baseline"] = args.baseline.resolve()
    print(f"{args.children} children a job, {args.runs} runs each, interleaved; python {sys.version.split()[0]}")
    with tempfile.TemporaryDirectory(prefix="bench-run-children-") as scratch:
        for name, code in SCRIPTS.items():
            loop = f"for i in $(seq {args.children}); do {shlex.quote(sys.executable)} -c {shlex.quote(code)}; done"
            unarmed: list[float] = []
            armed: dict[str, list[float]] = {k: [] for k in sources}
            for _ in range(args.runs):
                unarmed.append(timed(["sh", "-c", loop], None))
                for label, source in sources.items():
                    run = [sys.executable, "-m", "blackbox", "run", "--dir", scratch, "--quiet", "--", "sh", "-c", loop]
                    armed[label].append(timed(run, source))
            base = statistics.median(unarmed)
            print(f"\n{name} x {args.children}: unarmed {base:.1f} s (runs {', '.join(f'{t:.1f}' for t in unarmed)})")
            for label, times in armed.items():
                ratios = [a / u for a, u in zip(times, unarmed, strict=True)]
                each = ", ".join(f"{t:.1f}" for t in times)
                print(f"  armed, {label}: {statistics.median(times):.1f} s (runs {each}); "
                      f"armed/unarmed {statistics.median(ratios):.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
