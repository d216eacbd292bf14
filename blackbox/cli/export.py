"""Export a timeline to another tool's format: a Chrome / Perfetto trace (--perfetto), the Python stack
samples as folded stacks for flamegraph.pl (--folded) or as speedscope's own file (--speedscope)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._common import own_process, standalone, to_stdout, writing
from ._tty import progress

DEFAULT_OUT = {"perfetto": "trace.json", "folded": "stacks.folded", "speedscope": "stacks.speedscope.json"}
WHAT = {"perfetto": "the trace", "folded": "the folded stacks", "speedscope": "the speedscope profile"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="+", metavar="BUNDLE|RING|DIR", help="a bundle, ring files or folders")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--perfetto", action="store_true", help="trace-event JSON for ui.perfetto.dev")
    what.add_argument("--folded", action="store_true", help="folded stacks for flamegraph.pl and speedscope")
    what.add_argument("--speedscope", action="store_true", help="speedscope's JSON: a profile per thread, in order")
    parser.add_argument(
        "--by-function",
        action="store_true",
        help="with --folded or --speedscope: one frame per function (no line numbers, short paths)",
    )
    parser.add_argument("-o", "--out", metavar="FILE",
                        help="file to write, - for standard output (default: trace.json, stacks.folded or "
                        "stacks.speedscope.json)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from .._errors import BlackboxError

    if args.by_function and args.perfetto:
        raise BlackboxError("expected --by-function with --folded or --speedscope, found it with --perfetto")
    own_process()
    from ..recovery.bundle import load

    with progress("recovering") as tick:
        table, meta = load(args.target, tick)
    what = "perfetto" if args.perfetto else "folded" if args.folded else "speedscope"
    out = args.out or DEFAULT_OUT[what]
    if args.folded:
        from ..views.speedscope import folded_by_function
        from ..views.stacks import folded_stacks

        text = folded_by_function(table) if args.by_function else folded_stacks(table)
        samples = sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines())
        said = f"{len(text.splitlines())} distinct stacks, {samples} samples); flamegraph.pl or speedscope read it"
    elif args.speedscope:
        from ..views.speedscope import speedscope_profile

        profile = speedscope_profile(table, meta, by_function=args.by_function)
        if not profile["profiles"]:
            raise BlackboxError(f"{' '.join(map(str, args.target))}: expected stack samples, found none "
                                "(stack sampling was off)")  # fmt: skip
        text = json.dumps(profile, separators=(",", ":"))
        said = (f"{len(profile['profiles'])} threads, {len(profile['shared']['frames'])} frames); open it in "
                "https://www.speedscope.app")  # fmt: skip
    else:
        from ..views.perfetto import trace_events

        trace: dict[str, Any] = trace_events(table, meta)
        text = json.dumps(trace, separators=(",", ":"), default=str)
        said = f"{len(trace['traceEvents'])} trace events); open it in https://ui.perfetto.dev"
    if to_stdout(out):
        sys.stdout.write(text)
        sys.stdout.flush()
        return 0
    with writing(out, WHAT[what]), open(out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {out} ({said}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox export", argv)
