"""Peak memory and wall time of ``blackbox recover`` on ordinary and hostile rings (medians of several runs).

    .venv/bin/python tools/bench_recover_memory.py [--runs 3] [--quick]

Each run is a fresh process running ``blackbox recover RING -o OUT`` (memory.png
included where matplotlib is installed), which reports its peak RSS (``VmHWM``);
the wall time includes starting Python. The rings:

- a training loop's 1 M-slot ring, full (steps, phases, marks, samples), as
  ``tools/bench_ring.py`` writes it;
- 1 M-slot rings holding one kind only (samples, signals, module events,
  stack samples, child samples), crafted (``tools/craft_ring.py``);
- sparse rings that declare 4 GiB and 100 GB of slots and hold 1000 records;
- a 1 GiB sparse string region, and a 64 MiB string region of near-miss entries
  (every 8 bytes a plausible header whose checksum fails).

The table gives the ring's size on disk, the peak RSS, that peak less the ring's
size (what recovery adds), and the wall time.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_ring import typical_ring  # noqa: E402
from craft_ring import craft  # noqa: E402

from blackbox.ring.reader import read_header  # noqa: E402

MiB = 1 << 20


def near_miss(path: Path, size: int, length: int) -> Path:
    """A small ring whose string region (``size`` bytes) is all near-miss entries after its first page."""
    craft(path, 1024, "mark", events=100, strings_size=size)
    h = read_header(path)
    with open(path, "r+b") as f:
        f.seek(h.strings_offset + 4096)
        f.write(struct.pack("<II", 7, length) * ((h.strings_size - 4096) // 8))
    return path


def rings(tmp: Path, quick: bool) -> dict[str, Path]:
    slots = 1 << 16 if quick else 1 << 20
    out = {"training loop": typical_ring(tmp / "loop.ring", int(slots * 1.25))}  # 1 M slots, wrapped unless quick
    for kind in ("sample", "signal", "module_begin", "stack_sample", "child_sample"):
        out[f"only {kind}"] = craft(tmp / f"{kind}.ring", slots, kind, payload=1 << 20)
    out["sparse, 4 GiB of slots"] = craft(tmp / "s4g.ring", (4 << 30) // 128, "mark", events=1000, sparse=True)
    out["sparse, 100 GB of slots"] = craft(tmp / "s100g.ring", 100 * 10**9 // 128, "mark", events=1000, sparse=True)
    out["sparse, 1 GiB string region"] = craft(
        tmp / "strings.ring", 1024, events=100, strings_size=1 << 30, sparse=True
    )
    out["64 MiB of near-miss strings"] = near_miss(tmp / "near.ring", 64 * MiB, 4096)
    out["64 MiB of near-miss strings, empty"] = near_miss(tmp / "near0.ring", 64 * MiB, 0)
    return out


# The child reports its own VmHWM: ru_maxrss would also count this process's memory, which the child
# held before exec (the kernel keeps the larger across exec).
_CHILD = """
import sys
from blackbox.cli import main
code = main(sys.argv[1:])
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(int(status["VmHWM"].split()[0]) * 1024)
sys.exit(code)
"""


def measure(ring: Path, out: Path) -> tuple[int, float]:
    """(peak RSS in bytes, wall seconds) of one recover in a fresh process."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(ROOT), MPLBACKEND="Agg")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, "recover", str(ring), "-o", str(out)], env=env,
                          capture_output=True, text=True)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"recover {ring} failed: {proc.stderr}")
    return int(proc.stdout.split()[-1]), wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="64 K events per ring instead of 1 M")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cases = rings(tmp, args.quick)
        print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
              f"medians of {args.runs} runs\n")  # fmt: skip
        print("| ring | on disk | peak RSS | peak less the ring | wall |")
        print("|---|---:|---:|---:|---:|")
        for name, ring in cases.items():
            peaks, walls = zip(*(measure(ring, tmp / "bundle") for _ in range(args.runs)), strict=True)
            disk = os.stat(ring).st_blocks * 512
            peak = statistics.median(peaks)
            print(f"| {name} | {disk / MiB:.0f} MiB | {peak / MiB:.0f} MiB | {(peak - disk) / MiB:.0f} MiB | "
                  f"{statistics.median(walls):.2f} s |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
