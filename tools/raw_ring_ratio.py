#!/usr/bin/env python3
"""How far a kept ring's ``.ring.zst`` expands: the ring's bytes that are not in pages of zeros (what
unpacking writes to disk; zero pages stay holes) over the ``.zst``'s size, for the shapes a job leaves.
``packed.MAX_RATIO`` caps that ratio when a bundle's rings are read back; this says how far under it a
genuine ring stays.

    python tools/raw_ring_ratio.py [--events 20000]

Shapes: real armed children (default capacity and sampler) SIGKILLed after a few steps, ``--events``
steps, and enough steps to wrap; a process marking in a tight loop until its ring wraps; one whose few
marks fill its string region with near-alike 4 KiB labels (the most a genuine ring compresses); rings crafted
full of one kind each (``craft_ring.py``: every record alike but its seq and a time 1 us apart, more
regular than any job writes). Prints, per shape, the ring's size, its non-zero pages, the ``.zst``'s size
the ratio, and whether it is read back within ``packed.RATIO_FLOOR`` plus ``MAX_RATIO`` times its ``.zst``.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from craft_ring import craft  # noqa: E402

from blackbox.ring import packed  # noqa: E402

_CHILD = """
import os, sys, blackbox
blackbox.arm(sys.argv[1] + "/")
for i in range(int(sys.argv[2])):
    blackbox.step(i)
    if sys.argv[3] == "marks":
        blackbox.mark("tick", i)
    elif sys.argv[3] == "labels":  # each mark a label of its own, 4 KiB of one letter: the string region
        blackbox.mark("x" * 4000 + str(i), i)
os.kill(os.getpid(), 9)
"""


def _child_ring(folder: Path, steps: int, marks: str) -> Path:
    folder.mkdir()
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent))
    subprocess.run([sys.executable, "-c", _CHILD, str(folder), str(steps), marks], env=env, check=False)
    (ring,) = folder.glob("*.ring")
    return ring


def nonzero_bytes(path: Path) -> int:
    """The ring's bytes in pages that are not all zero."""
    total = 0
    with open(path, "rb") as f:
        while chunk := f.read(packed.CHUNK):
            pages = np.frombuffer(chunk.ljust(-(-len(chunk) // 4096) * 4096, b"\0"), np.uint64).reshape(-1, 512)
            total += int(pages.any(axis=1).sum()) * 4096
    return total


def measure(name: str, ring: Path) -> float:
    fd = os.open(ring, os.O_RDONLY)
    try:
        done = packed.pack(fd, os.fstat(fd).st_size, io.BytesIO())
    finally:
        os.close(fd)
    used = nonzero_bytes(ring)
    ratio = used / done.compressed_bytes
    room = packed.RATIO_FLOOR + packed.MAX_RATIO * done.compressed_bytes
    print(f"{name:42s} {done.raw_bytes / 2**20:6.1f} MiB  non-zero {used / 2**20:7.2f} MiB  "
          f".zst {done.compressed_bytes / 2**10:7.1f} KiB  ratio {ratio:6.1f}  "
          f"read back within {room / 2**20:6.1f} MiB: {'yes' if used <= room else 'NO'}")  # fmt: skip
    return ratio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=20_000)
    args = parser.parse_args()
    ratios = []
    with tempfile.TemporaryDirectory(prefix="raw-ratio-") as tmp:
        root = Path(tmp)
        shapes = (("child, 5 steps", 5, "steps"), (f"child, {args.events} steps", args.events, "steps"),
                  ("child, 300,000 steps (wrapped)", 300_000, "steps"),
                  ("child, 150,000 steps and marks (wrapped)", 150_000, "marks"),
                  ("child, 300 marks of 4 KiB labels", 300, "labels"))  # fmt: skip
        for name, steps, marks in shapes:
            ratios.append(measure(name, _child_ring(root / name.replace(" ", "_").replace(",", ""), steps, marks)))
        ratios += [measure(f"crafted full, {kind} (1 M slots)", craft(root / f"{kind}.ring", 1 << 20, kind))
                   for kind in ("mark", "sample", "stack_sample", "signal")]  # fmt: skip
    print(f"largest ratio {max(ratios):.1f}; packed.MAX_RATIO {packed.MAX_RATIO} "
          f"(beyond packed.RATIO_FLOOR, {packed.RATIO_FLOOR >> 20} MiB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
