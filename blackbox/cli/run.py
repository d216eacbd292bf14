"""Run a command with blackbox armed in every Python process, then recover and diagnose what it left."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import own_process, standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="D",
        help="folder for the run folders (default: $BLACKBOX_DIR or /var/tmp/blackbox-<uid>); each run gets "
        "a fresh run-<UTC time>-XXXX inside it, with rings/ and bundle/",
    )
    parser.add_argument("--quiet", action="store_true", help="do not print the summary")
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the job to run")


def run(args: argparse.Namespace) -> int:
    from .._errors import BlackboxError
    from ..ring.writer import NO_C_EXTENSION, NO_C_SAID_ENV, built_module
    from ..run.launcher import end_like, launch, prepare, work_folder

    command = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not command:
        raise BlackboxError("expected a command after `--` (blackbox run -- python train.py ...), found none")
    work = work_folder(args.dir)
    rings, boot = prepare(work)
    say(f"rings in {rings}/")
    if built_module() is None:  # said once here, not by each of the job's processes
        say(f"warning: {NO_C_EXTENSION}")
        os.environ[NO_C_SAID_ENV] = "1"
    ended = launch(command, rings, boot)
    recover(rings, work / "bundle", ended.status, args.quiet)  # never raises: the job's status is what we return
    return end_like(ended)


def say(text: str) -> None:
    """One line on stderr: stdout is the job's."""
    print(f"blackbox run: {text}", file=sys.stderr, flush=True)


def recover(rings: Path, bundle: Path, status: int, quiet: bool) -> dict[str, Any] | None:
    """Recover every ring the job left into ``bundle`` and say what killed it (on stderr)."""
    try:
        from .._postmortem import write_postmortem
        from ..recovery.bundle import SUMMARY
        from ..run.torchelastic import write_error_file

        if not any(rings.glob("*.ring")):
            why = "not a Python job, run with -S or -I, or not armed: see above"
            say(f"exit status {status}; the job left no ring in {rings}/ ({why})")
            return None
        own_process()  # the job has ended: the launcher's memory is now the recovery's
        meta = write_postmortem([rings], bundle, exit_status=status, launcher_pid=os.getpid())
        death = meta.get("first_death") or meta.get("death") or {}
        say(f"exit status {status}; cause: {meta['cause']}; {death.get('headline', '')} bundle in {bundle}/")
        if write_error_file(meta, status, bundle):
            say("the verdict is in torchrun's error file (its Root Cause table)")
        if not quiet:
            sys.stderr.write((bundle / SUMMARY).read_text())
        return meta
    except Exception as exc:  # recovery must never change how the job ended
        say(f"exit status {status}; recovery failed ({type(exc).__name__}: {exc}); the rings are in {rings}/")
        return None


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox run", argv)
