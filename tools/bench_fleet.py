#!/usr/bin/env python3
"""Recovery at fleet scale: wall time and peak RSS of `blackbox recover` over every ring of a large job
at once, of each host's own recovery, and of the job-wide summary over the host bundles.

    python tools/bench_fleet.py [--ranks 1000] [--hosts 4] [--ring-mib 2] [--runs 3] [--keep DIR]
                                [--baseline SRC]

Makes the job once with tools/fleet.py (real processes, one UTS namespace per host, all SIGKILLed),
then times each command --runs times, each in a fresh process whose own peak RSS is read with wait4.
Prints medians (and the spread) per command, and checks the bound "peak RSS at most the largest
ring + 300 MiB".

--baseline SRC: also run every command with another source tree of blackbox (a worktree of an
earlier commit: ``git worktree add /tmp/old REV``), interleaved run by run with this one, and print
the ratios of the medians (these machines are shared and noisy: only side-by-side ratios compare).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent


BOUND = 300 << 20  # peak RSS at most the largest ring + this


def measure(cmd: list[str], source: Path = HERE) -> tuple[float, int]:
    """(wall seconds, peak RSS bytes) of one command, run alone with blackbox from ``source``."""
    wall, peak, _ = measure_cpu(cmd, source)
    return wall, peak


def measure_cpu(cmd: list[str], source: Path = HERE) -> tuple[float, int, float]:
    """:func:`measure`, and the command's CPU seconds (user and system, all its threads)."""
    env = dict(os.environ, PYTHONPATH=str(source))
    t0 = time.perf_counter()
    # run from the source tree: `python -m` puts the working folder first on the path
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=source)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"bench_fleet: {' '.join(cmd)} failed: {proc.stderr.read().decode() if proc.stderr else ''}")
    return wall, usage.ru_maxrss * 1024, usage.ru_utime + usage.ru_stime


def report(name: str, runs: list[tuple[float, int]], base: list[tuple[float, int]] | None = None) -> None:
    walls, peaks = [w for w, _ in runs], [p for _, p in runs]
    print(f"{name:<44} wall median {statistics.median(walls):7.2f} s (min {min(walls):.2f}, max {max(walls):.2f})"
          f"   peak RSS median {statistics.median(peaks) / 2**20:7.0f} MiB (max {max(peaks) / 2**20:.0f})")  # fmt: skip
    if base:
        bw, bp = statistics.median(w for w, _ in base), statistics.median(p for _, p in base)
        wall, peak = statistics.median(walls) / bw, statistics.median(peaks) / bp
        print(f"{'  baseline':<44} wall median {bw:7.2f} s   peak RSS median {bp / 2**20:7.0f} MiB   "
              f"ratio this/baseline: wall {wall:.2f}, peak {peak:.2f}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, default=1000)
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--ring-mib", type=int, default=2)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", help="make (or reuse) the job's rings here instead of a temporary folder")
    ap.add_argument("--baseline", help="another blackbox source tree to run beside this one (ratios)")
    args = ap.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-fleet-"))
    rings = work / "rings"
    try:
        if not rings.exists():
            subprocess.run([sys.executable, str(HERE / "tools" / "fleet.py"), str(rings), "--ranks", str(args.ranks),
                            "--hosts", str(args.hosts), "--ring-mib", str(args.ring_mib), "--per-host",
                            "--victim", str(args.ranks * 613 // 1000)],
                           check=True)  # fmt: skip
        hosts = sorted(p for p in rings.iterdir() if p.is_dir())
        files = list(rings.glob("*/*.ring"))
        total = sum(f.stat().st_size for f in files)
        print(f"{len(files)} rings on {len(hosts)} hosts, {total / 2**30:.2f} GiB, the largest "
              f"{max(f.stat().st_size for f in files) / 2**20:.1f} MiB; {os.cpu_count()} cores")  # fmt: skip
        largest = max(f.stat().st_size for f in files)
        bb = [sys.executable, "-m", "blackbox"]
        sources = [HERE, *([Path(args.baseline).resolve()] if args.baseline else [])]
        every: dict[Path, list[tuple[float, int]]] = {s: [] for s in sources}
        per_host: dict[Path, list[tuple[float, int]]] = {s: [] for s in sources}
        job: dict[Path, list[tuple[float, int]]] = {s: [] for s in sources}
        for run in range(args.runs):
            for source in sources:  # interleaved: each run of this tree beside one of the baseline
                out = work / f"all-{run}"
                every[source].append(measure([*bb, "recover", *map(str, hosts), "-o", str(out)], source))
                shutil.rmtree(out)
                bundles = work / f"bundles-{sources.index(source)}"
                per_host[source] += [measure([*bb, "recover", str(h), "-o", str(bundles / h.name)], source)
                                     for h in hosts]  # fmt: skip
                job[source].append(measure([*bb, "summary", str(bundles)], source))
        base = sources[-1] if args.baseline else None
        report(f"recover all {len(files)} rings into one bundle", every[HERE], every[base] if base else None)
        report(f"recover one host's rings (x{len(hosts)})", per_host[HERE], per_host[base] if base else None)
        report(f"summary over {len(hosts)} host bundles (job-wide)", job[HERE], job[base] if base else None)
        summary = subprocess.run([*bb, "summary", str(work / "bundles-0")], capture_output=True, text=True,
                                 env=dict(os.environ, PYTHONPATH=str(HERE)), cwd=HERE, check=True).stdout  # fmt: skip
        print(f"job-wide summary.md: {len(summary.splitlines())} lines")
        highest = max(p for runs in (every[HERE], per_host[HERE], job[HERE]) for _, p in runs)
        verdict = "within" if highest <= largest + BOUND else "OVER"
        print(f"bound: largest ring {largest / 2**20:.1f} MiB + 300 MiB = {(largest + BOUND) / 2**20:.0f} MiB; "
              f"highest peak {highest / 2**20:.0f} MiB: {verdict}")  # fmt: skip
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
