"""Alerts before the death, measured: what they cost beside the sampler's tick, how well the forecast foresaw
real deaths, and how often a job that does not leak is alerted.

    .venv/bin/python tools/bench_alerts.py cost [--ticks N] [--rounds N]
    .venv/bin/python tools/bench_alerts.py forecast [--rates 8,16,32,64] [--limit-mib 512] [--repeats N]
    .venv/bin/python tools/bench_alerts.py steady [--seconds S] [--simulated-hours H]

``cost``: in one process, a recorder armed with alerts and one without, ``sample_now()`` (the sampler's
tick) timed alternately, round by round, and the engine's own ``tick`` timed alone (a fit due, and not):
medians in microseconds of thread CPU time (the sampler's own cost; wall time on a shared machine is the
neighbours' as much as ours).

``forecast``: a job leaking R MiB/s in a memory cgroup of LIMIT until the kernel kills it, for each rate;
each death recovered and its forecasts judged against it (recovery/alerts.py ``judge``): how early the death
was foreseeable, the first forecast against the real time left, and the forecasts' median error. Root (or a
writable memory cgroup) needed.

``steady``: a job that does not leak (batches allocated and freed each step, a cache filled once, its memory
held at 40% of its cgroup's limit) for S seconds, then its alerts counted: a false alarm is any alert. And
H hours of simulated steady series (white noise, a batch's sawtooth, page-cache-like drift that stops) fed
to the engine offline, alerts per hour.
"""

from __future__ import annotations

import argparse
import atexit
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

MIB, GIB = 1 << 20, 1 << 30

LEAK = """
import os, sys, time
import blackbox
blackbox.arm(sys.argv[1])
rate = float(sys.argv[2]) * (1 << 20)
kept, step, t0 = [], 0, time.monotonic()
while True:
    step += 1
    while len(kept) * (1 << 20) < rate * (time.monotonic() - t0):  # paced by the clock, in 1 MiB pieces
        kept.append(bytearray(os.urandom(1024)) * 1024)
    blackbox.step(step)
    time.sleep(0.05)
"""

STEADY = """
import os, random, sys, time
import blackbox
blackbox.arm(sys.argv[1])
seconds, rng = float(sys.argv[2]), random.Random(1)
held = [bytearray(os.urandom(1024)) * (1024 * 96)]  # loaded once
cache, step, t0 = {}, 0, time.monotonic()
while time.monotonic() - t0 < seconds:
    step += 1
    batch = bytearray(os.urandom(1024)) * (1024 * rng.choice((8, 16, 24)))  # a batch of varying size
    cache[step % 64] = bytearray(256 * 1024)  # a bounded cache: 16 MiB at most, filled in the first steps
    blackbox.step(step)
    time.sleep(0.05 + rng.random() * 0.05)
"""


