"""Recover rings (files or folders of rings) into a bundle: timeline.parquet, metadata.json, summary.md."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("rings", nargs="+", metavar="RING|DIR", help="ring files, or folders holding *.ring files")
    parser.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="OUT",
        help="bundle folder, or a pyarrow filesystem URI (s3://, gs://, hdfs://, file://)",
    )
    parser.add_argument("--summary", action="store_true", help="print summary.md after writing")


def run(args: argparse.Namespace) -> int:
    from .._postmortem import write_postmortem
    from ..recovery.bundle import read_summary

    out = args.out
    meta = write_postmortem([Path(p) for p in args.rings], out)
    rec = meta["recovery"]
    state = "clean end" if meta.get("clean") else "no clean end"
    print(f"wrote {out}/ ({meta['events']} events, {rec.get('torn', 0)} torn slots dropped, {state})")
    for unread in meta.get("unread_rings", []):  # recovered without them: say which and why, one line each
        print(f"blackbox: not recovered: {unread['reason']}", file=sys.stderr)
    if args.summary:
        sys.stdout.write(read_summary(out))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox recover", argv)
