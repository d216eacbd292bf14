"""Export a timeline to another tool's format: a Chrome / Perfetto trace (--perfetto), the
Python stack samples as folded stacks for flamegraph.pl and speedscope (--folded), or the live
bytes of sampled allocations by allocating stack, folded (--live) or as a pprof profile (--pprof)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import own_process, standalone, writing


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="+", metavar="BUNDLE|RING|DIR", help="a bundle, ring files or folders")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--perfetto", action="store_true", help="trace-event JSON for ui.perfetto.dev")
    what.add_argument("--folded", action="store_true", help="folded stacks for flamegraph.pl and speedscope")
    what.add_argument("--live", action="store_true", help="live bytes by allocating stack, folded")
    what.add_argument("--pprof", action="store_true", help="live bytes by allocating stack, pprof inuse_space")
    parser.add_argument("-o", "--out", help="file to write (default: trace.json, stacks.folded, live.folded or "
                                            "live.pb.gz)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    own_process()
    from ..recovery.bundle import load

    table, meta = load(args.target)
    if args.live or args.pprof:
        return _live(args, meta)
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


def _live(args: argparse.Namespace, meta: dict[str, Any]) -> int:
    from ..views.allocs import folded_live, pprof_live

    text = folded_live(meta)
    if not text:
        print("blackbox export: no sampled allocation was live in these rings (arm with allocations=True, "
              "or BLACKBOX_ALLOCATIONS=1)", file=sys.stderr)  # fmt: skip
        return 1
    out = Path(args.out or ("live.folded" if args.live else "live.pb.gz"))
    with writing(out, "the live bytes by stack"):
        if args.live:
            out.write_text(text, encoding="utf-8")
        else:
            out.write_bytes(pprof_live(meta))
    total = sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines())
    print(
        f"wrote {out} ({len(text.splitlines())} stacks, {total} live bytes estimated); "
        + ("flamegraph.pl or https://www.speedscope.app read it as is" if args.live else "go tool pprof reads it")
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox export", argv)
