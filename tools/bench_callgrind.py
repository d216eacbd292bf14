"""Allocation sampling's cost inside the job's thread, counted rather than timed: valgrind's callgrind.

    .venv/bin/python tools/bench_callgrind.py [--steps 3] [--warmup 3] [--configs off default settled]

Timed A/Bs on a shared VM resolve about +-0.5% (docs/performance.md); an instruction count does not move
with the load. Each configuration runs the GPT step of tools/small_gpt.py under ``valgrind
--tool=callgrind --separate-threads=yes --cache-sim=yes``, collecting only around ``--steps`` steps after
``--warmup`` (CALLGRIND_TOGGLE_COLLECT, from a three-line library built here and called through ctypes),
and prints the main thread's instructions and cache misses, and a cycle estimate (an L1 miss 10 cycles,
a last-level miss 100) against the first configuration. Needs valgrind with its headers and a C
compiler; under valgrind importing torch takes 10-20 minutes of CPU, each configuration as long again.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOGGLE = "#include <valgrind/callgrind.h>\nvoid bb_toggle(void) { CALLGRIND_TOGGLE_COLLECT; }\n"
JOB = r"""
import ctypes, os, sys
config, warmup, steps, lib, ring_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
sys.path.insert(0, os.path.join(os.environ["BENCH_ROOT"], "tools"))
toggle = ctypes.CDLL(lib).bb_toggle
import blackbox
SETTINGS = {"off": {"allocations": False}, "default": {}, "hooks": {"allocations": 1 << 30},
            "settled": {"allocations": int(os.environ.get("BENCH_SETTLED_R", 4 << 20))}}
if config in SETTINGS:
    blackbox.arm(ring_dir, **SETTINGS[config])
import torch
torch.manual_seed(0)
from small_gpt import gpt_step
run = gpt_step()
for _ in range(warmup):
    run()
toggle()
for _ in range(steps):
    run()
toggle()
"""
EVENTS = ("Ir", "I1mr", "D1mr", "D1mw", "ILmr", "DLmr", "DLmw")


def totals(path: Path) -> dict[str, int]:
    """The event totals of one callgrind output file."""
    names: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("events:"):
            names = line.split()[1:]
        elif line.startswith("totals:") or line.startswith("summary:"):
            return dict(zip(names, (int(v) for v in line.split()[1:]), strict=False))
    raise SystemExit(f"{path}: no totals line (did the job fail under valgrind?)")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--configs", nargs="+", default=["off", "default"],
                    choices=("not", "off", "default", "hooks", "settled"),
                    help="settled: the default at the R a continuous run of this step settles at (--settled-r)")
    ap.add_argument("--settled-r", type=int, default=4 << 20,
                    help="bytes; under valgrind the tick never sees the rate that raises R, so it is set (4 MiB: "
                    "what tools/bench_steady.py's default processes and a solo run of the step settle at)")
    ap.add_argument("--keep", type=Path, default=None,
                    help="copy the main thread's callgrind files here (cg.CONFIG), for callgrind_annotate's "
                    "per-function figures: `callgrind_annotate --inclusive=yes DIR/cg.settled | grep _csample`")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
        work = Path(tmp)
        (work / "toggle.c").write_text(TOGGLE)
        lib = work / "libtoggle.so"
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(lib), str(work / "toggle.c")], check=True)
        env = {"BENCH_ROOT": str(ROOT), "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0", "PATH": "/usr/bin:/bin",
               "BENCH_SETTLED_R": str(args.settled_r)}
        got: dict[str, dict[str, int]] = {}
        for config in args.configs:
            out = work / f"cg.{config}"
            ring_dir = work / f"rings-{config}"
            ring_dir.mkdir()
            cmd = ["valgrind", "--tool=callgrind", "--collect-atstart=no", "--separate-threads=yes",
                   "--cache-sim=yes", f"--callgrind-out-file={out}", sys.executable, "-c", JOB, config,
                   str(args.warmup), str(args.steps), str(lib), str(ring_dir) + "/"]  # fmt: skip
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(f"{config}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
            got[config] = totals(Path(f"{out}-01"))  # the main thread's file
            if args.keep is not None:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(f"{out}-01", args.keep / f"cg.{config}")
    print(f"the main thread over {args.steps} GPT steps after {args.warmup}, under callgrind")
    base = None
    for config, t in got.items():
        cycles = t["Ir"] + 10 * (t["I1mr"] + t["D1mr"] + t["D1mw"]) + 100 * (t["ILmr"] + t["DLmr"] + t["DLmw"])
        base = base or (cycles, t["Ir"])
        print(f"  {config:8s} Ir {t['Ir'] / 1e6:10.1f} M ({100 * (t['Ir'] / base[1] - 1):+.2f}%)  "
              f"L1 misses {(t['I1mr'] + t['D1mr'] + t['D1mw']) / 1e6:7.2f} M  "
              f"LL misses {(t['ILmr'] + t['DLmr'] + t['DLmw']) / 1e3:7.1f} k  "
              f"cycles (estimate) {cycles / 1e6:10.1f} M ({100 * (cycles / base[0] - 1):+.2f}%)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
