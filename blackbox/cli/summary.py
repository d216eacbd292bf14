"""Print the human summary of a bundle, of a job's node bundles, or of rings recovered on the fly."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from ._common import own_process, standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        nargs="+",
        metavar="BUNDLE|RING|DIR|URI",
        help="a bundle; several bundles, a folder or a URI prefix of them (s3://, gs://, hdfs://, file://) "
        "for the job-wide account; or ring files and folders of rings (recovered in memory, nothing written)",
    )


def run(args: argparse.Namespace) -> int:
    own_process()
    from .._errors import one_line
    from .._postmortem import job_account, printable
    from ..recovery.bundle import read_summary
    from ..recovery.job import kind_of
    from ..recovery.pipeline import RecoveryPass
    from ..views.summary import bundle_summary, claimed_lines

    targets = [str(t) for t in args.target]  # a URI never goes through Path (s3:// would lose a slash)
    kind = kind_of(targets)
    if kind == "bundle":
        sys.stdout.write(printable(read_summary(targets[0])))  # untrusted: never through a link, no escapes
        return 0
    if kind == "bundles":
        _, meta, text = job_account(targets)
        sys.stdout.write(text)
        for unread in meta["unread_bundles"]:
            print(f"blackbox: not read: {one_line(unread['reason'])}", file=sys.stderr)
        for line in claimed_lines(meta["claimed_twice"])[2:-1]:  # the summary's lines, without the heading
            print(f"blackbox: held twice:{line[1:]}", file=sys.stderr)
        return 0
    recovery = RecoveryPass([Path(t) for t in targets])  # nothing written; each timeline dropped once diagnosed
    for _ in recovery.tables():
        pass
    sys.stdout.write(printable(bundle_summary(recovery.finish())))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox summary", argv)
