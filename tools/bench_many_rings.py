#!/usr/bin/env python3
"""Recovery of many tiny rings in one folder (issue 23, 8.): wall time, time per ring and peak RSS of
``blackbox recover FOLDER -o OUT``, each run in a fresh process (peak RSS from wait4).

    python tools/bench_many_rings.py [--rings 25000] [--events 3] [--runs 3] [--keep DIR] [--baseline SRC]

The rings are crafted (tools/craft_ring.py's version-3 layout): ``--events`` marks each, a distinct
writer (host, pid, start) per ring, every writer gone (pids above pid_max). Any local user makes such a
folder in seconds; a root epilogue with a time limit then recovers it.

--baseline SRC: also run with another blackbox source tree (``git archive REV | tar -x -C DIR``, the C
extension built there), interleaved run by run; prints the ratios of the medians (the machine is noisy:
only side-by-side ratios compare).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "tools"))

from bench_fleet import measure_cpu  # noqa: E402
from craft_ring import craft_v3, meta, records_of  # noqa: E402

from blackbox.ring import format as fmt  # noqa: E402


def make_rings(folder: Path, count: int, events: int) -> int:
    """``count`` rings of ``events`` marks each; returns their bytes on disk."""
    folder.mkdir(parents=True)
    template = craft_v3(folder / "template", {2: "loss"}, {}, {}, records_of("mark", events, label=2, value=1))
    data = template.read_bytes()
    template.unlink()
    h = fmt.decode_header(data, len(data))
    base = meta()
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    for i in range(count):
        m = dict(base, identity=dict(base["identity"], pid=pid_max + 1 + i, rank=i))
        header = fmt.encode_header(h.capacity, h.strings_size, m, stacks_size=h.stacks_size, crash_size=h.crash_size)
        cut = fmt.decode_header(header, len(header)).strings_offset
        ring = header[:cut] + data[h.strings_offset :]
        (folder / f"blackbox-tiny-rank{i}-pid{pid_max + 1 + i}.ring").write_bytes(ring)
    return sum(p.stat().st_blocks * 512 for p in folder.iterdir())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rings", type=int, default=25_000)
    ap.add_argument("--events", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--keep", help="make (or reuse) the rings here instead of a temporary folder")
    ap.add_argument("--baseline", help="another blackbox source tree to run beside this one (ratios)")
    args = ap.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-many-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    rings = work / "rings"
    try:
        made = not rings.exists()
        if made:
            make_rings(rings, args.rings, args.events)
        files = list(rings.glob("*.ring"))
        disk = sum(p.stat().st_blocks * 512 for p in files)
        what = f"{len(files)} rings" + (f" of {args.events} events" if made else "")  # a kept folder's: unknown
        print(f"{what}, {disk / 2**20:.0f} MiB on disk; {os.cpu_count()} cores")
        sources = [HERE, *([Path(args.baseline).resolve()] if args.baseline else [])]
        runs: dict[Path, list[tuple[float, int, float]]] = {s: [] for s in sources}
        read: dict[Path, int] = {}  # rings recovered: at most MAX_RINGS (4,096) of a folder, the others named
        for run in range(args.runs):
            for source in sources:  # interleaved: each run of this tree beside one of the baseline
                out = work / f"out-{run}-{sources.index(source)}"
                cmd = [sys.executable, "-m", "blackbox", "recover", str(rings), "-o", str(out)]
                runs[source].append(measure_cpu(cmd, source))
                rings_meta = json.loads((out / "metadata.json").read_text()).get("rings")  # (one ring: no list)
                read[source] = len(rings_meta) if isinstance(rings_meta, list) else 1
                shutil.rmtree(out, ignore_errors=True)
        for source in sources:
            walls, peaks = [w for w, _, _ in runs[source]], [p for _, p, _ in runs[source]]
            wall, peak = statistics.median(walls), statistics.median(peaks)
            cpu = statistics.median(c for _, _, c in runs[source])
            name = "this tree" if source == HERE else f"baseline {source}"
            print(f"{name:<40} wall median {wall:8.2f} s (min {min(walls):.2f}, max {max(walls):.2f}), "
                  f"{read[source]} rings recovered ({len(files) - read[source]} named, not read), "
                  f"{wall / read[source] * 1e3:.2f} ms per ring recovered ({cpu / read[source] * 1e3:.2f} ms of CPU); "
                  f"peak RSS median {peak / 2**20:.0f} MiB, "
                  f"{peak / len(files) / 1024:.1f} KiB per ring")  # fmt: skip
        if args.baseline:
            this, base = runs[HERE], runs[sources[1]]
            wall = statistics.median(w for w, _, _ in this) / statistics.median(w for w, _, _ in base)
            peak = statistics.median(p for _, p, _ in this) / statistics.median(p for _, p, _ in base)
            print(f"ratio this/baseline: wall {wall:.2f}, peak RSS {peak:.2f}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
