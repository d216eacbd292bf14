"""Print the human summary of a bundle, or of rings recovered on the fly (nothing is written)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", nargs="+", metavar="BUNDLE|RING|DIR", help="a bundle folder, ring files or folders")


def run(args: argparse.Namespace) -> int:
    from ..recovery.bundle import SUMMARY, read_summary
    from ..recovery.pipeline import RecoveryPass
    from ..views.summary import bundle_summary

    targets = [Path(t) for t in args.target]
    if len(targets) == 1 and os.path.lexists(targets[0] / SUMMARY):
        sys.stdout.write(read_summary(targets[0]))  # as untrusted input: never through a link
        return 0
    recovery = RecoveryPass(targets)  # nothing written; each ring's timeline dropped once diagnosed
    for _ in recovery.tables():
        pass
    sys.stdout.write(bundle_summary(recovery.finish()))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox summary", argv)
