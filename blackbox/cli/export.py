"""Export a timeline to another tool's format: a Chrome / Perfetto trace (--perfetto)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="+", metavar="BUNDLE|RING|DIR", help="a bundle, ring files or folders")
    parser.add_argument("--perfetto", action="store_true", required=True, help="trace-event JSON for ui.perfetto.dev")
    parser.add_argument("-o", "--out", default="trace.json", help="file to write (default: trace.json)")


def run(args: argparse.Namespace) -> int:
    from ..recovery.bundle import load
    from ..views.perfetto import trace_events

    table, meta = load(args.target)
    trace = trace_events(table, meta)
    Path(args.out).write_text(json.dumps(trace, separators=(",", ":"), default=str))
    print(f"wrote {args.out} ({len(trace['traceEvents'])} trace events); open it in https://ui.perfetto.dev")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox export", argv)
