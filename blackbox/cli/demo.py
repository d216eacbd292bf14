"""Run a short CPU training job with blackbox armed, SIGKILL it mid-step, recover it, print the summary."""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ._common import own_process, standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default="blackbox-demo", metavar="DIR", help="work folder (default: ./blackbox-demo)")
    parser.add_argument("--kill-after", type=int, default=40, metavar="N", help="SIGKILL after step N (default 40)")


def run(args: argparse.Namespace) -> int:
    own_process()
    from .._postmortem import write_postmortem
    from ..recovery.bundle import SUMMARY

    work = Path(args.dir)
    rings, bundle = work / "rings", work / "bundle"
    shutil.rmtree(rings, ignore_errors=True)
    rings.mkdir(parents=True, exist_ok=True)
    print(f"[demo] starting a CPU training job armed with blackbox (rings in {rings}/)", flush=True)
    cmd = [sys.executable, "-m", "blackbox.cli._demo_job", str(rings)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    last = -1
    for line in child.stdout:
        if line.startswith("step "):
            last = int(line.split()[1])
            if last >= args.kill_after:
                break
    if child.poll() is not None:
        print(
            f"[demo] the job exited by itself (status {child.returncode}) before step {args.kill_after}",
            file=sys.stderr,
        )
        return 1
    time.sleep(random.uniform(0, 0.01))  # land somewhere inside the next step
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    print(
        f"[demo] sent SIGKILL after step {last}: the job died with status {child.returncode}, no handler ran",
        flush=True,
    )
    write_postmortem([rings], bundle)
    print(f"[demo] recovered the ring into {bundle}/ (timeline.parquet, metadata.json, summary.md)\n", flush=True)
    sys.stdout.write((bundle / SUMMARY).read_text())
    query = f"SELECT kind, count(*) AS n FROM '{bundle}/timeline.parquet' GROUP BY kind ORDER BY n DESC"
    print(f'\n[demo] query it with DuckDB: python -c "import duckdb; duckdb.sql(\\"{query}\\").show()"')
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox demo", argv)