def cost(ticks: int, rounds: int) -> None:
    import blackbox
    from blackbox.collect.alerts import AlertEngine
    from blackbox.collect.host import HostProbe

    folder = Path(tempfile.mkdtemp(prefix="bench-alerts-"))
    atexit.register(shutil.rmtree, folder, True)  # the rings go with the run, as in every other benchmark
    on = blackbox.Recorder.arm(folder / "on.ring", capacity=1 << 16, sample_interval=3600)
    off = blackbox.Recorder.arm(folder / "off.ring", capacity=1 << 16, sample_interval=3600, alerts=False)
    assert on._alerts is not None and off._alerts is None
    per: dict[str, list[float]] = {"tick, alerts on": [], "tick, alerts off": []}
    for _ in range(rounds):
        for name, rec in (("tick, alerts on", on), ("tick, alerts off", off)):
            samples = []
            for _ in range(ticks):
                t0 = time.thread_time_ns()
                rec.sample_now()
                samples.append(time.thread_time_ns() - t0)
            per[name].append(statistics.median(samples) / 1000)
    probe = HostProbe()
    figures = probe.read()
    probe.memory_stat()
    engine = AlertEngine(lambda *a: 0, 0.1, (0.8, 0.95), 60.0, lambda a: None)
    clock = 0.0
    for _ in range(200):  # a full window first
        clock += 0.1
        engine.tick(probe, figures, [], 1, now=clock)
    alone: dict[str, list[float]] = {"engine, no fit due": [], "engine, a fit due": []}
    for _ in range(ticks * rounds):
        for name, step in (("engine, no fit due", 0.01), ("engine, a fit due", 0.6)):
            clock += step
            t0 = time.thread_time_ns()
            engine.tick(probe, figures, [], 2, now=clock)
            alone[name].append((time.thread_time_ns() - t0) / 1000)
    on.disarm()
    off.disarm()
    print(f"cost ({ticks} ticks x {rounds} rounds, thread CPU time; this machine is shared: noisy)")
    for name, values in per.items():
        print(f"  {name:22s} median {statistics.median(values):8.1f} us (rounds: "
              f"{min(values):.1f}..{max(values):.1f})")  # fmt: skip
    for name, values in alone.items():
        print(f"  {name:22s} median {statistics.median(values):8.1f} us")
    fits = 0.1 / 0.5  # at the default 0.1 s interval a fit is due every fifth tick
    per_tick = statistics.median(alone["engine, no fit due"]) * (1 - fits) + statistics.median(
        alone["engine, a fit due"]) * fits  # fmt: skip
    print(f"  the engine per tick at the default interval: {per_tick:.1f} us "
          f"({100 * per_tick / statistics.median(per['tick, alerts off']):.1f}% of a tick without alerts)")  # fmt: skip


def _in_cgroup(code: str, args: list[str], limit: int, name: str, timeout: float) -> int:
    from cgroup_util import child_memory_cgroup, join

    with child_memory_cgroup(limit, name) as (cg, _):
        proc = subprocess.run([sys.executable, "-c", code, *args], preexec_fn=lambda: join(cg), timeout=timeout,
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, capture_output=True)  # fmt: skip
        return proc.returncode


def _recovered(ring_dir: Path) -> dict[str, Any]:
    import blackbox

    out = ring_dir.parent / (ring_dir.name + "-bundle")
    blackbox.recover(ring_dir, out, raw=False)
    meta: dict[str, Any] = json.loads((out / "metadata.json").read_text())
    return meta


def forecast(rates: list[float], limit_mib: int, repeats: int) -> None:
    print(f"forecast: a job leaking R MiB/s in a {limit_mib} MiB cgroup until the kernel kills it "
          f"({repeats} run(s) per rate)")  # fmt: skip
    print(f"  {'MiB/s':>6} {'lived s':>8} {'signal s':>8} {'foreseen s':>10} {'1st left':>8} {'1st said':>12} "
          f"{'held':>7} {'med err s':>9} {'med |err|/left':>14}")  # fmt: skip
    rel: list[float] = []
    for rate in rates:
        for _ in range(repeats):
            folder = Path(tempfile.mkdtemp(prefix="bench-alerts-"))
            atexit.register(shutil.rmtree, folder, True)
            (folder / "r").mkdir()
            t0 = time.monotonic()
            status = _in_cgroup(LEAK, [str(folder / "r"), str(rate)], limit_mib * MIB, "bench-alerts", 600)
            lived = time.monotonic() - t0
            meta = _recovered(folder / "r")
            a = meta.get("alerts") or {}
            j = a.get("forecast") or {}
            crit = next((x for x in a.get("alerts") or [] if x["level"] == "critical"), None)
            first = j.get("first") or {}
            if j:
                rel.append(j["median_relative_error"])
            print(f"  {rate:6.0f} {lived:8.1f} {crit['before_death_s'] if crit else float('nan'):8.1f} "
                  f"{j.get('foreseeable_s') or float('nan'):10.1f} {first.get('left_s', float('nan')):8.1f} "
                  f"{first.get('said_s', float('nan')):6.1f} ± {first.get('error_s', float('nan')):<4.1f} "
                  f"{j.get('held', 0):>3}/{j.get('forecasts', 0):<3} {j.get('median_error_s', float('nan')):9.2f} "
                  f"{j.get('median_relative_error', float('nan')):14.3f}   ({status}, {meta['cause']})")  # fmt: skip
    if rel:
        print(f"  median over runs of the median relative error: {statistics.median(rel):.3f}")


