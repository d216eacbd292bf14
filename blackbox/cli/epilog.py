"""Recover the rings one Slurm job left on this node, from Slurm's epilogue, into a bundle its user can read.

Run by slurmd as the Epilog (root, no PATH, the job's id, user and restart count
in the environment). It recovers exactly that job's rings on this node (see
``run.epilog``) into ``OUT/<job id>/<host>`` (``<host>-restart<N>`` for a later
attempt of a requeued job), OUT a folder or an object-store prefix, gives a
local bundle to the job's user, and says what it did in one line. It exits 0
whatever the rings hold (none, damaged, another user's, too slow to read by
``--timeout``): an epilogue that fails drains the node. Only a call outside an
epilogue (no ``SLURM_JOB_ID``) or a bad option ends otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Iterator, Sequence
from types import FrameType

from ._common import own_process, standalone

DEFAULT_TIMEOUT_S = 120


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--out", required=True, metavar="OUT",
                        help="where bundles go: a folder, or an object-store prefix (s3://, gs://, hdfs://); "
                        "each job's at OUT/<job id>/<host>")  # fmt: skip
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"give up after SECONDS, still exiting 0 (default {DEFAULT_TIMEOUT_S})")  # fmt: skip


class _OutOfTime(BaseException):
    """Raised by the alarm: recovery took longer than --timeout."""


@contextlib.contextmanager
def _deadline(seconds: float) -> Iterator[None]:
    def expire(_sig: int, _frame: FrameType | None) -> None:
        raise _OutOfTime

    old = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, max(seconds, 0.001))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def say(job: str, text: str) -> None:
    print(f"blackbox epilog: job {job}: {text}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..run.epilog import environment

    job, uid, gid, restarts, node = environment(dict(os.environ))  # outside an epilogue: one line, exit 1
    own_process()
    started = time.monotonic()
    try:
        with _deadline(args.timeout):
            _recover(args.out, job, uid, gid, restarts, node or socket.gethostname().split(".")[0])
    except _OutOfTime:
        say(job, f"gave up after {args.timeout:g} s (--timeout); the rings are left as they were")
    except Exception as exc:  # a problem with the rings or the destination never fails the epilogue
        say(job, f"no bundle: {type(exc).__name__}: {exc}")
    say(job, f"done in {time.monotonic() - started:.1f} s")
    return 0


def _recover(out: str, job: str, uid: int, gid: int, restarts: int | None, host: str) -> None:
    from .._postmortem import write_postmortem
    from ..run.epilog import destination, find, give, make_job_folder, summary_line
    from ..run.notice import slurm_comment, verdict_line

    found = find(job, uid, restarts)  # the job's folders, held open: recovery reads through them alone
    count = found.ring_count
    try:
        for note in found.notes:
            say(job, f"not read: {note}")
        if not count:
            say(job, "no rings of this job on this host")
            return
        job_place, place = destination(out, job, host, found.attempt)
        local = "://" not in out
        if local:
            if os.path.lexists(os.path.join(place, "metadata.json")):
                say(job, f"{place}/ is there already (this attempt was recovered); left as it is")
                return
            os.makedirs(out, mode=0o755, exist_ok=True)
            made = make_job_folder(job_place)
        meta = write_postmortem(found.folders, place, owners={uid})  # only the job's user's rings
    finally:
        found.close()
    comment = slurm_comment(job, verdict_line(meta, place)) if meta.get("cause") != "clean_exit" else ""
    say(job, f"{count} rings of attempt {found.attempt}: {summary_line(meta)} bundle in {place}/"
        + (f" ({comment})" if comment else ""))  # fmt: skip
    if local:
        give(place, uid, gid)
        if made:
            give(job_place, uid, gid)


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox epilog", argv)
