#!/usr/bin/env python3
"""One full ring recovered (issue 25): seconds, events per second, and the ratio to the Parquet floor,
with the raw ring kept (the default) and without (``--no-raw``), each run in a fresh process.

    python tools/bench_recover_one.py [--events 1000000] [--runs 7] [--baseline SRC]

The ring is tools/bench_ring.py's typical training ring (steps, phases, marks, samples). Each run: a
fresh interpreter recovers it once to warm up (imports, the page cache), then once timed
(``write_postmortem``, no picture), then writes the floor beside it: the same number of rows, 12 int64
columns, by pyarrow to Parquet (zstd), from memory. The ratio is taken run by run, each recovery beside
its own floor.

CPU: the timed recovery's CPU seconds, all its threads (``process_time``), beside the floor's; "x the floor
at best" is that CPU spread evenly over every core of the process's affinity, over the floor: no scheduling
can bring the ratio below it on this machine, only less CPU (or more cores) can. The floor's write is one
pyarrow call, on one core.

--baseline SRC: another blackbox source tree (``git archive REV | tar -x -C DIR``, its C extension built)
run beside this one, run by run alternating (which goes first, too); the ratios of the medians compare
them, and the median of the run-by-run ratios with its quartiles (the machine is noisy: only side-by-side
figures compare).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1] + "/tools")
from bench_ring import parquet_floor_cpu
from blackbox._postmortem import write_postmortem
ring, out, raw = Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "raw"
write_postmortem([ring], out / "warm", plot=False, raw=raw)
t0, c0 = time.perf_counter(), time.process_time()
meta = write_postmortem([ring], out / "timed", plot=False, raw=raw)
seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
floor, floor_cpu = parquet_floor_cpu(ring, meta["events"], out / "floor.parquet")
print(json.dumps({"seconds": seconds, "floor": floor, "events": meta["events"], "cpu": cpu, "floor_cpu": floor_cpu}))
"""


def one_run(tree: Path, ring: Path, raw: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=ring.parent) as out:
        env = dict(os.environ, PYTHONPATH=str(tree))
        args = [sys.executable, "-c", _CHILD, str(tree), str(ring), out, "raw" if raw else "no-raw"]
        proc = subprocess.run(args, capture_output=True, text=True, env=env, check=True, cwd=out)
        return dict(json.loads(proc.stdout.splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--baseline", help="another blackbox source tree to run beside this one")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(HERE / "tools"))
    from bench_ring import typical_ring

    trees = {"this tree": HERE}
    if args.baseline:
        trees["baseline"] = Path(args.baseline).resolve()
    results: dict[tuple[str, bool], list[dict[str, float]]] = {(t, r): [] for t in trees for r in (True, False)}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        ring = typical_ring(Path(d) / "full.ring", args.events)
        for run in range(args.runs):
            for raw in (True, False) if run % 2 else (False, True):  # neither always first
                for name, tree in list(trees.items())[:: -1 if run % 2 else 1]:  # nor either tree
                    results[name, raw].append(one_run(tree, ring, raw))
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {cores} cores; {args.runs} runs each, medians; ratio: each run over its own floor\n")
    print("| tree | raw ring kept | seconds | M events/s | floor seconds | x the floor | CPU seconds | "
          "floor CPU seconds | x the floor at best |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    medians: dict[tuple[str, bool], float] = {}
    for (name, raw), runs in results.items():
        seconds = statistics.median(r["seconds"] for r in runs)
        medians[name, raw] = seconds
        floor = statistics.median(r["floor"] for r in runs)
        ratio = statistics.median(r["seconds"] / r["floor"] for r in runs)
        cpu = statistics.median(r["cpu"] for r in runs)
        floor_cpu = statistics.median(r["floor_cpu"] for r in runs)
        best = statistics.median(r["cpu"] / cores / r["floor"] for r in runs)
        events = runs[0]["events"]
        print(f"| {name} | {'yes' if raw else 'no (--no-raw)'} | {seconds:.3f} | {events / seconds / 1e6:.2f} | "
              f"{floor:.3f} | {ratio:.2f} | {cpu:.3f} | {floor_cpu:.3f} | {best:.2f} |")  # fmt: skip
    if args.baseline:
        for raw in (True, False):
            ratio = medians["baseline", raw] / medians["this tree", raw]
            # run by run: each run of this tree over the baseline's beside it (a loaded machine's drift cancels)
            paired = sorted(b["seconds"] / t["seconds"] for t, b in zip(results["this tree", raw],
                                                                         results["baseline", raw], strict=True))
            q = statistics.quantiles(paired, n=4) if len(paired) > 1 else paired * 3
            print(f"\nraw kept {'yes' if raw else 'no'}: this tree is {ratio:.2f}x as fast as the baseline "
                  f"(run by run: median {statistics.median(paired):.2f}x, quartiles {q[0]:.2f} to {q[2]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