def steady(seconds: float, hours: float) -> None:
    folder = Path(tempfile.mkdtemp(prefix="bench-alerts-"))
    atexit.register(shutil.rmtree, folder, True)
    (folder / "r").mkdir()
    status = _in_cgroup(STEADY, [str(folder / "r"), str(seconds)], 512 * MIB, "bench-alerts", seconds + 120)
    meta = _recovered(folder / "r")
    alerts = (meta.get("alerts") or {}).get("alerts") or []
    print(f"steady: a real job that does not leak, {seconds:.0f} s in a 512 MiB cgroup (status {status}, last step "
          f"{meta.get('last_step')}): {len(alerts)} alert(s) {[x['text'] for x in alerts][:3]}")  # fmt: skip
    simulated(hours)


def simulated(hours: float) -> None:
    from blackbox.collect.alerts import DEFAULT_BEFORE_S, DEFAULT_LEVELS, Alert, AlertEngine

    interval, limit = 0.1, 8 * GIB
    models: dict[str, Any] = {
        "white noise (sd 8 MiB)": lambda rng, i: rng.gauss(0, 8 * MIB),
        "batch sawtooth (0/64 MiB)": lambda rng, i: 64 * MIB * ((i // 3) % 2) + rng.gauss(0, MIB),
        "cache filled over 30 s, then emptied (256 MiB)": lambda rng, i: 256 * MIB * (i % 300) / 300,
        "random steps (+-32 MiB), back to the mean in 10 s": 0.01,
        "random steps (+-32 MiB), back to the mean in 60 s": 1 / 600,
    }
    ticks = int(hours * 3600 / interval)
    print(f"simulated: {hours:g} h of steady series per model at a {interval} s interval, 3.2 of 8 GiB in use; "
          "alerts said (on_alert), and all alert records (with the forecasts' info updates)")  # fmt: skip
    for name, noise in models.items():
        rng, level, records = random.Random(11), 0.0, [0]
        said: list[Alert] = []
        engine = AlertEngine(lambda *a, n=records: n.append(1) or 0, interval, DEFAULT_LEVELS, DEFAULT_BEFORE_S,
                             said.append)  # fmt: skip
        probe = types.SimpleNamespace(owner_usage=0, file_cache=0, mem_total=256 * GIB, vm_size=-1)
        for i in range(ticks):
            if isinstance(noise, float):  # a random walk pulled back to its mean: memory that wanders, never leaks
                level += rng.choice((-32, 0, 32)) * MIB * (rng.random() < 0.05) - noise * level
                extra = level
            else:
                extra = noise(rng, i)
            probe.owner_usage = int(0.4 * limit + extra)
            engine.tick(probe, (0, probe.owner_usage, limit, 0, 200 * GIB, 0, -1, -1), [], i // 10, now=i * interval)
        print(f"  {name:50s} {len(said):4d} alert(s) ({len(records) - 1} records), {len(said) / hours:.3f} per hour; "
              f"the first {[a.text[:60] for a in said][:2]}")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = parser.add_subparsers(dest="what", required=True)
    c = sub.add_parser("cost")
    c.add_argument("--ticks", type=int, default=200)
    c.add_argument("--rounds", type=int, default=7)
    f = sub.add_parser("forecast")
    f.add_argument("--rates", default="8,16,32,64")
    f.add_argument("--limit-mib", type=int, default=512)
    f.add_argument("--repeats", type=int, default=1)
    s = sub.add_parser("steady")
    s.add_argument("--seconds", type=float, default=600)
    s.add_argument("--simulated-hours", type=float, default=24)
    args = parser.parse_args(argv)
    if args.what == "cost":
        cost(args.ticks, args.rounds)
    elif args.what == "forecast":
        forecast([float(r) for r in args.rates.split(",")], args.limit_mib, args.repeats)
    else:
        steady(args.seconds, args.simulated_hours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
