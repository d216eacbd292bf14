"""Write one self-contained HTML page of a bundle: the verdict and its evidence, the memory timeline,
who holds the memory, what it was doing, and every process; it needs no network."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._common import own_process, standalone, to_stdout, writing
from ._tty import progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        nargs="+",
        metavar="BUNDLE|RING|DIR",
        help="a bundle; ring files or folders of rings (recovered in memory); a `blackbox run` folder; "
        "folders of bundles (the first death's bundle)",
    )
    parser.add_argument("-o", "--out", default="report.html", metavar="FILE",
                        help="HTML file to write, - for standard output (default: report.html)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    own_process()
    from ..views.report import report_html
    from .plot import picture_source

    with progress("recovering") as tick:
        table, meta, drawn = picture_source([str(t) for t in args.target], tick)
    page = report_html(table, meta, source=drawn)
    if to_stdout(args.out):
        sys.stdout.write(page)
        sys.stdout.flush()
        return 0
    with writing(args.out, "the report"), open(args.out, "w", encoding="utf-8") as f:
        f.write(page)
    print(f"wrote {args.out} ({len(page.encode()) // 1024} KiB, {drawn}); open it in a browser, no network needed")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox report", argv)
