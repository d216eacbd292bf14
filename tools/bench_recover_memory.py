"""Peak memory and wall time of ``blackbox recover`` on ordinary and hostile rings (medians of several runs).

    .venv/bin/python tools/bench_recover_memory.py [--runs 3] [--quick] [--only NAME] [--baseline SRC]

Each run is a fresh process running ``blackbox recover RING -o OUT`` (memory.png
included where matplotlib is installed), which reports its peak RSS (``VmHWM``);
the wall time includes starting Python. The rings:

- a training loop's 1 M-slot ring, full (steps, phases, marks, samples), as
  ``tools/bench_ring.py`` writes it;
- 1 M-slot rings holding one kind only (samples, signals, module events,
  stack samples, child samples), crafted (``tools/craft_ring.py``);
- sparse rings that declare 4 GiB and 100 GB of slots and hold 1000 records;
- a 1 GiB sparse string region, and a 64 MiB string region of near-miss entries
  (every 8 bytes a plausible header whose checksum fails);
- hostile rings (issue 23): an 8 MiB stack table whose every record names its own stack of 64
  frames of 1,000 bytes (``craft_ring.stack_bomb``), 30,000 marks each with its own 4 KiB label
  (``craft_ring.label_bomb``), and 200,000 records of one such deep stack.

``--baseline SRC`` runs every case with another source tree too (a worktree of an earlier commit),
interleaved run by run, for a side-by-side figure; ``--only`` picks the cases whose name holds NAME.

The table gives the ring's size on disk, the peak RSS, that peak less the ring's
size (what recovery adds), and the wall time.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from bench_ring import typical_ring  # noqa: E402
from craft_ring import craft, craft_v3, label_bomb, records_of, stack_bomb  # noqa: E402

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


def deep_stack(path: Path) -> Path:
    """200,000 records of one stack of 64 frames of 1,000 bytes (a row group of it is 8 GB written plain)."""
    frames = {(1, i): f"f{i}_".ljust(988, "x") + f" (m.py:{i})" for i in range(1, 65)}
    deep = records_of("stack_sample", 200_000, label=2, p0=1, p1=1, p2=1, p3=64)
    return craft_v3(path, {2: "MainThread"}, frames, {(1, 1): list(range(1, 65))}, deep)


def rings(tmp: Path, quick: bool) -> dict[str, Callable[[], Path]]:
    """Each case's name and how to make its ring (made only when measured)."""
    slots = 1 << 16 if quick else 1 << 20
    out: dict[str, Callable[[], Path]] = {
        "training loop": lambda: typical_ring(tmp / "loop.ring", int(slots * 1.25)),  # 1 M slots, wrapped
    }
    for kind in ("sample", "signal", "module_begin", "stack_sample", "child_sample"):
        out[f"only {kind}"] = functools.partial(craft, tmp / f"{kind}.ring", slots, kind, payload=1 << 20)
    out["sparse, 4 GiB of slots"] = lambda: craft(tmp / "s4g.ring", (4 << 30) // 128, "mark", events=1000, sparse=True)
    out["sparse, 100 GB of slots"] = lambda: craft(
        tmp / "s100g.ring", 100 * 10**9 // 128, "mark", events=1000, sparse=True
    )
    out["sparse, 1 GiB string region"] = lambda: craft(
        tmp / "strings.ring", 1024, events=100, strings_size=1 << 30, sparse=True
    )
    out["64 MiB of near-miss strings"] = lambda: near_miss(tmp / "near.ring", 64 * MiB, 4096)
    out["64 MiB of near-miss strings, empty"] = lambda: near_miss(tmp / "near0.ring", 64 * MiB, 0)
    out["stack table bomb: 8 MiB of distinct 64-frame stacks"] = lambda: stack_bomb(tmp / "stacks.ring")
    out["30,000 labels of 4 KiB"] = lambda: label_bomb(tmp / "labels.ring")
    out["one 64 KiB stack on 200,000 records"] = lambda: deep_stack(tmp / "deep.ring")
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


def measure(ring: Path, out: Path, source: Path = ROOT) -> tuple[int | None, float]:
    """(peak RSS in bytes, wall seconds) of one recover in a fresh process, with blackbox from ``source``
    (run from there: ``-c`` puts the working folder first on the path); None where it failed."""
    shutil.rmtree(out, ignore_errors=True)
    env = dict(os.environ, PYTHONPATH=str(source), MPLBACKEND="Agg")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", _CHILD, "recover", str(ring), "-o", str(out)], env=env,
                          capture_output=True, text=True, cwd=source)  # fmt: skip
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        if source == ROOT:
            raise SystemExit(f"recover {ring} failed: {proc.stderr}")
        return None, wall  # the baseline may fail where this tree does not
    return int(proc.stdout.split()[-1]), wall


def _cell(peaks: list[int | None], walls: list[float], disk: int) -> str:
    if any(p is None for p in peaks):
        return f"failed | | {statistics.median(walls):.2f} s"
    peak = statistics.median([p for p in peaks if p is not None])
    return f"{peak / MiB:.0f} MiB | {(peak - disk) / MiB:.0f} MiB | {statistics.median(walls):.2f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="64 K events per ring instead of 1 M")
    ap.add_argument("--only", default="", help="only the cases whose name holds this")
    ap.add_argument("--baseline", type=Path, help="another blackbox source tree, run beside this one")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        cases = {k: v for k, v in rings(tmp, args.quick).items() if args.only in k}
        print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} CPUs; "
              f"medians of {args.runs} runs\n")  # fmt: skip
        sources = [ROOT] + ([args.baseline.resolve()] if args.baseline else [])
        head = ["peak RSS", "peak less the ring", "wall"]
        head += [f"baseline: {h}" for h in head] if args.baseline else []
        print("| ring | on disk | " + " | ".join(head) + " |")
        print("|---|---:|" + "---:|" * len(head))
        for name, make in cases.items():
            ring = make()
            runs = [[measure(ring, tmp / "bundle", src) for src in sources] for _ in range(args.runs)]  # interleaved
            disk = os.stat(ring).st_blocks * 512
            cells = [_cell([r[k][0] for r in runs], [r[k][1] for r in runs], disk) for k in range(len(sources))]
            print(f"| {name} | {disk / MiB:.0f} MiB | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
