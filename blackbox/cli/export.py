"""Export a timeline to another tool's format: a Chrome / Perfetto trace (--perfetto), or the
Python stack samples as folded stacks for flamegraph.pl and speedscope (--folded)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ._common import own_process, standalone, writing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="+", metavar="BUNDLE|RING|DIR", help="a bundle, ring files or folders")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--perfetto", action="store_true", help="trace-event JSON for ui.perfetto.dev")
    what.add_argument("--folded", action="store_true", help="folded stacks for flamegraph.pl and speedscope")
    parser.add_argument("-o", "--out", help="file to write (default: trace.json, or stacks.folded with --folded)")


def run(args: argparse.Namespace) -> int:
    own_process()
    from ..recovery.bundle import load

    table, meta = load(args.target)
    if args.folded:
        from ..views.stacks import folded_stacks

        out = Path(args.out or "stacks.folded")
        text = folded_stacks(table)
        with writing(out, "the folded stacks"):
            out.write_text(text, encoding="utf-8")
        samples = sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines())
        print(f"wrote {out} ({len(text.splitlines())} distinct stacks, {samples} samples); "
              "flamegraph.pl or https://www.speedscope.app read it as is")  # fmt: skip
        return 0
    from ..views.perfetto import trace_events

    out = Path(args.out or "trace.json")
    trace = trace_events(table, meta)
    with writing(out, "the trace"):
        out.write_text(json.dumps(trace, separators=(",", ":"), default=str))
    print(f"wrote {out} ({len(trace['traceEvents'])} trace events); open it in https://ui.perfetto.dev")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox export", argv)
