"""Run a short CPU training job with blackbox armed, SIGKILL it mid-step, recover it, print the summary."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .._units import human_bytes
from ._common import own_process, standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dir", default="blackbox-demo", metavar="DIR", help="work folder (default: ./blackbox-demo)")
    parser.add_argument("--kill-after", type=int, default=40, metavar="N", help="SIGKILL after step N (default 40)")


def run(args: argparse.Namespace) -> int:
    own_process()
    from .._postmortem import write_postmortem
    from ..recovery.bundle import SUMMARY
    from ..views.text import as_text

    work = Path(args.dir)
    rings, bundle = work / "rings", work / "bundle"
    shutil.rmtree(rings, ignore_errors=True)
    rings.mkdir(parents=True, exist_ok=True)
    print(f"[demo] starting a CPU training job armed with blackbox (rings in {rings}/)", flush=True)
    cmd = [sys.executable, "-m", "blackbox.cli._demo_job", str(rings)]
    child = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    last, planted = -1, (0, 0)
    for line in child.stdout:
        if line.startswith("leak "):
            planted = (int(line.split()[1]), int(line.split()[2]))
        elif line.startswith("step "):
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
    sys.stdout.write(as_text((bundle / SUMMARY).read_text()))
    meta = json.loads((bundle / "metadata.json").read_text())
    print(f"\n[demo] {leak_found(meta.get('allocations'), *planted, steps=last + 1)}", flush=True)
    print(f"\n[demo] {query_hint(bundle / 'timeline.parquet')}")
    return 0


def query_hint(timeline: Path) -> str:
    """A command that counts the timeline's rows by kind, runnable as printed: this interpreter, the path
    quoted for the shell; DuckDB where it is installed, else pyarrow (a dependency)."""
    path = json.dumps(str(timeline))  # a Python string in double quotes: the shell's single quotes hold it
    if importlib.util.find_spec("duckdb") is not None:
        code = (f'import duckdb; duckdb.read_parquet({path})'
                '.aggregate("kind, count(*) AS n", "kind").order("n DESC").show()')
        how = "query it with DuckDB"
    else:
        code = (f'import pyarrow.parquet as pq; t = pq.read_table({path}, columns=["kind"]); '
                'print(t.group_by("kind").aggregate([("kind", "count")]).sort_by([("kind_count", "descending")]))')
        how = "count its rows by kind (pip install duckdb for SQL)"
    return f"{how}: {shlex.join([sys.executable, '-c', code])}"


def _short(site: str) -> str:
    """``train_torch (/long/path/_demo_job.py:40)`` as ``train_torch (_demo_job.py:40)``."""
    function, _, where = site.partition(" (")
    return f"{function} ({where.rsplit('/', 1)[-1]}"


def leak_found(allocs: Any, kept_bytes: int, line: int, *, steps: int) -> str:
    """The demo's planted leak (``kept_bytes`` a step at ``_demo_job.py:line``) against what
    blackbox's allocation sampling names: the site, its growth a step and its live bytes with their error."""
    truth = f"the job keeps {human_bytes(kept_bytes)} a step on purpose at _demo_job.py:{line}"
    where = f"_demo_job.py:{line})"
    sites = allocs.get("sites", []) if isinstance(allocs, dict) else []
    site = next((s for s in sites if isinstance(s, dict) and str(s.get("site", "")).endswith(where)), None)
    if site is None:
        return f"{truth}; blackbox sampled no allocation there (a kill this early leaves few samples)"
    rank = sorted(sites, key=lambda s: -(s.get("growth_per_step") or 0)).index(site) + 1
    grows = f"{human_bytes(site['growth_per_step'])} a step" if site.get("growth_per_step") else "no growth by step"
    return (
        f"{truth} ({human_bytes(kept_bytes * steps)} after {steps} steps). blackbox names "
        f"{_short(str(site['site']))}, the #{rank} grower: {grows}, "
        f"{human_bytes(site['live_bytes'])} ± {human_bytes(site['error_bytes'])} live (95%)"
    )


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox demo", argv)
