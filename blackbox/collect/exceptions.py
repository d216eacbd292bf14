"""Exceptions and exits into the ring: chained excepthooks, ``sys.exit`` and ``capture_oom``.

``sys.excepthook`` and ``threading.excepthook`` are wrapped, not replaced: the
wrapper writes one ``oom`` or ``exception`` event (an uncaught
``KeyboardInterrupt`` too: it tells an interrupt from a clean exit) and then
calls the hook that was there before, so the user's traceback still prints and
the exit status is unchanged. It calls it even where the job's own signal
handler raised while the event was written (the job's stack is gone by then, so
nothing of the job's could catch that exception): the job's report prints
whole, then the handler's exception, as one Python could not propagate. Where
the C extension is built, ``sys.excepthook`` is a C function (``chain_excepthook``)
calling the recording and then the hook before it: a Python hook's first
instruction runs a pending handler outside any try, and a handler that raised
there made Python print "Error in sys.excepthook" and the job's own report as
"Original exception".
``sys.exit`` is wrapped the same way: called from the main thread, it writes an
``exit`` event with the status the process will exit with (detail ``sys.exit``:
the job may still catch the SystemExit), then raises exactly what it would
have; not once Python has begun to end (threading's shutdown, the exit
handlers), where a SystemExit is reported and the status stays what it was.
``os._exit`` too, from any thread (detail ``os._exit``: it ends the process at
once, running no exit handler, so the ring has no clean end but still says the
process chose to exit, and with what status); it then calls the real one, with
the same arguments. An exception is recorded once, but one that ``capture_oom``
recorded and that then goes uncaught is recorded again as uncaught (detail
``uncaught; capture_oom: ...``): the job died of it. Each record names where
the exception was raised (``raised_at``: its traceback, folded). Statuses are
recorded as a parent sees them (the low 8 bits).
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any

from .._fds import OwnedFd
from .._jobsignal import raised_by_signal_handler
from ..ring import format as fmt
from ..ring.writer import NO_C_EXTENSION, RingWriter, built_module
from .identity import start_method
from .oom import classify
from .stacks import OWN_CODE, frame_text

KIND_OOM = fmt.KIND_CODES["oom"]
KIND_EXCEPTION = fmt.KIND_CODES["exception"]
KIND_EXIT = fmt.KIND_CODES["exit"]
MAX_DETAIL = 512
CAPTURED = "capture_oom:"  # the detail of an exception capture_oom recorded begins so
MAX_TRACEBACK = 1 << 20  # frames walked at most
MAX_DEPTH = fmt.MAX_STACK_DEPTH  # innermost frames kept
KEPT_OUTERMOST = 4  # frames kept from the outer end of a traceback cut to fit a string

Event = Callable[..., int]
Intern = Callable[[Any], int]


def report_late(exc: BaseException) -> None:
    """The exception a job's signal handler raised while an excepthook recorded, reported after the job's own
    report as Python reports one that cannot propagate (unarmed, the handler would have run after the C
    excepthook, at Python's shutdown: "Exception ignored in: <module 'threading'>"), its traceback from the
    handler's frame on (blackbox's frames below it are not the job's). Never raises."""
    try:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename.startswith(OWN_CODE):
            tb = tb.tb_next
        sys.stderr.write("Exception ignored in a signal handler that ran as the exception above was reported:\n")
        traceback.print_exception(type(exc), exc, tb, file=sys.stderr)
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 (stderr closed: nothing to report to)
        pass


def raised_at(exc: BaseException) -> str | None:
    """Where ``exc`` was raised: its traceback folded as a stack sample's (``function (file:line)``, outermost
    first, joined by ``;``), blackbox's own frames left out; None where it has none. Where it is longer than a
    string may be (fmt.MAX_STRING_BYTES), the middle frames go (a placeholder says how many): the innermost say
    where it was raised, the outermost which line of the job's own led there (a Trainer's ``train()``)."""
    outer: list[Any] = []
    inner: deque[Any] = deque(maxlen=MAX_DEPTH)
    tb, seen = exc.__traceback__, 0
    while tb is not None and seen < MAX_TRACEBACK:  # (a RecursionError's holds as many as the limit allows)
        if not tb.tb_frame.f_code.co_filename.startswith(OWN_CODE):
            (outer if len(outer) < KEPT_OUTERMOST else inner).append((tb.tb_frame.f_code, tb.tb_lineno))
            seen += 1
        tb = tb.tb_next
    texts = [frame_text(code, line) for code, line in [*outer, *inner]]  # UTF-8, each at most MAX_FRAME_BYTES
    n = len(outer)
    kept, room = len(texts), fmt.MAX_STRING_BYTES - 64 - sum(len(t) + 1 for t in texts[:n])
    for i in range(len(texts) - 1, n - 1, -1):  # innermost first, while they fit
        room -= len(texts[i]) + 1
        if room < 0:
            break
        kept = i
    cut = seen - n - (len(texts) - kept)
    gap = [fmt.FRAMES_LEFT_OUT.format(cut).encode()] if cut else []
    return b";".join([*texts[:n], *gap, *texts[kept:]]).decode("utf-8", "replace") or None


def _where(exc: BaseException) -> str | None:
    """``raised_at``, or None where reading the traceback failed: the event is written all the same."""
    try:
        return raised_at(exc)
    except Exception as err:
        if raised_by_signal_handler(err):  # the job's handler ran meanwhile: its exception is the job's
            raise
        return None


def _then(late: BaseException | None, prev: Callable[..., Any], *args: Any) -> Any:
    """The hook that was there before, then what the job's handler raised meanwhile (``report_late``)."""
    try:
        return prev(*args)
    finally:
        if late is not None:
            report_late(late)


class ExceptionRecorder:
    """Writes exception events for one Recorder and owns its excepthook wrappers."""

    def __init__(self, event: Event, intern: Intern) -> None:
        self._event = event
        self._intern = intern
        self._recent: deque[tuple[BaseException, str]] = deque(maxlen=32)  # recorded, with their details
        self._sys_hook: Any = None
        self._thread_hook: Any = None
        self._prev_sys: Any = None
        self._prev_thread: Any = None
        self._prev_exit: Any = None
        self._our_exit: Any = None
        self._prev_os_exit: Any = None
        self._our_os_exit: Any = None
        self.failed = False  # an uncaught exception in the main thread, or an exit with a nonzero status
        self._hook_replaced = False  # the job's excepthook replaced ours (seen as the hooks were put back)

    def record(self, exc: BaseException, detail: str) -> str:
        """Write the event; returns its kind (``oom`` or ``exception``), or "" if already recorded."""
        try:
            priors = [d for e, d in self._recent if e is exc]
            if priors:  # recorded once; again only where one that capture_oom recorded (alone) goes uncaught
                if not (detail.startswith("uncaught") and all(p.startswith(CAPTURED) for p in priors)):
                    return ""
                detail = f"{detail}; {priors[0]}"
            self._recent.append((exc, detail))
            kind, label, wrapper = classify(exc)
            if wrapper:
                detail = f"{detail}; raised as {wrapper}"
            code = KIND_OOM if kind == "oom" else KIND_EXCEPTION
            sid, at = self._intern(detail[:MAX_DETAIL]), self._intern(_where(exc))
            self._event(code, label, None, -1, (sid, fmt.NULL, fmt.NULL, at) if code == KIND_OOM else (sid, at))
            return kind
        except Exception as err:
            if raised_by_signal_handler(err):  # the job's handler ran meanwhile: its exception is the job's
                if self._recent and self._recent[-1][0] is exc:
                    self._recent.pop()  # not recorded: a second try may record it
                raise
            return ""

    def _record_uncaught(self, exc: BaseException, detail: str) -> BaseException | None:
        """Record an uncaught exception from an excepthook (tried again once where the job's signal handler
        raised meanwhile); returns what the handler raised (record re-raises only that, and KeyboardInterrupt
        or SystemExit), else None. In an excepthook the job's stack is gone: nothing of the job's can catch
        it, and it must not keep the job's own report from printing (Python would then print "Error in
        sys.excepthook")."""
        late = None
        for _ in range(2):  # the handler has run once it raised: a second try records what the first could not
            try:
                self.record(exc, detail)
                break
            except BaseException as err:  # noqa: BLE001 (a handler's SystemExit or KeyboardInterrupt too)
                late = late or err
        return late

    def install(self) -> None:
        prev_sys, prev_thread = sys.excepthook, threading.excepthook

        def record_sys(et: type[BaseException], ev: BaseException, tb: TracebackType | None) -> Any:
            if ev is not None and not isinstance(ev, SystemExit):
                self.failed = True
                return self._record_uncaught(ev, "uncaught")
            return None

        def sys_hook(et: type[BaseException], ev: BaseException, tb: TracebackType | None) -> Any:
            return _then(record_sys(et, ev, tb), prev_sys, et, ev, tb)

        def thread_hook(args: Any) -> Any:
            ev, late = args.exc_value, None
            if ev is not None and not isinstance(ev, SystemExit):
                name = getattr(args.thread, "name", None) or "?"
                late = self._record_uncaught(ev, f"uncaught in thread {name}")
            return _then(late, prev_thread, args)

        chain = getattr(built_module(), "chain_excepthook", None)  # (in C: module docstring, "the hook's entry")
        hook = chain(record_sys, prev_sys, report_late) if chain is not None else sys_hook
        self._prev_sys, self._prev_thread = prev_sys, prev_thread
        self._sys_hook, self._thread_hook = hook, thread_hook
        sys.excepthook = hook
        threading.excepthook = thread_hook
        self._wrap_exit()

    def _wrap_exit(self) -> None:
        for how in (fmt.EXIT_SYS, fmt.EXIT_OS):  # interned now: an exit from a signal handler takes no lock
            self._intern(how)
        original = sys.exit

        @functools.wraps(original)
        def exit(*args: Any, **kwargs: Any) -> Any:  # the arguments as given: sys.exit(status=3) is a TypeError
            if len(args) <= 1 and not kwargs and threading.current_thread() is threading.main_thread() \
                    and not getattr(threading, "_SHUTTING_DOWN", False):  # the status is fixed once Python ends
                self._exiting_in_a_handler(args[0] if args else None, sys._getframe(1))
                self.record_exit(args[0] if args else None)
            return original(*args, **kwargs)

        self._prev_exit, self._our_exit = original, exit
        sys.exit = exit
        original_os = os._exit

        @functools.wraps(original_os)
        def _exit(*args: Any, **kwargs: Any) -> Any:
            status = args[0] if len(args) == 1 and not kwargs else kwargs.get("status")
            if isinstance(status, int) and -(1 << 31) <= status < 1 << 31:  # else the real one raises: no end
                self.record_exit(status, fmt.EXIT_OS)
            return original_os(*args, **kwargs)

        self._prev_os_exit, self._our_os_exit = original_os, _exit
        os._exit = _exit

    def _exiting_in_a_handler(self, status: Any, caller: Any) -> None:
        """``sys.exit`` with a failing status inside an ``except`` block: the exception it handles is what the
        process dies of (``except Exception: log(...); sys.exit(1)``, torch.multiprocessing.spawn's workers),
        recorded as such before the exit. Only where the frame that calls ``sys.exit`` is the one that caught
        it (not a signal handler that ran during a back-off's ``except``, nor argparse's ``error()``), and no
        KeyboardInterrupt is behind it (a caught Ctrl-C is told apart)."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, Exception) or status is None or status == 0:
            return
        tb = exc.__traceback__
        if tb is None or tb.tb_frame is not caller:
            return
        seen, link = 0, exc.__context__
        while link is not None and seen < 16:
            if isinstance(link, KeyboardInterrupt):
                return
            link, seen = link.__context__, seen + 1
        code = status & 0xFF if isinstance(status, int) else 1
        if code:
            self.failed = True
            self.record(exc, fmt.HANDLED_EXIT.format(code))

    def in_flight(self, exc: BaseException | None) -> None:
        """The exception going by as the recording ends at exit: a multiprocessing worker's target that
        raised (its finalizers, which disarm, run while it goes by; it then exits 1 by ``os._exit``, and
        no excepthook sees it) is recorded as uncaught; a SystemExit counts by its status."""
        if isinstance(exc, SystemExit):
            code = exc.code
            self.failed = self.failed or not (code is None or (isinstance(code, int) and code & 0xFF == 0))
        elif exc is not None:
            self.failed = True
            self.record(exc, "uncaught")
        elif self._hook_replaced and not hasattr(sys, "ps1"):
            self._uncaught_past_the_hook()

    def _uncaught_past_the_hook(self) -> None:
        """The job's own ``sys.excepthook``, set after ours and never calling it (a logging setup's), took
        the main thread's uncaught exception: Python sets ``sys.last_exc`` (``last_value`` before 3.12) just
        before it calls the hook. Others may set it too (``code.InteractiveInterpreter``, ``pdb.pm()`` users):
        recovery takes it as the death only where the process then exits with a failing status."""
        last = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if isinstance(last, BaseException) and not isinstance(last, SystemExit):
            self.record(last, fmt.LAST_EXC)

    def record_exit(self, status: Any, how: str = fmt.EXIT_SYS) -> None:
        """An ``exit`` event: the status the process exits with (a non-int status prints and exits 1),
        as its parent will see it (the low 8 bits); ``how`` is its detail."""
        code = 0 if status is None else status & 0xFF if isinstance(status, int) else 1
        self.failed = self.failed or code != 0
        try:
            detail = (self._intern(how),)
            if status is None or isinstance(status, int):
                self._event(KIND_EXIT, None, int(status or 0) & 0xFF, -1, detail)
            else:
                self._event(KIND_EXIT, str(status)[:MAX_DETAIL], 1, -1, detail)
        except Exception as exc:
            if raised_by_signal_handler(exc):
                raise

    def uninstall(self) -> None:
        """Put the previous hooks back, where ours are still the ones installed."""
        self._hook_replaced = self._sys_hook is not None and sys.excepthook is not self._sys_hook
        if self._sys_hook is not None and sys.excepthook is self._sys_hook:
            sys.excepthook = self._prev_sys
        if self._thread_hook is not None and threading.excepthook is self._thread_hook:
            threading.excepthook = self._prev_thread
        if self._our_exit is not None and sys.exit is self._our_exit:
            sys.exit = self._prev_exit
        if self._our_os_exit is not None and os._exit is self._our_os_exit:
            os._exit = self._prev_os_exit
        self._sys_hook = self._thread_hook = self._our_exit = self._our_os_exit = None


def format_context(context: str, metadata: dict[str, Any]) -> str:
    """``capture_oom: CONTEXT k=v ...`` (the detail of a captured exception)."""
    parts = [f"{CAPTURED} {context}"] + [
        f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in metadata.items()
    ]
    return " ".join(parts)


@contextmanager
def capture(recorder: Callable[[], ExceptionRecorder | None], context: str, metadata: dict[str, Any]) -> Iterator[None]:
    """Record an exception raised inside the block (kind ``oom`` or ``exception``), then re-raise it."""
    try:
        yield
    except BaseException as exc:
        if not isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
            rec = recorder()
            if rec is not None:
                rec.record(exc, format_context(context, metadata))
        raise


EXIT_TAG = fmt.tag(0, KIND_EXIT, fmt.FLAG_VALUE, -1)
NO_EXIT_RECORD = ("the status of an exit that never calls sys.exit (a top-level `raise SystemExit(n)`, "
                  "a caught sys.exit, the end of the script) is not recorded: {}")  # fmt: skip


def exit_status_unrecorded(cmod: Any) -> str:
    """Why the process's exit status cannot be written at exit() (a note), or "" where it can."""
    if cmod is None:
        return NO_C_EXTENSION  # says this, and what else goes unrecorded
    if not getattr(cmod, "EXIT_RECORD", 0):
        return NO_EXIT_RECORD.format("this C library has no on_exit()")
    return ""


