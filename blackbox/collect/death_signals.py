"""Signals that end the process, recorded where the C extension is not built: faulthandler's stack, slot by slot.

Without ``blackbox.ring._cwriter`` (an install without a C compiler) no handler of ours can write a
record from a signal. The standard library's own async-signal-safe one can write text:
``faulthandler.register(signum, file, chain=True)``. It is installed with ``sigaction`` over a
signal's default action only (never over a handler of the job's, SIG_IGN, or a handler set outside
Python), and never in Python's handler table, so ``signal.getsignal()`` answers what it would without
blackbox. When SIGNAL_SLOTS[i] arrives, it writes the interrupted thread's Python stack into slot i,
past the ring's end (FORMAT.md: no file beside the ring, and no reader takes it for a crash), restores
the default action and raises the signal again: the process dies of it at once, as it would have, also
while its main thread is blocked in C. Recovery reads the
slot: "SIGTERM with its default action", as the C handler's record says. What this cannot record, and
recovery says so: the sender, and a signal the job's own handler takes (the job then runs Python
code and usually ends by itself).

The job keeps every choice. ``signal.signal`` is wrapped: a handler the job installs replaces ours
(ours is unregistered first, which restores the default action it was over), and ours comes back when
the job restores the default action. ``faulthandler.register`` and ``unregister`` are wrapped: the job's
own registration of one of these signals is the one in force (ours is dropped), and the job
unregistering one it never registered finds nothing, as it would without blackbox. ``watch()`` (each
sampler tick) notices a handler set past the wrapper (code that bound ``signal.signal`` before arm) and
a slot descriptor the job closed. Whether ours is the handler in force is read with ``sigaction``
through ctypes; where that cannot be read, nothing is installed.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import os
import platform
import signal
import threading
from pathlib import Path
from typing import Any

from .._fds import OwnedFd
from ..ring import format as fmt
from .identity import stands_in_for_init

_OWNER: list[DeathSignals] = []  # the one recorder of this process that records its signals


@functools.cache
def _libc_sigaction() -> Any:
    """libc's sigaction, looked up once: each tick asks for five signals' handlers, and a fresh
    ``ctypes.CDLL(None)`` (dlopen and dlsym) made each ask cost 14 us where the call costs 1.4. Called with
    the GIL held (PyDLL): a CDLL call releases it, and a job's thread busy in Python kept it 5 ms each time."""
    return ctypes.PyDLL(None, use_errno=True).sigaction


def os_handler(signum: int) -> int | None:
    """The address of the handler the kernel runs for ``signum`` (0: the default action, 1: ignored),
    read with sigaction(2) without changing it; None where it cannot be read."""
    if platform.machine().lower().startswith("mips"):  # its struct sigaction starts with the flags
        return None
    try:
        buf = ctypes.create_string_buffer(512)  # larger than any libc's struct sigaction
        if _libc_sigaction()(signum, None, buf) != 0:
            return None
        return int(ctypes.c_void_p.from_buffer(buf).value or 0)
    except (OSError, AttributeError, ValueError):
        return None


