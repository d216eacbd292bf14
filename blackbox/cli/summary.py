"""Print the human summary of a bundle, of a job's node bundles, or of rings recovered on the fly."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..views.text import as_text
from ._common import own_process, standalone
from ._tty import colour_markdown, colour_on, progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "target",
        nargs="+",
        metavar="BUNDLE|RING|DIR|URI",
        help="a bundle; several bundles, a folder or a URI prefix of them (s3://, gs://, hdfs://, file://) "
        "for the job-wide account; or ring files and folders of rings (recovered in memory, nothing written)",
    )
    parser.add_argument("--json", action="store_true", help="print the metadata (the diagnosis and its facts) as JSON")


def run(args: argparse.Namespace) -> int:
    own_process()
    from .._errors import one_line
    from .._postmortem import job_account, printable
    from ..recovery.bundle import read_metadata, read_summary
    from ..recovery.locate import kind_of
    from ..recovery.pipeline import RecoveryPass
    from ..views.summary import bundle_summary, claimed_lines

    targets = [str(t) for t in args.target]  # a URI never goes through Path (s3:// would lose a slash)
    kind = kind_of(targets)
    if kind == "bundle":
        if args.json:
            return _json(read_metadata(targets[0]))
        sys.stdout.write(_shown(printable(read_summary(targets[0]))))  # untrusted: never through a link, no escapes
        return 0
    if kind == "bundles":
        _, meta, text = job_account(targets)
        sys.stdout.write(json.dumps(meta, indent=1, default=str) + "\n" if args.json else _shown(text))
        for unread in meta["unread_bundles"]:
            print(f"blackbox: not read: {one_line(unread['reason'])}", file=sys.stderr)
        for line in claimed_lines(meta["claimed_twice"])[2:-1]:  # the summary's lines, without the heading
            print(f"blackbox: held twice:{line[1:]}", file=sys.stderr)
        return 0
    recovery = RecoveryPass([Path(t) for t in targets])  # nothing written; each timeline dropped once diagnosed
    with progress("recovering") as tick:
        recovery.progress = tick
        for _ in recovery.tables():
            pass
    meta = recovery.finish()
    if args.json:
        return _json(meta)
    sys.stdout.write(_shown(printable(bundle_summary(meta))))
    return 0


def _shown(markdown: str) -> str:
    """Bold headings and cause on a terminal; the Markdown as it is anywhere else."""
    return colour_markdown(as_text(markdown)) if colour_on() else markdown


def _json(meta: dict[str, object]) -> int:
    """The metadata as JSON: every control character in it escaped (it reaches a terminal too)."""
    sys.stdout.write(json.dumps(meta, indent=1, default=str) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox summary", argv)
