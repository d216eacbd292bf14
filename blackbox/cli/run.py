"""Run a command with blackbox armed in every Python process, then recover and diagnose what it left."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="D",
        help="folder for this run's rings and bundle (default: $BLACKBOX_DIR or /var/tmp/blackbox-<uid>, "
        "then run-<UTC time>-<pid>)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not print the summary")
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the job to run")


def run(args: argparse.Namespace) -> int:
    from .._errors import BlackboxError
    from ..run.launcher import run as run_job
    from ..run.launcher import summary_text, work_folder

    command = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not command:
        raise BlackboxError("expected a command after `--` (blackbox run -- python train.py ...), found none")
    result = run_job(command, work_folder(args.dir))
    if result.meta is not None:
        death = result.meta.get("death") or (result.meta.get("first_death") or {})
        print(
            f"blackbox run: exit status {result.status}; cause: {death.get('cause', 'n/a')}; "
            f"bundle in {result.bundle}/",
            file=sys.stderr,
        )
        if not args.quiet:
            sys.stdout.write(summary_text(result))
    return result.status


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox run", argv)
