#!/usr/bin/env python3
"""A node's rings recovered on 1, 2, 4 ... of its cores (issue 25, "every core used"): wall time, CPU time,
the cores that CPU time comes to (CPU / wall) and peak RSS, each run in a fresh process.

    python tools/bench_cores.py [--rings 8] [--events 1250000] [--runs 3] [--cores 1,2,4,8,16] [--keep DIR]
                                [--variant NAME=WORKERS:BUDGET_MIB[:ROWS] ...]

The rings are tools/bench_ring.py's typical training rings of the default 32 MiB (262,144 slots), given a
lap and a quarter, as a rank armed with ``arm()`` leaves them; made once, in parallel. Each run is a fresh interpreter
pinned to the first N cores (``sched_setaffinity``, as ``taskset`` or a Slurm step's cpuset would) that
recovers the folder once to warm up and once timed (``write_postmortem``, no picture); one ring alone is
timed the same way beside it, so "8 rings in k × one ring's time" reads off one run. CPU time is the
timed recovery's, all its threads (``process_time``); peak RSS the whole child's, from ``wait4``.

--variant: besides the shipped defaults, run with the decoding workers, the
in-flight ring budget and (optionally) the rows per row group set to these (``auto`` for the number of
cores): how much the caps cost in memory and give in time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(HERE / "tools"))

_CHILD = """
import json, os, sys, time
from pathlib import Path
cores, caps, folder, out = int(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:cores])
from blackbox._postmortem import write_postmortem
from blackbox.recovery import bundle, pipeline
if caps:
    workers, budget, *group = (cores if c == "auto" else int(c) for c in caps)
    pipeline._workers = lambda: workers
    pipeline.IN_FLIGHT_BYTES = budget << 20
    bundle.ROW_GROUP = group[0] if group else bundle.ROW_GROUP
one = sorted(folder.glob("*.ring"))[:1]
write_postmortem([folder], out / "warm", plot=False)
t0, c0 = time.perf_counter(), time.process_time()
meta = write_postmortem([folder], out / "all", plot=False)
t_all, cpu = time.perf_counter() - t0, time.process_time() - c0
t0 = time.perf_counter()
write_postmortem(one, out / "one", plot=False)
t_one = time.perf_counter() - t0
print(json.dumps({"all": t_all, "one": t_one, "cpu": cpu, "events": meta["events"]}))
"""


def _make(path: Path, events: int) -> str:
    from bench_ring import typical_ring

    from blackbox._recorder import DEFAULT_CAPACITY

    typical_ring(path, events, DEFAULT_CAPACITY)
    return str(path)


def make_rings(folder: Path, count: int, events: int) -> None:
    folder.mkdir(parents=True)
    with ProcessPoolExecutor(min(count, os.cpu_count() or 1)) as pool:
        list(pool.map(_make, [folder / f"rank{i}.ring" for i in range(count)], [events] * count))


def one_run(folder: Path, cores: int, caps: list[str] | None) -> dict[str, float]:
    """One fresh child: its timings and CPU seconds, and its peak RSS (MiB) from wait4."""
    with tempfile.TemporaryDirectory(dir=folder.parent) as out:
        env = dict(os.environ, PYTHONPATH=str(HERE))
        args = [sys.executable, "-c", _CHILD, str(cores), json.dumps(caps or []), str(folder), out]
        r, w = os.pipe()
        pid = os.posix_spawn(sys.executable, args, env, file_actions=[(os.POSIX_SPAWN_DUP2, w, 1)])
        os.close(w)
        with os.fdopen(r) as f:
            stdout = f.read()
        _, status, usage = os.wait4(pid, 0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"the child failed: exit {os.waitstatus_to_exitcode(status)}")
    result = dict(json.loads(stdout.splitlines()[-1]))
    return result | {"rss": usage.ru_maxrss / 1024}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rings", type=int, default=8)
    ap.add_argument("--events", type=int, default=327_680, help="events each ring was given (1.25 laps)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cores", default="1,2,4,8,16")
    ap.add_argument("--keep", help="make (or reuse) the rings here instead of a temporary folder")
    ap.add_argument("--variant", action="append", default=[], help="NAME=WORKERS:BUDGET_MIB[:ROWS]")
    args = ap.parse_args(argv)
    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-cores-", dir=os.environ.get("TMPDIR", "/var/tmp")))
    folder = work / "rings"
    if not folder.exists():
        make_rings(folder, args.rings, args.events)
    rings = sorted(folder.glob("*.ring"))
    have = len(os.sched_getaffinity(0))
    cores = [c for c in (int(x) for x in args.cores.split(",")) if c <= have]
    variants: dict[str, list[str] | None] = {"shipped": None}
    for v in args.variant:
        name, _, spec = v.partition("=")
        variants[name] = spec.split(":")
    mib = sum(p.stat().st_size for p in rings) / 2**20
    print(f"{len(rings)} rings, {mib:.0f} MiB; {have} cores here; {args.runs} runs each, medians")
    print(f"{'variant':10} {'cores':>5} {'all rings s':>11} {'one ring s':>10} {'all/one':>7} "
          f"{'CPU s':>6} {'CPU/wall':>8} {'peak MiB':>8} {'M events/s':>10}")  # fmt: skip
    for c in cores:
        results: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for _ in range(args.runs):  # interleaved: each variant beside the others, run by run
            for name, caps in variants.items():
                results[name].append(one_run(folder, c, caps))
        for name, rs in results.items():
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            print(f"{name:10} {c:>5} {med['all']:>11.2f} {med['one']:>10.2f} {med['all'] / med['one']:>7.1f} "
                  f"{med['cpu']:>6.1f} {med['cpu'] / med['all']:>8.1f} {med['rss']:>8.0f} "
                  f"{med['events'] / med['all'] / 1e6:>10.2f}", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
