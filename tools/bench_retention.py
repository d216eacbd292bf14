#!/usr/bin/env python3
"""What the default retention costs at arm: arm() into a folder already holding N rings, with the default
keep setting against keep="off", interleaved run by run.

    python tools/bench_retention.py [--rings 0 63 256] [--runs 15]

Each run arms a small ring (capacity 64, no sampler tick) in a fresh process-free folder of N old rings
(clean, aged an hour, so that nothing is removed with a count limit above N: the cost measured is the scan,
one header read and one lock probe per ring) and disarms it; the new ring is removed before the next run.
Prints, per N, the median arm time with the retention off and on, and the median of the run-by-run
differences.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import blackbox  # noqa: E402


def _arm_once(folder: Path, keep: str) -> float:
    t0 = time.perf_counter()
    rec = blackbox.Recorder.arm(folder / "new.ring", capacity=64, sample_interval=3600, keep=keep)
    took = time.perf_counter() - t0
    rec.disarm()
    if rec.path is not None:
        rec.path.unlink()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rings", type=int, nargs="+", default=[0, 63, 256])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    for count in args.rings:
        with tempfile.TemporaryDirectory(prefix="bench-retention-") as tmp:
            folder = Path(tmp)
            for i in range(count):
                rec = blackbox.Recorder.arm(folder / f"old{i}.ring", capacity=64, sample_interval=3600, keep="off")
                rec.disarm()
                assert rec.path is not None
                os.utime(rec.path, (time.time() - 3600, time.time() - 3600))
            keep = f"count={count + 2},size=1T"  # the scan, never a removal
            off, on = [], []
            for _ in range(args.runs):
                off.append(_arm_once(folder, "off"))
                on.append(_arm_once(folder, keep))
            assert len(list(folder.glob("*.ring"))) == count, "nothing was removed"
            diff = statistics.median(b - a for a, b in zip(off, on, strict=True))
            print(
                f"{count:4d} rings in the folder: arm {statistics.median(off) * 1e3:6.2f} ms with keep=off, "
                f"{statistics.median(on) * 1e3:6.2f} ms with retention (median of {args.runs}); "
                f"the scan adds {diff * 1e3:.2f} ms (median difference)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
