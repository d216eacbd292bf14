"""Run a command with blackbox armed in every Python process, then recover and diagnose what it left."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import one_line
from ..collect.allocs import ENV as ALLOCATIONS_ENV
from ..run import torchelastic
from ._common import own_process, standalone

if TYPE_CHECKING:
    from ..run.launcher import Ended

LEFT_NAMED = 10  # processes left running named on stderr (all of them, up to 64, in metadata.json)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="DIR",
        help="folder for the run folders (default: $BLACKBOX_DIR or /var/tmp/blackbox-<uid>); each run gets "
        "a fresh run-<UTC time>-XXXX inside it, with rings/ and bundle/; DIR and every folder above it must be "
        "changeable by no other user (sticky folders such as /tmp excepted)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not print the summary")
    what = parser.add_mutually_exclusive_group()
    what.add_argument(
        "--no-allocations",
        dest="allocations",
        action="store_false",
        default=None,
        help="do not sample allocations in the job's processes (BLACKBOX_ALLOCATIONS=0 in its environment); by "
        "default each process samples them, and summary.md says which line holds the memory (README: 'Who holds "
        "the memory')",
    )
    what.add_argument(
        "--allocations",
        dest="allocations",
        action="store_true",
        help="sample allocations by bytes in every process of the job (the default; BLACKBOX_ALLOCATIONS=1)",
    )
    parser.add_argument(
        "--alert-signal",
        metavar="SIG",
        help="send SIG (e.g. USR1, the signal Lightning and Slurm jobs checkpoint on) once to the job's main "
        "process (each rank's, under torchrun) at its first critical alert: memory past the critical level of "
        "the limit that will end it, or the forecast of the time to that limit under --alert-before; only "
        "where the job has a handler for SIG (README: 'Before the death')",
    )
    parser.add_argument("--alert-before", type=float, metavar="SECONDS",
                        help="a forecast under SECONDS is critical (default 60)")  # fmt: skip
    parser.add_argument("--alert-levels", metavar="LEVELS",
                        help="WARN,CRIT: warning and critical levels, percent of the limit (80,95)")  # fmt: skip
    parser.add_argument("--watchdog", action="store_true",
                        help="free the CUDA cache (torch.cuda.empty_cache) on a GPU fragmentation alert")  # fmt: skip
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the job to run")


def run(args: argparse.Namespace) -> int:
    from .._errors import BlackboxError
    from ..ring.retention import keep_at_arm
    from ..ring.writer import NO_C_EXTENSION, NO_C_SAID_ENV, built_module
    from ..run import snapshot
    from ..run.folder import hold_run_lock, work_folder
    from ..run.launcher import end_like, launch, prepare
    from ..run.leftovers import still_running
    from ..run.unarmed import UnarmedWatch, advice, sets_pythonpath

    command = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not command:
        raise BlackboxError("expected a command after `--` (blackbox run -- python train.py ...), found none")
    if args.allocations is not None:  # the job's environment is a copy of ours (launcher.job_environment)
        os.environ[ALLOCATIONS_ENV] = "1" if args.allocations else "0"
    alerting(args)
    work = work_folder(args.dir)
    hold_run_lock(work)  # in use while we live: no retention removes this run
    if (why := keep_at_arm(work.parent, None, new=0)) is not None:  # the oldest runs and rings beside it go
        say(f"warning: {why}")
    rings, boot = prepare(work)
    under_torchrun = torchelastic.rank() is not None
    if not under_torchrun:  # under torchrun, each rank's one line at the end names its bundle
        say(f"rings in {rings}/")
    if built_module() is None:  # said once here, not by each of the job's processes
        say(f"warning: {NO_C_EXTENSION}")
        os.environ[NO_C_SAID_ENV] = "1"

    def on_end(ended: Ended) -> None:
        if under_torchrun and ended.status != 0:
            torchelastic.note_end(work.parent, ended.end_ns)

    def outlived(job: int, asked: str) -> int | None:  # SIGKILL may follow: where the job is, written now
        rank = torchelastic.rank()
        prefix = "" if rank is None else f"rank {rank}: "
        return snapshot.start(rings, work / "bundle", job, asked, prefix, own_process)

    watch, assigned = UnarmedWatch(boot), sets_pythonpath(command)
    ended = launch(command, rings, boot, on_end, lambda: watch.scan(os.getpid()), outlived)
    count, left = still_running(os.getpid())
    name_leftovers(count, left)
    if (unarmed := advice(watch.armed_elsewhere(rings), None if any(rings.glob("*.ring")) else assigned)) is not None:
        say(f"warning: {unarmed}")
    recover(rings, work / "bundle", ended, args.quiet, left)  # never raises: the job's status is what we return
    return end_like(ended)


def alerting(args: argparse.Namespace) -> None:
    """The alert options, checked here (a bad one is this command's error, not each process's warning) and
    passed to the job's processes through its environment."""
    from .._errors import BlackboxError
    from ..collect.alert_actions import SIGNAL_ENV, WATCHDOG_ENV, alert_settings
    from ..collect.alerts import BEFORE_ENV, LEVELS_ENV

    try:
        alert_settings(True, args.alert_levels, args.alert_signal, args.alert_before, args.watchdog)
    except ValueError as exc:
        text = str(exc).replace("alert_signal", "--alert-signal").replace("alert_before", "--alert-before")
        raise BlackboxError(text.replace("alert levels", "--alert-levels")) from None
    for env, value in ((SIGNAL_ENV, args.alert_signal), (BEFORE_ENV, args.alert_before),
                       (LEVELS_ENV, args.alert_levels), (WATCHDOG_ENV, "1" if args.watchdog else None)):  # fmt: skip
        if value is not None:
            os.environ[env] = str(value)


