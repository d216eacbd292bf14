"""How soon `blackbox run` says where a job is that outlived its SIGTERM (run/snapshot.py), and what that costs a
job keeping every core busy.

A job whose SIGTERM handler only sets a flag (Lightning's) hangs at step 30 under `blackbox run`; SIGTERM is
sent to `blackbox run`, and the time until its stderr says "the job still runs" is measured (the snapshot waits
``OUTLIVED_S``, 1 s, first). With ``--busy N`` the job itself starts N busy processes before it hangs (in its
session, as its own work would be), each counting the loop turns it makes; with ``--others N``, N busy loops
run in another session (another tenant: with the kernel's autogroups, a session shares the CPU with another
session as a whole, whatever the niceness inside it). The turns made in ``--window`` seconds after the
SIGTERM, against runs where no SIGTERM is sent (no snapshot: the same time otherwise), are the snapshot's
cost to them. Medians of ``--runs``, each run the two kinds in turn.

    .venv/bin/python tools/bench_snapshot.py --runs 5 [--busy 2] [--others 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

JOB = """\
import multiprocessing as mp, os, signal, sys, threading, time

def spin(path):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    n, last = 0, time.monotonic()
    while True:
        for _ in range(10_000):
            pass
        n += 1
        if time.monotonic() - last > 0.05:
            with open(path + ".tmp", "w") as f:
                f.write(str(n))
            os.replace(path + ".tmp", path)
            last = time.monotonic()

if __name__ == "__main__":
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    for i in range(int(sys.argv[2])):
        mp.get_context("fork").Process(target=spin, args=(f"{sys.argv[1]}.turns{i}",), daemon=True).start()
    for step in range(10**6):
        if step == 30:
            open(sys.argv[1], "w").close()
            threading.Event().wait()
        time.sleep(0.01)
"""


def _spin(count: mp.Value, until: float) -> None:  # type: ignore[valid-type]
    n = 0
    while time.monotonic() < until:
        for _ in range(10_000):
            n += 1
        count.value += 1  # type: ignore[attr-defined]


def _turns(ready: Path, busy: int) -> int:
    total = 0
    for i in range(busy):
        try:
            total += int(Path(f"{ready}.turns{i}").read_text() or 0)
        except (OSError, ValueError):
            pass
    return total


def one(folder: Path, snapshot: bool, busy: int, others: int, window: float) -> tuple[float | None, int, int]:
    """(seconds from the SIGTERM to the snapshot's line or None, loop turns the job's busy processes and the other
    session's made in ``window``)."""
    job, ready, err = folder / "job.py", folder / "ready", folder / "err"
    folder.mkdir(parents=True)
    job.write_text(JOB)
    ready.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "blackbox", "run", "--quiet", "--dir", str(folder / "runs"), "--", sys.executable,
           str(job), str(ready), str(busy)]  # fmt: skip
    with open(err, "w") as f:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=f, start_new_session=True)
    while not ready.exists():
        time.sleep(0.02)
    time.sleep(2.0)  # a stall the snapshot can tell
    count = mp.Value("q", 0)
    until = time.monotonic() + window
    spinners = [mp.Process(target=_spin, args=(count, until)) for _ in range(others)]
    for s in spinners:
        s.start()
    t0, before = time.monotonic(), _turns(ready, busy)
    said = None
    if snapshot:
        proc.send_signal(signal.SIGTERM)
        while time.monotonic() - t0 < window and said is None:
            if "the job still runs" in err.read_text():
                said = time.monotonic() - t0
            time.sleep(0.01)
    for s in spinners:
        s.join()
    time.sleep(max(0.0, t0 + window - time.monotonic()))
    mine = _turns(ready, busy) - before
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return said, mine, int(count.value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0, help="busy processes of the job's own (default: none)")
    parser.add_argument("--others", type=int, default=0, help="busy loops in another session (default: none)")
    parser.add_argument("--window", type=float, default=12.0, help="seconds measured after the SIGTERM")
    args = parser.parse_args()
    said: list[float] = []
    turns: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-") as tmp:
        for i in range(args.runs):
            for snapshot in (True, False):
                s, mine, other = one(Path(tmp) / f"{i}-{snapshot}", snapshot, args.busy, args.others, args.window)
                turns[snapshot].append((mine, other))
                if snapshot:
                    if s is None:
                        print(f"run {i}: no snapshot within {args.window:g} s")
                    else:
                        said.append(s)
    if said:
        print(f"snapshot said after the SIGTERM: median {statistics.median(said):.2f} s "
              f"({min(said):.2f} .. {max(said):.2f}; {len(said)} of {args.runs} runs; the job's busy processes: "
              f"{args.busy}, another session's: {args.others})")
    for k, (n, whose) in enumerate(((args.busy, "the job's busy processes"), (args.others, "the other session's"))):
        if n:
            with_ = statistics.median(t[k] for t in turns[True])
            without = statistics.median(t[k] for t in turns[False])
            print(f"{whose} turns in {args.window:g} s: {with_:.0f} with the snapshot, {without:.0f} without "
                  f"({100 * (with_ - without) / without:+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