class DeathSignals:
    """faulthandler over the default action of SIGNAL_SLOTS, writing into their slots past the ring's end."""

    def __init__(self, ring: Path, header: fmt.Header) -> None:
        self.path, self._header = ring, header
        self.active = False
        self._slots = {getattr(signal, n): i for i, n in enumerate(fmt.SIGNAL_SLOTS) if hasattr(signal, n)}
        self._fds: dict[int, OwnedFd] = {}  # signum -> its slot's descriptor, while ours is registered
        self._ours: dict[int, int] = {}  # signum -> the handler address sigaction showed once ours was in
        self._stale: set[int] = set()  # ours was replaced past the wrappers: faulthandler still thinks it holds it
        self._taken: set[int] = set()  # the job registered faulthandler for these itself
        self._saved: list[tuple[Any, str, Any, Any]] = []  # (module, name, original, ours)
        self._signal: Any = signal.signal
        self._register: Any = faulthandler.register
        self._unregister: Any = faulthandler.unregister

    @property
    def installed(self) -> list[str]:
        return [signal.Signals(s).name for s in self._fds]

    def install(self) -> str:
        """Start; returns why not, or ""."""
        if _OWNER:
            return "another armed recorder of this process records its signals"
        if os_handler(signal.SIGTERM) is None:
            return "sigaction cannot be read here (ctypes): signals are not recorded"
        if self._header.version < 3:
            return f"a version-{self._header.version} ring has no signal slots: signals are not recorded"
        if stands_in_for_init():  # faulthandler's handler would hand to the default action what the kernel drops
            return "signals are not recorded: this process is, or stands for, its PID namespace's first process"
        _OWNER.append(self)
        self.active = True
        self._wrap()
        self.watch()
        return ""

    # ---------------------------------------------------------------- ours in and out
    def _add(self, signum: int) -> None:
        """Register ours where the signal has its default action, in Python's table and the kernel's."""
        if signum in self._fds or signum in self._taken or signal.getsignal(signum) is not signal.SIG_DFL:
            return
        if os_handler(signum) != 0:
            return  # a handler set outside Python's table (a library's, or the job's faulthandler): not ours
        fd = self._slot_fd(signum)
        if fd is None:
            return
        self._clear_stale(signum)  # else faulthandler would keep its old entry and install nothing
        self._register(signum, file=fd.fd, all_threads=False, chain=True)
        self._fds[signum], self._ours[signum] = fd, os_handler(signum) or -1

    def _slot_fd(self, signum: int) -> OwnedFd | None:
        fd = OwnedFd.open(self.path, os.O_WRONLY | os.O_NOFOLLOW)
        if fd is not None:
            os.lseek(fd.fd, fmt.signal_slot_offset(self._header, self._slots[signum]), os.SEEK_SET)
        return fd

    def _clear_stale(self, signum: int) -> None:
        """faulthandler still holds an entry of ours that a handler set past the wrappers replaced: clear
        it (which puts back the default action it was over), then put back what Python's table says is in
        force. Left as it is where that is a handler set outside Python (it could not be put back)."""
        current = signal.getsignal(signum)
        if signum not in self._stale or current is None:
            return
        self._stale.discard(signum)
        self._unregister(signum)
        if current is not signal.SIG_DFL:
            self._signal(signum, current)

    def _drop(self, signum: int) -> None:
        """Unregister ours (back to the default action) where it is still the handler in force."""
        fd = self._fds.pop(signum, None)
        if fd is None:
            return
        if os_handler(signum) == self._ours.pop(signum, None):
            self._unregister(signum)
        else:
            self._stale.add(signum)  # replaced past the wrappers: leave the kernel's handler as it is
        fd.close()

    def watch(self) -> None:
        """Put ours back where the default action is in force again, drop it where something replaced
        it, and reopen a slot descriptor the job closed (a cheap no-op otherwise)."""
        if not self.active:
            return
        for signum in list(self._fds):
            fd = self._fds[signum]
            if os_handler(signum) != self._ours.get(signum):
                self._drop(signum)
            elif not fd.intact():  # faulthandler would write into whatever file now has that number
                fresh = self._slot_fd(signum)
                if fresh is not None:  # faulthandler takes the new descriptor; its handler stays in place
                    self._register(signum, file=fresh.fd, all_threads=False, chain=True)
                    self._fds[signum] = fresh
        for signum in self._slots:
            self._add(signum)

    # ---------------------------------------------------------------- the job's calls
    def _wrap(self) -> None:
        signal_function, register, unregister = signal.signal, faulthandler.register, faulthandler.unregister
        self._signal, self._register, self._unregister = signal_function, register, unregister

        @functools.wraps(signal_function)
        def signal_wrapper(signalnum: Any, handler: Any) -> Any:
            if self.active and signalnum in self._fds and threading.current_thread() is threading.main_thread():
                try:
                    self._drop(signalnum)  # the default action it was over is back, for the job's call to replace
                except Exception:
                    pass
            try:
                previous = signal_function(signalnum, handler)
            finally:
                if self.active and signalnum in self._slots:
                    try:
                        self._add(signalnum)  # only where the default action is now in force
                    except Exception:
                        pass
            return previous

        @functools.wraps(register)
        def register_wrapper(signum: Any, *args: Any, **kwargs: Any) -> Any:
            ours = self.active and signum in self._fds
            if self.active and signum in self._stale:
                try:
                    self._clear_stale(signum)  # so that faulthandler installs the job's handler, as unarmed
                except Exception:
                    pass
            result = register(signum, *args, **kwargs)
            if ours:  # the job's registration replaced ours in faulthandler: it is in force, ours is gone
                self._fds.pop(signum).close()
                self._ours.pop(signum, None)
            if self.active and signum in self._slots:
                self._taken.add(signum)
            return result

        @functools.wraps(unregister)
        def unregister_wrapper(signum: Any) -> Any:
            if self.active and signum in self._fds:
                return False  # the job registered nothing for it: as without blackbox
            result = unregister(signum)
            if self.active and signum in self._taken:
                self._taken.discard(signum)
                self._add(signum)
            return result

        self._saved = [(signal, "signal", signal_function, signal_wrapper),
                       (faulthandler, "register", register, register_wrapper),
                       (faulthandler, "unregister", unregister, unregister_wrapper)]  # fmt: skip
        for module, name, _, wrapper in self._saved:
            setattr(module, name, wrapper)

    def _unwrap(self) -> None:
        for module, name, original, wrapper in self._saved:
            if getattr(module, name) is wrapper:
                setattr(module, name, original)
        self._saved = []

    # ---------------------------------------------------------------- the end
    def uninstall(self) -> None:
        """Stop: the default actions back where ours is still in force."""
        self.forget_after_fork()

    def forget_after_fork(self) -> None:
        """Stop; in a forked child, the parent's ring is not ours: the default actions come back."""
        if not self.active:
            return
        self.active = False
        self._unwrap()
        for signum in list(self._fds):
            self._drop(signum)
        if self in _OWNER:
            _OWNER.remove(self)
