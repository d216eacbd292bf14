"""Where an armed training step's CPU goes to blackbox: perf's samples of the job, by library and symbol.

    sudo .venv/bin/python tools/bench_profile.py --runs 3 --seconds 40

An A/B of step times on a shared 2-vCPU VM resolves about +-0.5% (docs/performance.md); this counts instead
the job's own CPU samples (perf's cpu-clock, 2,000 a second, every thread of the job) that land in
blackbox's C code: the allocation hooks (`_csample`), the write path (`_cwriter`), and the loader walk a
rescan makes (glibc's `dl_iterate_phdr`). Each run is a fresh process: the GPT step of tools/small_gpt.py,
armed as `arm()` arms it (or `--config off`: `allocations=False`), recorded in its steady state only (after
`--warm` steps). The recorder's Python code on its sampler thread is in libpython's share and not counted
here (the A/B counts it). Prints each run and the median share of each. Needs `perf` (linux-tools) and
perf_event_paranoid <= 1 or root.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
JOB = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
import blackbox
from blackbox.collect.allocs import sample_module
from small_gpt import gpt_step

step = gpt_step()
kw = {} if sys.argv[3] == "default" else {"allocations": False}
blackbox.arm(sys.argv[2], **kw)
for _ in range(int(sys.argv[4])):
    step()
c, t0, c0, n = sample_module(), time.monotonic(), time.process_time(), 0
s0 = c.stats()["samples"] if c is not None and kw == {} else 0
print("ready", flush=True)
deadline = t0 + float(sys.argv[5])
while time.monotonic() < deadline:
    step()
    n += 1
cpu = time.process_time() - c0
s1 = c.stats()["samples"] if c is not None and kw == {} else 0
print(json.dumps({"steps": n, "step_ms": cpu / n * 1e3, "samples_per_step": (s1 - s0) / n}), flush=True)
blackbox.disarm()
"""


def shares(data: Path) -> dict[str, float]:
    """Percent of the job's samples by (library, symbol), from perf report."""
    out = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children", "-g", "none",
                          "--sort", "dso,sym", "-t", ",", "--percent-limit", "0"],  # fmt: skip
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    got: dict[str, float] = {}
    for row in csv.reader(io.StringIO("\n".join(x for x in out.splitlines() if x and not x.startswith("#")))):
        if len(row) >= 3 and row[0].strip().endswith("%"):
            got[f"{row[1].strip()} {row[2].strip()}"] = float(row[0].strip().rstrip("%"))
    return got


def one(config: str, seconds: float, warm: int, python: str) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="bb-profile-") as tmp:
        job = subprocess.Popen([python, "-c", JOB, str(TOOLS), f"{tmp}/rings/", config, str(warm), str(seconds + 5)],
                               stdout=subprocess.PIPE, text=True, cwd=TOOLS.parent)  # fmt: skip
        assert job.stdout is not None
        if job.stdout.readline().strip() != "ready":
            raise SystemExit(f"the job did not start: exit status {job.wait()}")
        data = Path(tmp) / "perf.data"
        rec = subprocess.Popen(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-o", str(data),
                                "-p", str(job.pid)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(seconds)
        rec.send_signal(signal.SIGINT)
        rec.wait(60)
        figures = json.loads(job.stdout.readline())
        job.wait(120)
        by = shares(data)
    hooks = {k.split(" ", 1)[1]: v for k, v in by.items() if "_csample" in k.split(" ", 1)[0]}
    return {
        "config": config,
        **figures,
        "hooks_pct": sum(hooks.values()),
        "writer_pct": sum(v for k, v in by.items() if "_cwriter" in k.split(" ", 1)[0]),
        "dl_iterate_phdr_pct": sum(v for k, v in by.items() if k.endswith("dl_iterate_phdr")),
        "top": sorted(hooks.items(), key=lambda kv: -kv[1])[:5],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=40.0, help="perf's recording of each run's steady state")
    ap.add_argument("--warm", type=int, default=30, help="steps after arming before recording")
    ap.add_argument("--config", choices=("default", "off"), default="default")
    args = ap.parse_args()
    if shutil.which("perf") is None:
        print("perf not found: install linux-tools (Debian: linux-perf)", file=sys.stderr)
        return 2
    runs = [one(args.config, args.seconds, args.warm, sys.executable) for _ in range(args.runs)]
    for r in runs:
        top = ", ".join(f"{name} {pct:.2f}%" for name, pct in r["top"])  # type: ignore[attr-defined]
        print(f"{r['config']}: {r['step_ms']:.1f} ms of CPU a step, {r['samples_per_step']:.0f} samples a step; "
              f"hooks {r['hooks_pct']:.2f}% ({top}); write path {r['writer_pct']:.2f}%; "
              f"dl_iterate_phdr {r['dl_iterate_phdr_pct']:.2f}%")  # fmt: skip
    for key in ("hooks_pct", "writer_pct", "dl_iterate_phdr_pct"):
        median = statistics.median(float(r[key]) for r in runs)  # type: ignore[arg-type]
        print(f"median {key[:-4]}: {median:.2f}% of the job's CPU ({args.runs} runs of {args.seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