def record_status_at_exit(
    cmod: Any, fd: int, header: fmt.Header, last_seq: int, step: int, intern: Intern, fold: tuple[bytes, ...] = ()
) -> None:
    """Have the C extension write the process's real exit status, as one last ``exit`` record (detail
    ``process exit``), from inside libc's exit(): after the interpreter has finished, where no Python
    code sees the status. ``last_seq``: the ring's last seq, once nothing else writes to it; ``fd``: the
    ring, open read-write (the extension maps the slot's page itself). ``fold``: (folded.jsonl's path,
    the line, the ring's path): a status of 0 appends the line and removes the ring instead. Raises where
    it cannot."""
    if exit_status_unrecorded(cmod):
        return
    cmod.exit_record_arm(fd, header.records_offset, header.capacity, last_seq + 1, EXIT_TAG, step,
                         intern(fmt.EXIT_PROCESS), *fold)  # fmt: skip


def follow_worker_exception(in_flight: Callable[[BaseException | None], None]) -> None:
    """In a multiprocessing child whose ``Process._bootstrap`` no longer runs its finalizers while the target's
    exception goes by (3.13+: they run at its ``atexit``, after it printed the exception and returned 1, so
    the disarm among them saw nothing and the worker read as ended cleanly, then folded away):
    ``traceback.print_exc``, which ``_bootstrap`` calls inside its ``except``, is wrapped in this process, and
    called from ``_bootstrap`` hands the exception to ``in_flight`` first. It prints what it printed: the
    traceback is the exception's, not the caller's, so the wrapper's frame is in neither."""
    import traceback

    process = sys.modules.get("multiprocessing.process")
    if process is None or start_method() is None or getattr(traceback.print_exc, "_blackbox", False):
        return  # (a spawn child arms before its Process is known: its command line says what it is)
    bootstrap = process.BaseProcess._bootstrap.__code__
    if "_exit_function" in bootstrap.co_names:  # (before 3.13: the disarm sees it go by, ``in_flight``)
        return
    original = traceback.print_exc

    @functools.wraps(original)
    def print_exc(*args: Any, **kwargs: Any) -> Any:
        try:
            if sys._getframe(1).f_code is bootstrap:
                in_flight(sys.exc_info()[1])
        except Exception:  # (never the job's: an exception of ours, and the traceback is printed regardless)
            pass
        return original(*args, **kwargs)

    print_exc._blackbox = True  # type: ignore[attr-defined]
    traceback.print_exc = print_exc


def ends_by_os_exit() -> bool:
    """This process is a multiprocessing child started by fork or forkserver: after its finalizers (which
    disarm) it ends with ``os._exit``, never reaching libc's exit(). A spawn child ends by ``sys.exit``."""
    process = sys.modules.get("multiprocessing.process")
    try:
        if process is None or process.parent_process() is None:
            return False
        method = getattr(process.current_process(), "_start_method", None)
        if method is None:  # a Process of the default context
            method = sys.modules["multiprocessing"].get_start_method(allow_none=True)
        return bool(method != "spawn")
    except Exception:
        return False


def exit_record_possible(fd: OwnedFd, writer: RingWriter | None) -> bool:
    """The process's exit status can be written at exit() (``record_status_at_exit``), and will be unless
    it is killed first: the extension is built with on_exit(), its seq counter is the ring's, the ring's
    descriptor is still ours (the job may have closed it), and the process ends through libc's exit()."""
    if exit_status_unrecorded(built_module()) or writer is None or writer.sequence is None:
        return False
    return fd.intact() and not ends_by_os_exit()
