#!/usr/bin/env python3
"""What keeping the raw rings costs a bundle: ``recover`` with each ring zstd-compressed into ``rings/``
against ``--no-raw``, interleaved run by run, for a default ring (34 MiB) with about 20,000 events, a
nearly empty one and a full one (wrapped around); and reading the kept ``.ring.zst`` back against the ring itself.

    python tools/bench_raw_rings.py [--runs 7] [--events 20000]

Each ring comes from a real armed child (default capacity, default sampler) SIGKILLed after its steps.
Bundles are written without memory.png (``plot=False``) so the figure is the rings' own cost. Prints, per
ring, the median bundle size and recover time with and without raw rings, the median of the run-by-run
time ratios, and the median time to recover from the ``.ring.zst`` against from the ring.
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blackbox._postmortem import write_postmortem  # noqa: E402

_CHILD = """
import os, sys, blackbox
blackbox.arm(sys.argv[1] + "/")
for i in range(int(sys.argv[2])):
    blackbox.step(i)
os.kill(os.getpid(), 9)
"""


def _ring(folder: Path, steps: int) -> Path:
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    subprocess.run([sys.executable, "-c", _CHILD, str(folder), str(steps)], env=env, check=False)
    (ring,) = folder.glob("*.ring")
    return ring


def _size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _recover(inputs: list[Path], out: Path, raw: bool) -> tuple[float, int, dict[str, object]]:
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    meta = write_postmortem(inputs, out, plot=False, raw=raw)
    return time.perf_counter() - t0, _size(out), meta


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-raw-") as tmp:
        root = Path(tmp)
        cases = ((f"{args.events} steps", args.events), ("nearly empty", 1), ("wrapped (400,000 steps)", 400_000))
        for label, steps in cases:
            ring = _ring(root / f"rings-{steps}", steps)
            times: dict[bool, list[float]] = {True: [], False: []}
            sizes: dict[bool, list[int]] = {True: [], False: []}
            ratios, back, direct, packed = [], [], [], 0
            events = 0
            for _ in range(args.runs):
                for raw in (False, True):
                    took, size, meta = _recover([ring], root / f"out-{raw}", raw)
                    times[raw].append(took)
                    sizes[raw].append(size)
                    events = int(meta["events"])  # type: ignore[call-overload]
                ratios.append(times[True][-1] / times[False][-1])
                (zst,) = (root / "out-True" / "rings").iterdir()
                packed = zst.stat().st_size
                direct.append(_recover([ring], root / "again-ring", False)[0])
                back.append(_recover([zst], root / "again-zst", False)[0])
            med, mib = statistics.median, 2**20
            print(f"{label}: ring {ring.stat().st_size / mib:.1f} MiB, {events} events, "
                  f".ring.zst {packed / mib:.3f} MiB")  # fmt: skip
            print(f"  bundle size   --no-raw {med(sizes[False]) / mib:.3f} MiB   raw {med(sizes[True]) / mib:.3f} MiB")
            print(f"  recover time  --no-raw {med(times[False]) * 1e3:.0f} ms   raw {med(times[True]) * 1e3:.0f} ms   "
                  f"ratio raw/no-raw median {med(ratios):.2f} ({args.runs} runs)")  # fmt: skip
            print(f"  recover from  .ring {med(direct) * 1e3:.0f} ms   .ring.zst {med(back) * 1e3:.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
