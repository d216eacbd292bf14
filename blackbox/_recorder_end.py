"""How a Recorder stops: its clean end (``disarm``, at exit too), and a forked child's abandoning of the
parent's ring. Functions over the Recorder, moved out of ``_recorder.py``.

Ending never waits on itself: ``disarm()`` claims the end without blocking, so a signal handler of the
job's that calls it (or exits, and so runs it at exit) while the same thread is already inside it
returns at once.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._jobsignal import HeldForTheJob
from ._recorder_collect import uninstall_collectors
from ._sigmask import block, numbers, restore
from .collect.exceptions import exit_record_possible, record_status_at_exit
from .collect.identity import helper_name, parent_gone
from .collect.signals import ENDINGS, RECORDED
from .ring import format as fmt
from .ring.file import died_armed
from .ring.folded import FOLDED, fold_line
from .ring.writer import built_module

if TYPE_CHECKING:
    from ._recorder import Recorder


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _null_event(*_args: Any, **_kwargs: Any) -> int:
    return 0


def disarm(rec: Recorder, *, at_exit: bool) -> None:
    """Record a clean end and release the ring (``Recorder.disarm``)."""
    held = HeldForTheJob(rec._on_error)  # each step runs to its end whatever the job's signal handlers raise
    ending = False
    try:  # (the lock taken inside the try: a handler's exception right after it cannot leave it held)
        ending = rec._ending.acquire(blocking=False)
        if not ending or not rec.armed:
            return  # another caller is ending it (this very thread, from a signal handler, or another)
        held.run_all(_ending_steps(rec, held, at_exit))  # cut short before its 1st step: still armed, run again
    finally:
        if ending:
            rec._ending.release()
    held.raise_held()  # the job's own exception, now that the ring's end is written


def _ending_steps(rec: Recorder, held: HeldForTheJob, at_exit: bool) -> list[tuple[Callable[[], object], bool]]:
    """The steps of ``disarm``, each with whether it may run twice (run again if the job cut it short)."""
    ring, w, sampler, promised = rec._ring, rec._writer, rec._sampler, [False]  # promised: the exit record
    fold: list[tuple[bytes, ...]] = [()]
    mask: list[Any] = [None]

    def await_sampler() -> None:
        if sampler is not None and sampler is not threading.current_thread():
            held.wait(rec._sampled, max(1.0, 2 * rec.sample_interval))

    def rank() -> None:  # a rank that learnt its number as it joined its group, ending before a tick said it
        if rec._dist_rank is not None:  # (an mp.spawn rank raising at its first step: "1 of 3 ranks left no ring")
            rec._dist_rank.poll()

    def possible() -> None:
        promised[0] = at_exit and ring is not None and exit_record_possible(ring.fd, w)

    def in_flight() -> None:
        if at_exit and rec._exceptions is not None:
            rec._exceptions.in_flight(sys.exc_info()[1])

    def disarm_record() -> None:  # value 1: the exit record is armed (FORMAT.md, "Kinds")
        if w is not None:
            w.event(fmt.KIND_CODES["disarm"], None, 1 if promised[0] else None)

    def clean() -> None:
        if ring is not None:
            fmt.STATE_STRUCT.pack_into(ring.map.buffer, fmt.STATE_OFFSET, fmt.STATE_CLEAN)

    def exit_fold() -> None:  # what the exit record folds, learnt before the signals' release (it reads files)
        fold[0] = _exit_fold(rec) if promised[0] else ()

    def hold_late() -> None:  # from the release of the signals to the exit record's arming, a signal taken has no
        if promised[0]:  # slot: held on this thread, it comes once the slots are armed (a Pool's teardown
            mask[0] = block(numbers(RECORDED + ENDINGS))  # SIGTERMed a helper there: "killed while it shut down")

    def let_late() -> None:
        mask[0], was = None, mask[0]
        restore(was)

    def exit_record() -> None:  # armed again if cut short: the disarm record has promised it
        if promised[0]:
            _record_status_at_exit(rec, fold[0])

    def fold_sites() -> None:  # a helper to be folded keeps its largest allocation sites, read before its ring goes
        allocs, hdr = rec._allocs, rec._header
        if _foldable(rec) is not None and allocs is not None and ring is not None and hdr is not None and hdr.heap_size:
            view = ring.map.buffer[hdr.heap_offset : hdr.heap_offset + hdr.heap_size]
            try:
                rec._fold_sites = allocs.top_sites(view)
            finally:
                view.release()

    # Signals last: one that lands while the job shuts down is still recorded (after the clean end); where the
    # exit record is promised, one taken after this too, into its slots (a SIGTERM to a rank hung in teardown).
    return [(lambda: setattr(rec, "armed", False), True), (rec._stop.set, True), (await_sampler, True),
            (lambda: uninstall_collectors(rec, in_child=False, signals=False, run=held.run), False),
            (rank, True), (possible, True), (rec.sample_now, True), (in_flight, False), (disarm_record, False),
            (clean, True),
            (fold_sites, True), (exit_fold, True), (hold_late, False),
            (lambda: uninstall_collectors(rec, in_child=False, signals=True, run=held.run, keep_late=promised[0]),
             False),
            (exit_record, True), (let_late, False),
            (lambda: teardown(rec, flush=rec.sync_interval is not None), False),
            (lambda: _fold(rec, at_exit=promised[0]), False)]  # fmt: skip


def _exit_fold(rec: Recorder) -> tuple[bytes, ...]:
    """What the exit record folds where the status is 0: (folded.jsonl, the line, the ring), or () to keep it."""
    path = _foldable(rec)
    return () if path is None else (os.fsencode(path.parent / FOLDED), _line(rec), os.fsencode(path))


def _record_status_at_exit(rec: Recorder, fold: tuple[bytes, ...]) -> None:  # (a failure: one warning)
    ring, w, hdr = rec._ring, rec._writer, rec._header  # exit_record_possible said they are there
    assert ring is not None and w is not None and hdr is not None and w.sequence is not None
    record_status_at_exit(built_module(), ring.fd.fd, hdr, w.sequence.value, w.current_step(), w.intern, fold)


def _foldable(rec: Recorder) -> Path | None:
    """The ring to fold, where this is a helper under `blackbox run` whose end looks clean so far: no
    uncaught exception, no exit with a nonzero status, none in flight as it ended, no request to stop taken
    (SIGTERM, SIGINT, SIGHUP: a graceful shutdown is kept to be told), and its parent not
    dead (gone, its ring left armed: a DataLoader worker ending by itself after its main process was killed
    keeps its ring, what it held being part of that death; one ending after its parent's clean end folds)."""
    exceptions = rec._exceptions
    if not rec._fold_clean or rec.path is None or (exceptions is not None and exceptions.failed):
        return None
    if _stop_taken():  # asked to stop (SIGTERM, SIGINT, SIGHUP), it shut down by itself: a graceful end, kept
        return None
    ppid = rec._identity.get("ppid")
    died = parent_gone(rec._identity) and isinstance(ppid, int) and died_armed(rec.path.parent, ppid)
    return None if died else rec.path


def _stop_taken() -> bool:
    """The C extension's signal handler took SIGTERM, SIGINT or SIGHUP in this process (False without it)."""
    module = built_module()
    taken = getattr(module, "signals_stop_taken", None)
    return bool(taken()) if taken is not None else False


def _line(rec: Recorder) -> bytes:
    """Its folded.jsonl line, with what it ran where it is a multiprocessing child (known by now)."""
    name = helper_name()
    ident = rec._identity | ({"helper": name} if name is not None else {})
    return fold_line(ident, rec._started_ns, rec.peak_rss, rec._fold_sites)


def _fold(rec: Recorder, *, at_exit: bool) -> None:
    """A helper's clean end under `blackbox run`: one line in ``folded.jsonl``, and its ring removed. Where
    the exit record was armed (``at_exit``), libc's exit() does it once the status is known to be 0
    (``record_status_at_exit``); else it is done now, on what Python saw of the end."""
    path = None if at_exit else _foldable(rec)  # (run by disarm's HeldForTheJob: a failure is one warning)
    if path is None:
        return
    line = _line(rec)
    fd = os.open(path.parent / FOLDED, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, line)  # one write with O_APPEND: lines of helpers ending together never mix
    finally:
        os.close(fd)
    path.unlink()


def abandon_after_fork(rec: Recorder) -> None:
    """In a forked child: stop writing into the parent's ring without touching it."""
    rec.armed = False
    rec._stop.set()
    rec._sampler = None
    rec._ending = threading.Lock()  # the parent's may have been held by another thread at fork
    uninstall_collectors(rec, in_child=True, signals=True)
    uninstall_collectors(rec, in_child=True, signals=False)
    stacks, rec._stacks = rec._stacks, None
    if stacks is not None:
        stacks.close(wait=False)
    teardown(rec, flush=False)


def teardown(rec: Recorder, *, flush: bool) -> None:
    """Writing stops (the API's calls do nothing), the ring is unmapped and its descriptor closed."""
    rec.mark, rec.step, rec._event = _noop, _noop, _null_event
    stacks, rec._stacks = rec._stacks, None
    if stacks is not None:
        stacks.close()
    if rec._writer is not None:
        rec._writer.kill()
        rec._writer = None
    ring, rec._ring = rec._ring, None
    if ring is not None:
        try:
            if flush:
                ring.map.flush()
            ring.map.close()
        except (OSError, ValueError, BufferError):
            pass
        ring.fd.close()  # releases the writer's lock (only if the descriptor is still ours)
    if rec._probe is not None:
        rec._probe.close()
        rec._probe = None
