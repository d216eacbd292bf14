"""The benchmark table: blackbox against the peers, side by side in one run.

    .venv/bin/python tools/bench.py [--quick]

- the write path: ``blackbox.mark``, a sample tick, stormlog's
  ``OOMFlightRecorder.record_event`` (if stormlog is installed: ``pip install
  stormlog``; the table says so when it is missing) and ``deque.append(dict)``,
  interleaved, medians of several runs;
- step-time overhead of ``arm()`` and ``arm(modules=True)`` (tools/bench_overhead.py's
  directly attributed cost);
- recover throughput and Parquet bytes per event, against the floor of writing
  the same rows with pyarrow directly, and what stormlog writes per event for the
  same number of events;
- ``arm()`` latency and the RSS the recorder adds (in a fresh process).
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

import pyarrow.parquet as pq  # noqa: E402
from bench_overhead import run_job  # noqa: E402
from bench_ring import typical_ring  # noqa: E402

import blackbox  # noqa: E402
from blackbox._postmortem import write_postmortem  # noqa: E402
from blackbox.recovery.bundle import TIMELINE  # noqa: E402
from blackbox.recovery.pipeline import recover_rings  # noqa: E402


def _per_call(fn: Any, n: int) -> float:
    t0 = time.perf_counter_ns()
    fn(n)
    return (time.perf_counter_ns() - t0) / n


def write_path(tmp: Path, n: int, runs: int) -> dict[str, float | None]:
    rec = blackbox.arm(tmp / "w.ring", capacity=1 << 18, sample_interval=3600)
    dq: collections.deque[dict[str, Any]] = collections.deque(maxlen=10_000)
    mono = time.monotonic_ns

    def bb_mark(k: int) -> None:
        for i in range(k):
            blackbox.mark("loss", i)

    def bb_tick(k: int) -> None:
        for _ in range(k // 100):
            rec.sample_now()

    def deque_dict(k: int) -> None:
        append = dq.append
        for i in range(k):
            append({"ts_ns": mono(), "kind": "mark", "label": "loss", "value": i})

    cases: dict[str, Any] = {"blackbox.mark(label, value)": bb_mark, "deque.append(dict)": deque_dict}
    storm = None
    if importlib.util.find_spec("stormlog") is not None:
        from stormlog import OOMFlightRecorder, OOMFlightRecorderConfig

        storm = OOMFlightRecorder(OOMFlightRecorderConfig(enabled=True, dump_dir=str(tmp / "oom_dumps")))
        record = storm.record_event

        def storm_event(k: int) -> None:
            for i in range(k):
                record({"ts_ns": mono(), "kind": "mark", "label": "loss", "value": i})

        cases["stormlog OOMFlightRecorder.record_event(dict)"] = storm_event
    results: dict[str, list[float]] = {name: [] for name in cases}
    tick: list[float] = []
    for fn in cases.values():
        fn(10_000)
    for _ in range(runs):
        for name, fn in cases.items():
            results[name].append(_per_call(fn, n))
        tick.append(_per_call(bb_tick, 100 * 200) * 100)
    blackbox.disarm()
    out: dict[str, float | None] = {k: statistics.median(v) for k, v in results.items()}
    out["blackbox sample tick (host probe + write)"] = statistics.median(tick)
    if storm is None:
        out["stormlog OOMFlightRecorder.record_event(dict)"] = None
    return out


def recover_vs_floor(tmp: Path, events: int, runs: int) -> dict[str, float]:
    ring = typical_ring(tmp / "full.ring", events)
    ours, floor, sizes, floor_sizes = [], [], [], []
    table = recover_rings([ring]).table
    for r in range(runs):
        t0 = time.perf_counter()
        meta = write_postmortem([ring], tmp / f"b{r}", plot=False)
        ours.append(time.perf_counter() - t0)
        sizes.append((tmp / f"b{r}" / TIMELINE).stat().st_size)
        t0 = time.perf_counter()
        pq.write_table(table, tmp / f"floor{r}.parquet")  # the same rows, already in memory, pyarrow defaults
        floor.append(time.perf_counter() - t0)
        floor_sizes.append((tmp / f"floor{r}.parquet").stat().st_size)
    n = meta["events"]
    return {
        "events": n,
        "ours_s": statistics.median(ours),
        "floor_s": statistics.median(floor),
        "ours_bpe": statistics.median(sizes) / n,
        "floor_bpe": statistics.median(floor_sizes) / n,
    }


def stormlog_bytes_per_event(tmp: Path, n: int = 10_000) -> float | None:
    if importlib.util.find_spec("stormlog") is None:
        return None
    from stormlog import OOMFlightRecorder, OOMFlightRecorderConfig

    dump_dir = tmp / "storm_dumps"
    rec = OOMFlightRecorder(OOMFlightRecorderConfig(enabled=True, dump_dir=str(dump_dir), buffer_size=n))
    for i in range(n):  # the typical timeline's events, as the dicts an in-memory recorder keeps
        kind = ("step", "phase_begin", "phase_end", "mark", "sample")[i % 5]
        rec.record_event({"ts_ns": time.monotonic_ns(), "kind": kind, "label": "forward", "value": i, "step": i // 8})
    path = rec.dump(reason="bench", exception=None, context="bench", backend="cpu")
    assert path is not None
    total = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())
    return total / n


def sync_cost(tmp: Path, runs: int) -> dict[str, float]:
    """Time of one msync of the ring after 10,000 new events (what sync_interval pays each period)."""
    rec = blackbox.Recorder.arm(tmp / "sync.ring", sample_interval=3600)
    times = []
    rec.sync()
    for _ in range(runs):
        for i in range(10_000):
            rec.mark("m", i)
        t0 = time.perf_counter()
        rec.sync()
        times.append(time.perf_counter() - t0)
    rec.disarm()
    return {"seconds": statistics.median(times)}


ARM_RSS = r"""
import json, os, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
import blackbox
before = rss()
t0 = time.perf_counter()
rec = blackbox.arm(sys.argv[1])
arm_s = time.perf_counter() - t0
time.sleep(0.3)
print(json.dumps({"arm_s": arm_s, "rss_added": rss() - before, "ring": rec.capacity * 128}))
"""


def arm_and_rss(tmp: Path, runs: int) -> dict[str, float]:
    out = []
    for _ in range(runs):
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.run([sys.executable, "-c", ARM_RSS, str(tmp)], capture_output=True, text=True, env=env)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return {k: statistics.median(o[k] for o in out) for k in out[0]}


def main() -> int:
    quick = "--quick" in sys.argv
    n, runs = (50_000, 3) if quick else (300_000, 7)
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        tmp = Path(d)
        writes = write_path(tmp, n, runs)
        overhead = run_job("attributed", 0, d, "mlp") if importlib.util.find_spec("torch") else None
        rec = recover_vs_floor(tmp, 100_000 if quick else 1_000_000, 3 if quick else 5)
        storm_bpe = stormlog_bytes_per_event(tmp)
        arm = arm_and_rss(tmp, 3 if quick else 5)
        sync = sync_cost(tmp, 5)
    base = writes["deque.append(dict)"] or 1.0
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}")  # fmt: skip
    print("\n| measure | median | note |\n|---|---:|---|")
    for name, v in writes.items():
        if v is None:
            print(f"| {name} | - | stormlog is not installed here (pip install stormlog) |")
        elif "tick" in name:
            print(f"| {name} | {v / 1e3:.1f} us | once per 0.1 s sample interval: {v / 1e6:.3f}% of one core |")
        else:
            print(f"| {name} | {v:.0f} ns | {v / base:.2f}x deque |")
    if overhead:
        step_us = overhead["step_ns"] / 1e3
        for name in ("default", "modules"):
            e = overhead[name]
            us = e["events"] * e["ns"] / 1e3
            print(f"| step overhead, arm({'modules=True' if name == 'modules' else ''}) | {us:.1f} us/step | "
                  f"{100 * us / step_us:.3f}% of a {step_us / 1e3:.1f} ms CPU step + sampler "
                  f"{100 * overhead['tick_ns'] / 1e8:.3f}% |")  # fmt: skip
    else:
        print("| step overhead | - | torch is not installed here |")
    rate = rec["events"] / rec["ours_s"] / 1e6
    print(f"| recover {rec['events']:,} events (ring to bundle) | {rate:.2f} M events/s | "
          f"{rec['ours_s']:.2f} s; pyarrow writing the same rows from memory: {rec['floor_s']:.2f} s |")  # fmt: skip
    print(f"| timeline.parquet | {rec['ours_bpe']:.1f} B/event | pyarrow defaults on the same rows: "
          f"{rec['floor_bpe']:.1f} B/event |")  # fmt: skip
    if storm_bpe is None:
        print("| stormlog dump | - | stormlog is not installed here |")
    else:
        print(f"| stormlog OOM dump of the same kind of events | {storm_bpe:.0f} B/event | JSON, written only "
              "if the process lives to call dump() |")  # fmt: skip
    print(f"| arm() | {arm['arm_s'] * 1e3:.1f} ms | default 32 MiB ring, fresh process |")
    print(f"| msync of the ring after 10,000 events | {sync['seconds'] * 1e3:.2f} ms | sync_interval=1 costs "
          f"{sync['seconds'] * 100:.2f}% of one core at that event rate; a crash loses at most 1 s |")  # fmt: skip
    print(
        f"| RSS added by arm() | {arm['rss_added'] / (1 << 20):.1f} MiB | the modules arm imports, the sampler "
        f"thread and at most the ring's write window: its {arm['ring'] / (1 << 20):.0f} MiB stay in the page cache, "
        "out of the RSS |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
