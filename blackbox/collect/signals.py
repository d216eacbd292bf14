"""Signals and native crashes, recorded without changing how the job handles either.

Signals (SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2; and ``ENDINGS``, SIGQUIT, SIGALRM,
SIGXCPU, SIGVTALRM, SIGPROF and SIGPIPE, only while their default action is in force) are recorded by the C
extension's async-signal-safe handler (``ring/_cwriter.c``), installed at the
OS level over whatever disposition the process has, never over ``SIG_IGN``. It
writes one ``signal`` record and hands the signal on: to the job's handler, or,
for ``SIG_DFL``, by raising it again with the default action at once (also
while the main thread is blocked in C). Python's handler table is not touched,
so ``signal.getsignal()`` answers what it would without blackbox and a
framework that installs its handler later, chaining "the previous one if
callable", behaves as it would unarmed. When the job installs a handler after
arm, Python replaces ours at the OS level: ``signal.signal`` is wrapped (it
returns and raises exactly what it would) so the new handler is wrapped again at
once, and ``watch()`` (each sampler tick) catches code that bound the original
``signal.signal`` before arm. Where the extension is not built, nothing is
installed: ``collect.death_signals`` has faulthandler record the signals that
end the process (``SignalRecorder`` hands every call to it), and no others;
``signal.signal`` is still wrapped, so that a handler the job installs after arm
is known as the job's (its exception raised inside blackbox's code is the job's).

Native crashes (SIGSEGV, SIGFPE, SIGABRT, SIGBUS, SIGILL): ``faulthandler``
writes every thread's traceback into the ring's crash region (version 3), so a
crash survives in the ring itself and a SIGKILL leaves no sidecar file behind.
A job that enabled faulthandler itself, before or after arm, keeps its own
(``PYTHONFAULTHANDLER=1`` on many clusters): its tracebacks go where it sent
them. Either way the C handler records those signals too (``CRASHES``),
wrapped over faulthandler, which it calls next: the ring says which signal the
process died of, when, and at which address. Over blackbox's own faulthandler,
a fault the kernel raised then goes back to the kernel, which delivers it as it
does unarmed (its log line, a core with the fault's siginfo): ``_cwriter.c``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import functools
import io
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .._fds import OwnedFd
from .._jobsignal import raised_by_signal_handler, remember_handler, remember_handlers
from .._sigmask import held, numbers
from ..ring import format as fmt
from .death_signals import DeathSignals, os_handler
from .identity import stands_in_for_init

KIND_SIGNAL = fmt.KIND_CODES["signal"]
RECORDED = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
# Native crashes, recorded by the same handler over faulthandler, ours or the job's (PYTHONFAULTHANDLER=1 or
# faulthandler.enable(), before or after arm: its traceback goes where the job sent it): the record says when
# and of which signal the process died, and for a fault the kernel raised, at which address
CRASHES = ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT")
# Signals whose default action ends the process and that a job seldom means to die of (Ctrl-\, an alarm() left
# unhandled, the CPU-time limit of `ulimit -t`, a profiler's timer that outlived its handler): recorded only while
# that default action is in force (SIGPIPE: a write to a pipe whose reader had gone, where the job put back the
# default action Python sets aside, as `| head` scripts do). Over a handler (the job's SIGALRM timeout, a
# profiler's SIGPROF firing a thousand times a second) or SIG_IGN nothing of ours goes: each is no death, and
# would flood the ring. Unrecorded, such a death under a shell read as "killed with SIGKILL; no handler ran".
ENDINGS = ("SIGQUIT", "SIGALRM", "SIGXCPU", "SIGVTALRM", "SIGPROF", "SIGPIPE")
DEFAULT_ACTION = "default action"  # detail of a signal that ended the process (the diagnosis keys on it)


def held_while_arming() -> contextlib.AbstractContextManager[None]:
    """The recorded signals held (blocked on this thread) while a ring is made and its handlers go in. One
    that comes in that window is delivered as the block ends, to the handler now in place, and recorded; it
    ended the process before with a ring that said nothing but ``arm`` ("killed; no handler ran": a Pool's
    teardown SIGTERMed a fork helper as it armed). The thread's mask is put back as it was: a signal the
    job blocked stays blocked. Arming holds them for its own time, tens of milliseconds: the signal comes
    as late as it would had it been sent then."""
    return held(numbers(RECORDED))


def _how(python_handler: Any) -> str:
    """What the wrapped disposition does with the signal, in the words of the ``detail`` column."""
    if python_handler is signal.default_int_handler:
        return "raised KeyboardInterrupt"
    if callable(python_handler):
        return "handled by the job's handler"
    return "handled by a native handler"  # set outside Python (None in Python's table)


class SignalRecorder:
    """Records signals into one ring through the C handler, and puts the dispositions back at the end."""

    def __init__(
        self, cmod: Any, intern: Callable[[Any], int], ring: tuple[Path, fmt.Header] | None = None
    ) -> None:
        self._fallback = DeathSignals(*ring) if cmod is None and ring is not None else None
        self._cmod = cmod
        self._intern = intern
        self._tags: dict[int, int] = {}
        self._hows: dict[str, int] = {}
        self.installed: list[str] = []
        self.active = False
        self._original_signal: Any = None
        self._our_signal: Any = None
        self._crashes = False  # CRASHES recorded too
        self._crash_fd = -1  # where the C handler writes a crash's tracebacks (``crash_text_to``)
        self._faulthandler: tuple[bool, int] | None = None  # (ours, its descriptor) as last told to the C handler
        self._told: set[int] = set()  # signals whose tag and detail the C handler has (signals_watch)
        self._ours: Callable[[int], bool] | None = getattr(cmod, "signals_ours", None)
        self._endings = {getattr(signal, name) for name in ENDINGS if hasattr(signal, name)}

    def install(self, buffer: Any, records_offset: int, capacity: int, sequence: Any) -> str:
        """Start recording; returns why not, or "" when the handler is in place."""
        remember_handlers()  # the job's, so that one a one-shot handler took out is still known as the job's
        if self._fallback is not None:
            why = self._fallback.install()
            self.active, self.installed = not why, self._fallback.installed
            if self.active:
                self._wrap_signal_function()  # a handler the job installs now is known as the job's
            return why
        if self._cmod is None or sequence is None:
            return "the C extension blackbox.ring._cwriter is not built: signals are not recorded"
        try:
            self._cmod.signals_arm(buffer, records_offset, capacity, sequence, self._intern(DEFAULT_ACTION))
        except RuntimeError as exc:  # one recorder per process owns the signals
            return str(exc)
        if stands_in_for_init():
            self._cmod.signals_stand_in(self._intern(fmt.DROPPED_AS_INIT))
        self.active = True
        self._record(RECORDED + ENDINGS)
        self._wrap_signal_function()
        return ""

    def record_crashes(self) -> None:
        """Record the native crash signals too, from now on (``CRASHES``): faulthandler is the job's."""
        if not self.active or self._fallback is not None or self._crashes:
            return
        self._crashes = True
        self._record(CRASHES)

    def faulthandler_ours(self, ours: bool, fd: int = -1) -> None:
        """faulthandler under the crash signals is blackbox's own (``ours``) or not. Where it is, the C handler
        records a crash over it too, and gives a fault the kernel raised back to the kernel once faulthandler
        wrote the stacks: unarmed, the job has no handler there, and the kernel's delivery (its "segfault at"
        log line, a core with the fault's address) is what ends the process (``_cwriter.c``, kernel_fault). ``fd``:
        faulthandler's descriptor (the crash region), where the handler adds the fault's native frame; the caller
        sets -1 (``ours`` False) before it closes it."""
        if not self.active or self._fallback is not None or self._cmod is None or (ours, fd) == self._faulthandler:
            return  # (unchanged: each tick asks)
        self._faulthandler = (ours, fd)
        self.record_crashes()
        self.watch()  # over what faulthandler's enable or disable put over ours, at once
        self._cmod.signals_refault(ours, fd)

    def crash_text_to(self, fd: int) -> None:
        """Where the C handler writes every thread's traceback at a crash it records (the crash region's
        descriptor, ``CrashRegion.fd``; -1: nowhere), since faulthandler, the job's, writes them elsewhere."""
        if self.active and self._fallback is None and self._cmod is not None and fd != self._crash_fd:
            self._cmod.signals_crash_fd(fd)
            self._crash_fd = fd

    def writes_crash_text(self) -> bool:
        """The C handler writes a crash's tracebacks somewhere (``crash_text_to``)."""
        return self._crash_fd >= 0

    def _record(self, names: tuple[str, ...]) -> None:
        for name in names:
            signum = getattr(signal, name, None)
            if signum is not None:
                self._tags[signum] = fmt.tag(self._intern(name), KIND_SIGNAL, fmt.FLAG_VALUE, -1)
        self.watch()

    def _wrap_signal_function(self) -> None:
        original = signal.signal

        @functools.wraps(original)
        def signal_function(signalnum: Any, handler: Any) -> Any:
            previous = original(signalnum, handler)
            CHAINED_TO_OURS.discard(signalnum)  # the job's handler is over faulthandler's now
            remember_handler(handler)
            if self.active and signalnum in self._tags:
                try:
                    self._watch_one(signalnum)
                except Exception as exc:
                    if raised_by_signal_handler(exc):  # the job's, raised by its handler meanwhile
                        raise
            return previous

        self._original_signal, self._our_signal = original, signal_function
        signal.signal = signal_function

    def watch(self) -> None:
        """(Re)wrap each recorded signal's disposition where the job has changed it (a cheap no-op otherwise)."""
        if not self.active:
            return
        if self._fallback is not None:
            self._fallback.watch()
            self.installed = self._fallback.installed
            return
        self.installed = [signal.Signals(s).name for s in self._tags if self._watch_one(s)]

    def _watch_one(self, signum: int) -> bool:
        if signum in CHAINED_TO_OURS:  # faulthandler calls ours: wrapping it again would make a loop
            return True
        if signum in self._told and self._ours is not None and self._ours(signum):
            return True  # (each tick: ours is still there, so nothing changed since it was put there)
        if signum in self._endings and (signal.getsignal(signum) is not signal.SIG_DFL or os_handler(signum) != 0):
            return False  # a handler (the job's, or one set outside Python) or SIG_IGN: no death, nothing of ours
        self._told.add(signum)
        how = _how(signal.getsignal(signum))
        hid = self._hows.get(how) or self._intern(how)
        self._hows[how] = hid
        return bool(self._cmod.signals_watch(signum, self._tags[signum], hid) in ("wrapped", "ours"))

    def uninstall(self, *, keep_late: bool = False, late_text: Callable[[], int] | None = None) -> None:
        """Put back every disposition we wrapped (where ours is still the one in force); stop recording.
        ``keep_late`` (the clean end at interpreter exit, where the exit record will be armed): the C handler
        stays, and a signal taken while the process shuts down (a SIGTERM to a rank hung in its teardown, a
        crash in a late exit handler) is recorded before the exit record (FORMAT.md, "Kinds"); ``late_text``
        opens the descriptor the handler writes every thread's stack to, at such a signal that ends it."""
        if not self.active:
            return
        try:
            if keep_late and self._fallback is None:
                self.record_crashes()  # faulthandler, ours until now, is off: a crash in a late exit handler
                self.watch()  # over the default action its disable put back over ours
        finally:
            self.active = False
            self._unwrap_signal_function()
            if self._fallback is not None:
                self._fallback.uninstall()
            else:
                self._cmod.signals_release(keep_late)
        if keep_late and late_text is not None and self._fallback is None:
            try:
                fd = late_text()
            except OSError:  # no /proc, or the job closed the ring's descriptor: the record without the stacks
                return
            try:
                self._cmod.signals_late_text(fd)  # kept open for the rest of the process: it is the handler's
            except BaseException:
                os.close(fd)
                raise

    def _unwrap_signal_function(self) -> None:
        if self._our_signal is not None and signal.signal is self._our_signal:
            signal.signal = self._original_signal
        self._our_signal = None

    def forget_after_fork(self) -> None:
        """In a forked child: the parent's ring is not ours; the job's dispositions come back."""
        if self.active:
            self.active = False
            self._unwrap_signal_function()
            if self._fallback is not None:
                self._fallback.forget_after_fork()
                return
            self._cmod.signals_forget()


