"""Plot host and GPU memory over time, with limits, steps and the death marked, to a PNG."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._common import own_process, standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="+", metavar="BUNDLE|RING|DIR", help="a bundle, ring files or folders")
    parser.add_argument("-o", "--out", default="memory.png", help="PNG to write (default: memory.png)")


def run(args: argparse.Namespace) -> int:
    own_process()
    from ..recovery.bundle import load
    from ..views.plot import memory_figure

    table, meta = load(args.target)
    memory_figure(table, meta).savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox plot", argv)
