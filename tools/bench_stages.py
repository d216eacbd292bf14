#!/usr/bin/env python3
"""Where one full ring's recovery goes (issue 25): the wall time of each stage of ``write_postmortem`` (no
picture, no raw ring), each run in a fresh process, this tree and optionally another side by side.

    python tools/bench_stages.py [--events 1000000] [--runs 5] [--baseline SRC]

Stages: reading and validating the ring (``read_ring``), its timeline (``ring_table``), the diagnosis and the
metadata (everything else the decode does: evidence, ``diagnose``, ``ring_metadata``), then writing the
timeline's row groups (from the end of the decode to the end of ``_write_row_groups``), and the whole call.
The ring is tools/bench_ring.py's typical training ring; each process recovers it once to warm up, then
once timed.

--baseline SRC: another blackbox source tree (``git archive REV | tar -x -C DIR``, its C extension built),
run by run in alternation; the machine is noisy, so only side-by-side figures compare.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, shutil, sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from blackbox._postmortem import write_postmortem
from blackbox.recovery import bundle, pipeline
ring, out = Path(sys.argv[2]), Path(sys.argv[3])
marks = {}
def timed(module, name):
    real = getattr(module, name)
    def call(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return real(*args, **kwargs)
        finally:
            marks[name] = (t0, time.perf_counter())
    setattr(module, name, call)
for name in ("read_ring", "ring_table", "_one"):
    timed(pipeline.RecoveryPass if name == "_one" else pipeline, name)
timed(bundle, "_write_row_groups")
write_postmortem([ring], out / "warm", plot=False, raw=False)
marks.clear()
t0 = time.perf_counter()
write_postmortem([ring], out / "timed", plot=False, raw=False)
whole = time.perf_counter() - t0
read, table, one, rows = marks["read_ring"], marks["ring_table"], marks["_one"], marks["_write_row_groups"]
print(json.dumps({"read_ring": read[1] - read[0], "ring_table": table[1] - table[0],
                  "diagnosis and metadata": one[1] - table[1], "writing the rows": rows[1] - one[1],
                  "whole": whole}))
"""

STAGES = ("read_ring", "ring_table", "diagnosis and metadata", "writing the rows", "whole")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--baseline", help="another blackbox source tree to run beside this one")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(HERE / "tools"))
    from bench_ring import typical_ring

    trees = [HERE, *([Path(args.baseline).resolve()] if args.baseline else [])]
    figures: dict[Path, list[dict[str, float]]] = {tree: [] for tree in trees}
    with tempfile.TemporaryDirectory() as tmp:
        ring = typical_ring(Path(tmp) / "full.ring", args.events)
        for run in range(args.runs):
            for tree in trees:
                out = Path(tmp) / f"out-{run}-{trees.index(tree)}"
                proc = subprocess.run([sys.executable, "-c", _CHILD, str(tree), str(ring), str(out)],
                                      capture_output=True, text=True, check=True)  # fmt: skip
                figures[tree].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"one ring of {args.events:,} events; {args.runs} runs each, medians, seconds")
    print("| stage | " + " | ".join("this tree" if t == HERE else "baseline" for t in trees) + " |")
    print("|---|" + "---:|" * len(trees))
    for stage in STAGES:
        cells = [f"{statistics.median(f[stage] for f in figures[tree]):.3f}" for tree in trees]
        print(f"| {stage} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