class CrashRegion:
    """faulthandler's output into the ring's crash region (only where the job has not enabled faulthandler)."""

    def __init__(self, ring: Path, offset: int) -> None:
        self._ring, self._offset = ring, offset
        self._fd: OwnedFd | None = None
        self._file: io.FileIO | None = None
        self._held = 0  # references to our file object while faulthandler holds one
        self.note = ""
        self.busy = False  # enabling or disabling faulthandler itself (the job's calls are followed: not these)

    def enable(self) -> None:
        if faulthandler.is_enabled():
            self.note = ("faulthandler was already enabled by the job; its output goes where the job sent it, "
                         "and the signal recorder writes the tracebacks into the ring too")  # fmt: skip
            self._open_fd()
            return
        self._open()

    def _open_fd(self) -> None:
        fd = os.open(self._ring, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        os.lseek(fd, self._offset, os.SEEK_SET)
        self._fd = OwnedFd.adopt(fd)

    def _open(self) -> None:
        self._open_fd()
        assert self._fd is not None
        self._file = io.FileIO(self._fd.fd, "w", closefd=False)
        self._faulthandler("enable", file=self._file, all_threads=True)
        self._held = sys.getrefcount(self._file)

    def _faulthandler(self, name: str, **kwargs: Any) -> None:
        self.busy = True
        try:
            getattr(faulthandler, name)(**kwargs)
        finally:
            self.busy = False

    def fd(self) -> int:
        """The descriptor positioned at the crash region, for the signal recorder's C handler where
        faulthandler is not ours (``SignalRecorder.crash_text_to``); -1 where there is none, or the job closed
        it (its number may be the job's file now)."""
        return self._fd.fd if self._fd is not None and self._fd.intact() else -1

    def ours(self) -> bool:
        """faulthandler still writes to our file: the job has neither disabled it nor enabled its own."""
        return self._file is not None and faulthandler.is_enabled() and sys.getrefcount(self._file) >= self._held

    def check(self) -> None:
        """If the job closed our descriptor (closerange, daemonising), point faulthandler at a new one."""
        fd = self._fd
        if fd is None or fd.intact():
            return
        if not self.ours():  # the signal recorder's alone (the caller hands it the new one)
            self._file, self._fd = None, None
            self._open_fd()
            return
        self._faulthandler("disable")  # never let a crash write into whatever file now has that number
        self._file, self._fd = None, None
        self._open()

    def late_fd(self, ring: OwnedFd) -> int:
        """A new descriptor of the ring (the one the recorder holds, reopened: no lock of its shared), positioned
        at the crash region, for the stacks at a signal that ends the shutdown (``SignalRecorder.uninstall``)."""
        if not ring.intact():
            raise OSError("the ring's descriptor is no longer the recorder's")
        fd = os.open(f"/proc/self/fd/{ring.fd}", os.O_WRONLY | os.O_CLOEXEC)
        os.lseek(fd, self._offset, os.SEEK_SET)
        return fd

    def disable(self) -> None:
        """Stop, where faulthandler is still ours; the job's own faulthandler is left as it is. The descriptor
        is closed either way (where the job's faulthandler was there first, the signal recorder's alone)."""
        if self._file is not None and self.ours():
            self._faulthandler("disable")
        self._file = None
        if self._fd is not None:
            self._fd.close()
            self._fd = None


TORCH_WORKER_SIGNALS = "torch.utils.data._utils.signal_handling"  # where a DataLoader worker gets its handlers


def follow_torch_worker_handlers(after: Callable[[], None]) -> None:
    """A DataLoader worker installs PyTorch's own SIGSEGV, SIGBUS and SIGFPE handlers as it starts
    (``_set_worker_signal_handlers``): they print a line and die by the signal, over faulthandler's, so a
    worker's crash left no record and read as a SIGKILL. Wrap that function (once torch has loaded it;
    forked workers inherit the wrapper) so that ``after`` runs once they are in: the C handler then
    records the crash signals over them and hands each on to PyTorch's, whose line and death stay."""
    module = sys.modules.get(TORCH_WORKER_SIGNALS)
    if module is not None:
        _follow(module, "_set_worker_signal_handlers", after)


def follow_faulthandler(after: Callable[[], None]) -> None:
    """The job's ``faulthandler.enable()`` (or ``disable()``) after arm replaces ours: until the next tick saw it,
    a crash was recorded by no one and read as a SIGKILL. Wrap both so that ``after`` runs at once (the C
    handler then records the crash signals and writes their tracebacks into the ring too)."""
    for name in ("enable", "disable"):
        _follow(faulthandler, name, after)


# Signals whose handler is faulthandler's, registered with chain=True while ours was in place: it calls ours
# (its previous) after its dump, and ours hands on to the job's before it. Wrapping faulthandler's again
# (``watch``) would close a loop (each calling the other until the stack ran out: SIGSEGV instead of SIGTERM).
CHAINED_TO_OURS: set[int] = set()


def follow_faulthandler_register(cmod: Any) -> None:
    """Wrap ``faulthandler.register`` and ``unregister`` to keep ``CHAINED_TO_OURS``: a register with chain=True
    over our handler (``cmod.signals_installed()``, read before it) joins it; any other, or an unregister, leaves."""
    register, unregister = getattr(faulthandler, "register", None), getattr(faulthandler, "unregister", None)
    if cmod is None or register is None or unregister is None or getattr(register, "_blackbox_follows", False):
        return

    def follow_register(signum: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            ours = int(signum) in cmod.signals_installed()
        except Exception:  # the recorder's trouble is never the job's (a bad signum: register says so)
            ours = False
        result = register(signum, *args, **kwargs)
        chained = kwargs["chain"] if "chain" in kwargs else len(args) > 2 and args[2]
        (CHAINED_TO_OURS.add if ours and chained else CHAINED_TO_OURS.discard)(int(signum))
        return result

    def follow_unregister(signum: Any) -> Any:
        result = unregister(signum)
        CHAINED_TO_OURS.discard(signum)  # faulthandler put its previous (ours) back
        return result

    _replace(faulthandler, "register", follow_register, register)
    _replace(faulthandler, "unregister", follow_unregister, unregister)


def _follow(module: Any, name: str, after: Callable[[], None]) -> None:
    """``module.name`` replaced by a wrapper that calls it, then ``after`` (whose failure is never the job's)."""
    function = getattr(module, name, None)
    if function is None or getattr(function, "_blackbox_follows", False):
        return

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = function(*args, **kwargs)
        try:
            after()
        except Exception:  # the recorder's trouble is never the job's
            pass
        return result

    _replace(module, name, wrapper, function)


def _replace(module: Any, name: str, wrapper: Callable[..., Any], function: Callable[..., Any]) -> None:
    """``module.name`` (``function``) replaced by ``wrapper``, which looks like it and is marked as ours."""
    functools.update_wrapper(wrapper, function)
    wrapper._blackbox_follows = True  # type: ignore[attr-defined]
    setattr(module, name, wrapper)
