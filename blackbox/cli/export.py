"""Export a timeline to another tool's format: a Chrome / Perfetto trace (--perfetto), the Python stack
samples as folded stacks for flamegraph.pl (--folded) or as speedscope's own file (--speedscope), or the
live bytes of sampled allocations by allocating stack, folded (--live) or as a pprof profile (--pprof)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._common import own_process, standalone, to_stdout, writing
from ._tty import progress

DEFAULT_OUT = {"perfetto": "trace.json", "folded": "stacks.folded", "speedscope": "stacks.speedscope.json",
               "live": "live.folded", "pprof": "live.pb.gz"}  # fmt: skip
WHAT = {"perfetto": "the trace", "folded": "the folded stacks", "speedscope": "the speedscope profile",
        "live": "the live bytes by stack", "pprof": "the live bytes by stack"}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="+", metavar="BUNDLE|RING|DIR", help="a bundle, ring files or folders")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--perfetto", action="store_true", help="trace-event JSON for ui.perfetto.dev")
    what.add_argument("--folded", action="store_true", help="folded stacks for flamegraph.pl and speedscope")
    what.add_argument("--speedscope", action="store_true", help="speedscope's JSON: a profile per thread, in order")
    what.add_argument("--live", action="store_true", help="live bytes by allocating stack, folded")
    what.add_argument("--pprof", action="store_true", help="live bytes by allocating stack, pprof inuse_space")
    parser.add_argument(
        "--by-function",
        action="store_true",
        help="with --folded or --speedscope: one frame per function (no line numbers, short paths)",
    )
    parser.add_argument("-o", "--out", metavar="FILE",
                        help="file to write, - for standard output (default: trace.json, stacks.folded, "
                        "stacks.speedscope.json, live.folded or live.pb.gz)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from .._errors import BlackboxError

    what = next(w for w in DEFAULT_OUT if getattr(args, w))
    if args.by_function and what not in ("folded", "speedscope"):
        raise BlackboxError(f"expected --by-function with --folded or --speedscope, found it with --{what}")
    own_process()
    from ..recovery.bundle import load

    with progress("recovering") as tick:
        table, meta = load(args.target, tick)
    out = args.out or DEFAULT_OUT[what]
    if what in ("live", "pprof"):
        return _live(what, out, meta)
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
    return _write(out, WHAT[what], text.encode("utf-8"), said)


def _live(what: str, out: str, meta: dict[str, Any]) -> int:
    from ..views.allocs import folded_live, pprof_live

    text = folded_live(meta)
    if not text:
        print("blackbox export: no sampled allocation was live in these rings (arm with allocations=True, "
              "or BLACKBOX_ALLOCATIONS=1)", file=sys.stderr)  # fmt: skip
        return 1
    total = sum(int(line.rsplit(" ", 1)[1]) for line in text.splitlines())
    said = f"{len(text.splitlines())} stacks, {total} live bytes estimated); " + (
        "flamegraph.pl or https://www.speedscope.app read it as is" if what == "live" else "go tool pprof reads it"
    )
    return _write(out, WHAT[what], text.encode("utf-8") if what == "live" else pprof_live(meta), said)


def _write(out: str, what: str, data: bytes, said: str) -> int:
    """``data`` to ``out`` (- : standard output, nothing else said there), then one line saying so."""
    if to_stdout(out):
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
        return 0
    with writing(out, what), open(out, "wb") as f:
        f.write(data)
    print(f"wrote {out} ({said}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox export", argv)