def say(text: str) -> None:
    """One line on stderr: stdout is the job's. A stderr that is gone (a terminal hung up) changes nothing."""
    with contextlib.suppress(OSError, ValueError):
        print(f"blackbox run: {text}", file=sys.stderr, flush=True)


def account_here(ended: Ended, parent: Path) -> bool:
    """Whether this `blackbox run` prints the full account. Alone, always. Under torchrun, where every rank
    has its own `blackbox run` writing into one log, once (``run.torchelastic``): the rank that failed first,
    or rank 0 when it exited cleanly; every other rank prints its one line (cause and bundle)."""
    rank = torchelastic.rank()
    if rank is None:
        return True
    if ended.status == 0:
        return rank == "0"
    return torchelastic.first_to_fail(parent, ended.end_ns)


def name_leftovers(count: int, left: list[dict[str, Any]]) -> None:
    """Say which processes of the job are still running (they go on without it)."""
    if not count:
        return
    say(f"{count} process{'es' if count > 1 else ''} of the job still running after it ended (not signalled):")
    for p in left[:LEFT_NAMED]:
        say(f"  pid {p['pid']}: {one_line(p['command'])}")  # a command line may hold terminal escapes
    if count > LEFT_NAMED:
        say(f"  and {count - LEFT_NAMED} more (metadata.json lists up to {len(left)})")


def no_ring(status: int, rings: Path) -> str:
    """What to say when no ring is left to recover: the job's own process is not Python (or not armed), and
    its Python helpers either never armed or ended cleanly and were folded into one line each."""
    from ..ring.folded import read_folded

    folded = len(read_folded(rings))
    why = "is not Python, ran with -S or -I, or could not arm: see above"
    if folded:
        return (f"exit status {status}; the job's own process left no ring (it {why}); {folded} Python "
                f"process{'es' if folded > 1 else ''} of the job ended cleanly and {'were' if folded > 1 else 'was'} "
                f"recorded, one line each, in {rings}/folded.jsonl")  # fmt: skip
    return (f"exit status {status}; the job left no ring in {rings}/ (its own process {why}; its other "
            "Python processes arm once they import numpy or torch)")  # fmt: skip


