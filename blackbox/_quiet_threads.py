"""The threads blackbox makes in a job take none of the job's signals.

The kernel gives a signal sent to a process to its main thread, or, where that thread blocks it, to any other
thread that does not; where every thread blocks it, it stays pending (a job that waits for it with ``sigwait``).
A thread of blackbox's that did not block it would take it in the job's place, and the recorder's handler would
hand it on to the default action there: the job died of a SIGTERM its ``sigwait`` waited for. So blackbox's own
threads (the sampler, the alerts') block every signal but a fault's as they start, and so do the threads that
numpy's BLAS (OpenBLAS) starts as it loads, where blackbox is the first to load it (``blackbox run`` arms the job
before its code runs): made with that mask, they keep it. A thread made later by the job is the job's, as unarmed.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Iterator

# Raised for the thread that faulted (blocked, the kernel kills the process), and the two that cannot be blocked.
_KEPT = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS", "SIGKILL", "SIGSTOP")


def _blocked() -> set[signal.Signals]:
    return set(signal.valid_signals()) - {getattr(signal, name) for name in _KEPT if hasattr(signal, name)}


def keep_off_this_thread() -> None:
    """Block, on the calling thread (one of blackbox's own), every signal but a fault's, for good."""
    with contextlib.suppress(AttributeError, OSError, ValueError):  # (no pthread_sigmask on this platform)
        signal.pthread_sigmask(signal.SIG_BLOCK, _blocked())


@contextlib.contextmanager
def held(signals: Iterable[int]) -> Iterator[None]:
    """``signals`` blocked on the calling thread while the block runs; the thread's mask is then put back as it
    was (a signal the job blocked stays blocked; one that came meanwhile is delivered then, a moment late)."""
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    except (AttributeError, OSError, ValueError):  # (no pthread_sigmask on this platform)
        yield
        return
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def threads_kept_off() -> contextlib.AbstractContextManager[None]:
    """While the calling thread loads what starts threads of its own (numpy's BLAS), every signal but a fault's
    is held on it, so that those threads are made blocking them."""
    return held(_blocked())
