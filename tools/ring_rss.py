"""What arming adds to a job's memory as the kernel counts it: the same job unarmed and armed, side by side.

    .venv/bin/python tools/ring_rss.py [--seconds 6] [--runs 3] [--before /path/to/other/checkout]
                                       [--writer c|python] [--no-torch [--numpy]] [--idle]
                                       [--limit-steps]

Each run starts the job unarmed, armed with this checkout, and (with ``--before``) armed with another
checkout of blackbox (e.g. ``git worktree add /tmp/base aa7a9d9``, its C extension built in place), all
at once. The job imports torch, arms (or not) with the default ring, and runs a training-shaped loop
that writes several hundred thousand events a second (the 32 MiB ring laps every second or so). While
they run, this script reads each one's ``/proc/PID/status`` (VmRSS, RssAnon, RssFile, VmLck, VmPTE) and
``/proc/PID/oom_score`` every 20 ms. Prints, per process, the median of each figure over the run, then
the median over runs; "badness" is what the kernel OOM killer ranks a process by (oom_badness: its RSS,
swap and page tables), "+badness" the difference from the unarmed job. oom_score is that badness per
mille of the host's memory and swap, so it moves only in steps of (RAM + swap) / 1000. The events/s
column only shows that the ring laps; the jobs share the machine's cores, it is no cost measure.

``--idle``: the job writes no events and sleeps, armed or not: what arming itself holds (the modules it
imports, its sampler thread, a tick's pages).

``--limit-steps`` (as root) also runs a leaking training loop (8 MiB a step, the job of
tests/test_kernel_oom.py) in a child memory cgroup limited to 400 MiB, one job at a time, ``--runs``
times each way, and prints the last step each printed before the kernel killed it: how much sooner the
ring's page cache, charged to the cgroup, brings the OOM kill.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmLck", "VmPTE", "VmSwap")

JOB = """
import os, sys, time
arm, seconds, use_torch = sys.argv[1] == "arm", float(sys.argv[2]), sys.argv[3] == "torch"
if sys.argv[3] == "numpy":
    import numpy
idle = sys.argv[5] == "idle"
if use_torch:
    import torch
    torch.set_num_threads(1)
    x = torch.randn(64, 64)
if arm:
    import blackbox
    rec = blackbox.arm(sys.argv[4] + "/")
    assert rec.armed and blackbox.__file__.startswith(os.environ["PYTHONPATH"]), "not armed from that checkout"
mark = blackbox.mark if arm else (lambda *a: None)
step = blackbox.step if arm else (lambda *a: None)
print("ready", flush=True)
end, n = time.monotonic() + seconds, 0
if idle:  # armed and waiting: what arming itself holds (its imports, its threads, the sampler's ticks)
    time.sleep(seconds)
while time.monotonic() < end:
    step()
    for _ in range(200):
        mark("loss", n)
        n += 1
    if use_torch:
        x = (x @ x).tanh()
print("events", n, flush=True)
"""

LEAK = """
import sys
if sys.argv[1] == "arm":
    import blackbox
    blackbox.arm(sys.argv[2] + "/", sample_interval=0.05)
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 1))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
kept = []  # the leak: every step's eval loss kept with its graph (8 MiB of activations)
for step in range(1, 100000):
    x = torch.randn(1024, 256)
    loss = model(x).pow(2).mean()
    kept.append(model(x).mean())
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, flush=True)
"""
LIMIT = 400 << 20


def limit_steps(jobs: dict[str, dict[str, str]], runs: int, folder: Path) -> dict[str, list[int]]:
    """The last step each job printed before the kernel OOM-killed it in a 400 MiB cgroup."""
    sys.path.insert(0, str(REPO / "tools"))
    from cgroup_util import child_memory_cgroup, join

    out: dict[str, list[int]] = {name: [] for name in jobs}
    for r in range(runs):
        for name, env in jobs.items():
            work = folder / f"leak-{name}-{r}"
            work.mkdir()
            with child_memory_cgroup(LIMIT, "ring-rss-steps") as (cg, version):
                if version == 1:
                    (cg / "memory.swappiness").write_text("0")
                proc = subprocess.run(
                    [sys.executable, "-c", textwrap.dedent(LEAK), "no" if name == "unarmed" else "arm", str(work)],
                    env=dict(os.environ, OMP_NUM_THREADS="1", **env), cwd=work, capture_output=True, text=True,
                    preexec_fn=functools.partial(join, cg), timeout=600,
                )  # fmt: skip
            if proc.returncode != -9:
                raise SystemExit(f"{name}: expected the kernel's SIGKILL, got {proc.returncode}: {proc.stderr[-500:]}")
            printed = proc.stdout.split()
            out[name].append(int(printed[-1]) if printed else 0)
    return out


def status(pid: int) -> dict[str, int] | None:
    """The figures of /proc/PID/status in KiB, and oom_score; None once the process is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
        score = int(Path(f"/proc/{pid}/oom_score").read_text())
    except (OSError, ValueError):
        return None
    out = {"oom_score": score}
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in FIELDS:
            out[key] = int(rest.split()[0])
    return out


