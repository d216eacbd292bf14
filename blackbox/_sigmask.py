"""A thread's signal mask, changed for a while and put back: while arming, and while blackbox's threads run the job's
code.

Arming holds the signals it records (``collect.signals.held_while_arming``): one that comes meanwhile is delivered
once the handler is in place. The threads arming starts (the sampler, and the alerts' thread it starts in turn)
inherit that mask and keep it, so a signal sent to the job never lands on them: the kernel gives it to the job's
own threads, or leaves it pending where they all block it (a job that waits for it with ``sigwait``), as unarmed.
Where such a thread runs the job's own code (an ``on_alert`` callback), it lets those signals through meanwhile: a
process the callback started inherited them blocked, and outlived its ``terminate()``. (A finalizer of the job's
that the collector runs on the sampler thread still has them blocked: noted.) numpy's BLAS threads start as numpy
loads, with the loading thread's mask. Where ``blackbox run`` arms a multiprocessing or torch.compile helper at
start-up, its import of numpy comes before the helper's code, and the bootstrap holds these signals from before it
(``run.bootstrap.HELD``): a signal sent while the helper arms (a Pool's teardown) goes to the handler once it is
in, not to a BLAS thread, whose default action ended the process with nothing recorded. In the job's own process
the BLAS threads keep the mask they have unarmed: a job that blocks SIGTERM for a critical section after loading
numpy dies of it at once, armed as unarmed. There a signal sent while ``arm()`` runs, or in the few system calls
between the release of the handler at exit and the arming of the exit record's slots, can still be taken by a BLAS
thread and end the process unrecorded; and a job that never loads numpy itself and blocks SIGTERM to ``sigwait()``
for it loses it to a BLAS thread that blackbox's import started (carried).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def _changed(how: int, signals: Iterable[int]) -> Iterator[None]:
    """The calling thread's mask changed by ``how`` (SIG_BLOCK, SIG_UNBLOCK) while the block runs, then put back as
    it was (nothing changed where masks cannot be set on this platform)."""
    try:
        old = signal.pthread_sigmask(how, signals)
    except (AttributeError, OSError, ValueError):
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def numbers(names: Iterable[str]) -> list[int]:
    """The named signals this platform has, as numbers."""
    return [getattr(signal, name) for name in names if hasattr(signal, name)]


def block(signals: Iterable[int]) -> set[int | signal.Signals] | None:
    """``signals`` blocked on the calling thread until ``restore``; returns the mask to put back (None where masks
    cannot be set: nothing was changed). For a hold that spans steps a ``with`` cannot."""
    try:
        return signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    except (AttributeError, OSError, ValueError):
        return None


def restore(mask: set[int | signal.Signals] | None) -> None:
    """The calling thread's mask put back as ``block`` found it (a signal that came meanwhile is delivered now)."""
    if mask is not None:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def held(signals: Iterable[int]) -> contextlib.AbstractContextManager[None]:
    """``signals`` blocked on the calling thread while the block runs; the thread's mask is then put back as it
    was (a signal the job blocked stays blocked; one that came meanwhile is delivered then, a moment late)."""
    return _changed(signal.SIG_BLOCK, signals)


def let_through(names: Iterable[str]) -> contextlib.AbstractContextManager[None]:
    """The named signals unblocked on one of blackbox's threads while it runs the job's code (a process or a
    thread that code starts inherits the mask), then its mask put back."""
    return _changed(signal.SIG_UNBLOCK, numbers(names))
