"""What an armed job's clean exit costs it: the same job unarmed and armed, exiting, side by side.

    .venv/bin/python tools/exit_cost.py [--runs 9] [--events 300000] [--before /path/to/other/checkout]
                                        [--dir /var/tmp/x] [--torch]

Each run starts, one after another, the job unarmed, with blackbox imported but not armed (what its
imports alone add), armed with this checkout, armed with this checkout
and ``sync_interval`` set (the recorder then msyncs the ring periodically, and once more as it ends), and
(with ``--before``) armed with another checkout of blackbox (e.g. ``git archive aa7a9d9 | tar -x -C
/tmp/base``, its C extension built in place). The job arms the default 32 MiB ring (or not), writes
``--events`` marks (dirtying that many records' pages of the ring, which the kernel has not yet written
back when the job ends), and returns from its script. Printed, per way, the median over runs of:

- ``disarm``: the recorder's end at interpreter exit (sampler join, collectors put back, the last
  sample, the clean end, the exit record armed, the mapping released, and an msync where one is made),
  timed between an atexit handler registered after arm (it runs before blackbox's) and one registered
  before it (it runs after);
- ``exit``: from the script's last line to its parent's wait() returning: the whole exit path the job's
  parent (torchrun's agent, a launcher) sees, interpreter finalization and libc's exit() included.

Jobs run one at a time (the figures are times); ``--dir`` puts the rings on another disk.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

JOB = """
import atexit, os, sys, time
how, folder, events, use_torch = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "torch"
fd = int(sys.argv[5])
atexit.register(lambda: os.write(fd, f"after {time.monotonic_ns()}\\n".encode()))  # runs after blackbox's
if use_torch:
    import torch
if how != "unarmed":
    import blackbox
if how not in ("unarmed", "imported"):
    rec = blackbox.arm(folder + "/", sync_interval=3600.0 if how == "sync" else None)
    assert rec.armed and blackbox.__file__.startswith(os.environ["PYTHONPATH"]), "not armed from that checkout"
    mark = blackbox.mark
else:
    mark = lambda *a: None
atexit.register(lambda: os.write(fd, f"before {time.monotonic_ns()}\\n".encode()))  # runs before blackbox's
for n in range(events):
    mark("loss", n)
os.write(fd, f"end {time.monotonic_ns()}\\n".encode())
"""


def one(how: str, tree: Path, folder: Path, events: int, use_torch: bool) -> tuple[float, float]:
    """(disarm ms, exit ms) of one run."""
    read, write = os.pipe()
    script = folder / "job.py"
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.Popen([sys.executable, str(script), how, str(folder / how), str(events),
                             "torch" if use_torch else "no", str(write)], env=env, pass_fds=(write,))  # fmt: skip
    os.close(write)
    proc.wait()
    waited = time.monotonic_ns()
    stamps = dict(line.split() for line in os.read(read, 4096).decode().splitlines())
    os.close(read)
    if proc.returncode != 0:
        raise SystemExit(f"{how}: the job exited {proc.returncode}")
    disarm = (int(stamps["after"]) - int(stamps["before"])) / 1e6
    return disarm, (waited - int(stamps["end"])) / 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=9)
    p.add_argument("--events", type=int, default=300_000)
    p.add_argument("--before", type=Path, help="another checkout of blackbox, armed as a fourth way")
    p.add_argument("--dir", type=Path, help="where the rings go (default: a temporary folder)")
    p.add_argument("--torch", action="store_true", help="the job imports torch first")
    a = p.parse_args()
    ways = [
        ("unarmed", REPO, "unarmed"),
        ("blackbox imported, not armed", REPO, "imported"),
        ("armed", REPO, "armed"),
        ("armed, sync_interval", REPO, "sync"),
    ]
    if a.before:
        ways.append((f"armed ({a.before})", a.before, "armed"))
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name, _, _ in ways}
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        folder = Path(tmp)
        (folder / "job.py").write_text(textwrap.dedent(JOB))
        for _ in range(a.runs):
            for name, tree, how in ways:
                figures[name].append(one(how, tree, folder, a.events, a.torch))
                for ring in (folder / how).glob("*.ring"):
                    ring.unlink()
    print(f"{a.runs} runs, {a.events:,} events written before the exit; medians in ms")
    print(f"{'way':<40} {'disarm':>9} {'exit':>9}")
    for name, runs in figures.items():
        disarm = statistics.median(d for d, _ in runs)
        exit_ = statistics.median(e for _, e in runs)
        print(f"{name:<40} {disarm:>9.2f} {exit_:>9.2f}")


if __name__ == "__main__":
    main()
