"""Print the human summary of a bundle, or of rings recovered on the fly (nothing is written)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="+", metavar="BUNDLE|RING|DIR", help="a bundle folder, ring files or folders")


def run(args: argparse.Namespace) -> int:
    from ..recovery.bundle import SUMMARY
    from ..recovery.pipeline import recover_rings
    from ..views.summary import bundle_summary

    targets = [Path(t) for t in args.target]
    if len(targets) == 1 and (targets[0] / SUMMARY).is_file():
        sys.stdout.write((targets[0] / SUMMARY).read_text())
        return 0
    recovered = recover_rings(targets)  # in memory: no Parquet, no picture
    sys.stdout.write(bundle_summary(recovered.meta))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox summary", argv)