def _main_ring(meta: dict[str, Any]) -> dict[str, Any]:
    """The death of the job's main process where no process died (a job of several rings ended cleanly); of
    several main processes (ranks, a restarted attempt's), the job's clean end."""
    rings = [r for r in meta.get("rings") or () if isinstance(r, dict) and r.get("role") == "main"]
    death = rings[0].get("death") if len(rings) == 1 else None
    if isinstance(death, dict):
        return death
    if meta.get("cause") != "clean_exit":
        return {}
    attempts = [a for a in meta.get("attempts") or () if isinstance(a, dict)]
    failed = [a for a in attempts if a.get("cause") not in (None, "clean_exit")]
    if not failed:
        return {"headline": "Every process of the job ended cleanly."}
    last, first = failed[-1], failed[-1].get("first_death") or {}
    where = ", ".join(f"{k} {first[k]}" for k in ("rank", "step") if first.get(k) is not None)
    return {"headline": f"Every process of the last attempt ({len(attempts)} of {len(attempts)}) ended cleanly; "
            f"attempt {last.get('attempt')} ended in {last.get('cause')}{f' ({where})' if where else ''}: "
            f"{first.get('headline') or 'see the Attempts section'}"}  # fmt: skip


def recover(rings: Path, bundle: Path, ended: Ended, quiet: bool, left: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Recover every ring the job left into ``bundle`` and say what killed it (on stderr)."""
    status = ended.status
    try:
        from .._postmortem import write_postmortem
        from ..recovery.bundle import SUMMARY
        from ..run.notice import slurm_comment, termination_message, verdict_line
        from ..views.summary import SHELLS_STATUS
        from ..views.text import as_text

        rank = torchelastic.rank()
        of_rank = "" if rank is None else f"rank {rank}: "
        if not any(rings.glob("*.ring")):
            say(of_rank + no_ring(status, rings))
            return None
        own_process()  # the job has ended: the launcher's memory is now the recovery's
        extra = {"left_running": left} if left else None
        meta = write_postmortem([rings], bundle, exit_status=status, launcher_pid=os.getpid(),
                                job_pid=ended.pid or None, extra=extra)  # fmt: skip
        death = meta.get("first_death") or meta.get("death") or _main_ring(meta)
        headline = one_line(str(death.get("headline") or ""))  # the job's own text (an exception message)
        line = f"exit status {status}; cause: {meta['cause']}; {headline} bundle in {bundle}/"
        if status != 0 and meta["cause"] == "clean_exit":  # the status is no ring's: a shell's, say
            line = f"exit status {status}, the job's {SHELLS_STATUS}. bundle in {bundle}/"
        elif death.get("alive"):  # a process of the job left running: its ring is a snapshot, no death
            line = f"exit status {status}; {headline} bundle in {bundle}/"
        elif status == 0 and meta["cause"] != "clean_exit":  # the job outlived it: not the job's cause
            line = (f"exit status 0: the job ended cleanly; a process of it died before: {meta['cause']}; "
                    f"{headline} bundle in {bundle}/")  # fmt: skip
        if torchelastic.write_error_file(meta, status, bundle):
            line += " (the verdict is in torchrun's error file: its Root Cause table)"
        died = meta["cause"] != "clean_exit"
        if died or ended.snapshot:  # (the end's verdict replaces a snapshot's message)
            verdict = verdict_line(meta, str(bundle))
            if written := termination_message(verdict):
                line += f" (and in {written}, the pod's termination message)"
            if died and os.environ.get("SLURM_JOB_ID", "").isdigit() and account_here(ended, bundle.parent.parent):
                line += f" ({slurm_comment(os.environ['SLURM_JOB_ID'], verdict)})"
        say(of_rank + line)
        if not quiet and account_here(ended, bundle.parent.parent):
            with contextlib.suppress(OSError, ValueError):
                sys.stderr.write(as_text((bundle / SUMMARY).read_text()))  # a log, read as text
                sys.stderr.flush()
        return meta
    except Exception as exc:  # recovery must never change how the job ended
        say(f"exit status {status}; recovery failed ({type(exc).__name__}: {exc}); the rings are in {rings}/")
        return None


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox run", argv)