def one_run(
    jobs: dict[str, dict[str, str]], seconds: float, torch: str, folder: Path, idle: bool = False
) -> dict[str, dict[str, float]]:
    procs: dict[str, subprocess.Popen[str]] = {}
    for name, env in jobs.items():
        ring_dir = folder / name
        ring_dir.mkdir()
        mode = "no" if name == "unarmed" else "arm"
        # cwd: not a checkout, whose blackbox `python -c` would import first
        procs[name] = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(JOB), mode, str(seconds), torch, str(ring_dir),
             "idle" if idle else "busy"],
            env=dict(os.environ, **env), stdout=subprocess.PIPE, text=True, cwd=ring_dir,
        )  # fmt: skip
    for name, p in procs.items():
        assert p.stdout is not None
        line = p.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"{name}: the job did not start ({line!r})")
    samples: dict[str, list[dict[str, int]]] = {name: [] for name in procs}
    time.sleep(0.3)  # past arm and the first ticks
    while all(p.poll() is None for p in procs.values()):
        for name, p in procs.items():
            figures = status(p.pid)
            if figures is not None:
                samples[name].append(figures)
        time.sleep(0.02)
    out: dict[str, dict[str, float]] = {}
    for name, p in procs.items():
        rest, _ = p.communicate(timeout=60)
        if p.returncode != 0:
            raise SystemExit(f"{name}: the job failed ({p.returncode})")
        rows = samples[name]
        med = {k: statistics.median(r.get(k, 0) for r in rows) for k in ("oom_score", *FIELDS)}
        med["badness"] = med["VmRSS"] + med["VmPTE"] + med["VmSwap"]
        med["events"] = float(rest.split()[-1])
        med["samples"] = len(rows)
        out[name] = med
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--before", type=Path, help="another checkout of blackbox, armed side by side")
    ap.add_argument("--writer", choices=("c", "python"), default="c")
    ap.add_argument("--no-torch", action="store_true", help="a job without torch (smaller, faster to start)")
    ap.add_argument("--numpy", action="store_true", help="with --no-torch: the job imports numpy, armed or not")
    ap.add_argument("--idle", action="store_true", help="a job that writes no events: what arming itself holds")
    ap.add_argument("--limit-steps", action="store_true", help="also: steps of a leak before a 400 MiB OOM kill")
    args = ap.parse_args(argv)
    jobs = {"unarmed": {"PYTHONPATH": str(REPO)}, "armed": {"PYTHONPATH": str(REPO)}}
    if args.before:
        jobs["armed-before"] = {"PYTHONPATH": str(args.before.resolve())}
    for env in jobs.values():
        env["BLACKBOX_WRITER"] = args.writer
    runs = []
    with tempfile.TemporaryDirectory(prefix="ring-rss-", dir="/var/tmp") as d:
        for r in range(args.runs):
            folder = Path(d) / str(r)
            folder.mkdir()
            imports = "numpy" if args.numpy else "no" if args.no_torch else "torch"
            runs.append(one_run(jobs, args.seconds, imports, folder, args.idle))
        steps = limit_steps(jobs, args.runs, Path(d)) if args.limit_steps else None
    torch = ("without" if args.no_torch else "with") + (" (numpy imported)" if args.numpy else "")
    torch += " (idle: no events)" if args.idle else ""
    print(f"{args.runs} runs of {args.seconds:g} s, {args.writer} write path, job {torch} torch; "
          "medians of 20 ms samples per run, then the median over runs (KiB)")  # fmt: skip
    cols = ("VmRSS", "RssAnon", "RssFile", "VmLck", "badness", "+badness", "oom_score", "events/s")
    print("\n| job | " + " | ".join(cols) + " |\n|---|" + "---:|" * len(cols))
    base = statistics.median(run["unarmed"]["badness"] for run in runs)
    for name in jobs:
        med = {k: statistics.median(run[name][k] for run in runs) for k in runs[0][name]}
        cells = [f"{med[k]:,.0f}" for k in cols[:5]]
        cells += [f"{med['badness'] - base:+,.0f}", f"{med['oom_score']:.0f}", f"{med['events'] / args.seconds:,.0f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")
    if steps is not None:
        print(f"\nA leak of 8 MiB a step in a {LIMIT >> 20} MiB memory cgroup: the last step printed before the "
              "kernel's OOM kill, each run, and the median\n")  # fmt: skip
        for name, printed in steps.items():
            print(f"- {name}: {printed}, median {statistics.median(printed):g}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
