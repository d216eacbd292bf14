"""Did a signal sent to ``blackbox run`` reach the job too? A witness process tells.

Slurm's ``slurmstepd`` signals a step in ways that differ by what it means and
by its proctrack plugin, and each looks the same to us (``kill`` from
``slurmstepd``):

- a job's cancel, time limit or requeue (SIGTERM), and ``scancel -s SIG`` of
  a step, go to the step's container: ``proctrack/linuxproc`` signals every
  process below slurmstepd, deepest first (the job got it before we did);
  ``proctrack/cgroup`` only slurmstepd's own children (us alone, the job never
  gets it); ``proctrack/pgid`` the step's process group (ours, which the job
  shares: it got it too);
- ``scancel -b -s SIG`` and ``--signal=B:SIG@T`` go to the batch script's pid
  alone, and ``scancel -f -s SIG`` to its process group, under every plugin.

The job stays in our process group, so a signal sent to the group (``kill
-TERM -PGID``, ``timeout``, a terminal's Ctrl-C, ``proctrack/pgid``) reached it
too. The witness is a child of ours placed exactly like the job (a child of
this process, in our process group) that blocks every signal we relay and never
takes one: a signal that reached the job because its sender signalled our group
or every process stays pending in the witness (``/proc/<pid>/status``,
``ShdPnd``). So the launcher relays a signal unless the witness got it too, and
the job gets it exactly once whatever the sender. The witness is then told to
drop it, so that the next one is seen afresh. It reads a pipe from us and ends when we do
(its end of the pipe closes, and ``PR_SET_PDEATHSIG`` kills it).

Where the job's process moved into a process group of its own (``timeout``, a shell with job control),
a signal sent to our group missed it, which unarmed, the leader of the job's group, it would have had.
A second witness, alone in a group of its own (``own_group``), tells that from a sender that signalled
every process (``proctrack/linuxproc``, systemd's control group, which reached the moved job too): it
gets only the latter.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import time
from collections.abc import Iterable

from .leftovers import stat_of
from .proc import status_masks

WAIT_S = 0.02  # how long to look for the signal in the witness (a sender may reach it just after us)
_PR_SET_PDEATHSIG = 1


def pending(pid: int) -> int:
    """The signals pending in process ``pid`` (its threads' and the process's), as a bit mask; 0 if unknown."""
    mask = 0
    for value in (status_masks(pid, ("SigPnd", "ShdPnd")) or {}).values():
        mask |= value
    return mask


class Witness:
    """See the module docstring. ``pid`` is None where it could not be started (we then relay always)."""

    def __init__(self, signals: Iterable[int], own_group: bool = False) -> None:
        self.signals = {int(s) for s in signals}
        self.own_group = own_group
        self.pid: int | None = None
        self._to = self._back = -1
        try:
            self._start()
        except OSError:
            self.close()

    def _start(self) -> None:
        parent = os.getpid()
        to_r, to_w = os.pipe2(os.O_CLOEXEC)
        back_r, back_w = os.pipe2(os.O_CLOEXEC)
        pid = os.fork()
        if pid == 0:  # the witness: nothing but the pipe, our signals blocked, never a handler
            code = 0
            try:
                os.close(to_w)
                os.close(back_r)
                signal.pthread_sigmask(signal.SIG_BLOCK, self.signals)
                if self.own_group:
                    os.setpgid(0, 0)
                _die_with_parent()
                if os.getppid() != parent:
                    os._exit(0)
                while True:
                    got = os.read(to_r, 1)
                    if not got:
                        break
                    while signal.sigtimedwait({got[0]}, 0) is not None:
                        pass
                    os.write(back_w, got)
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        os.close(to_r)
        os.close(back_w)
        self.pid, self._to, self._back = pid, to_w, back_r

    def saw(self, signo: int, wait_s: float = WAIT_S) -> bool:
        """Whether ``signo`` reached the witness too (its sender signalled every process of ours); if so,
        the witness drops it before we return, so that the next one is seen afresh."""
        if self.pid is None or signo not in self.signals:
            return False
        bit = 1 << (signo - 1)
        deadline = time.monotonic() + wait_s
        while not pending(self.pid) & bit:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.002)
        with contextlib.suppress(OSError):
            os.write(self._to, bytes([signo]))
            if select.select([self._back], [], [], 1.0)[0]:
                os.read(self._back, 1)
        return True

    def alive(self) -> bool:
        """The witness runs (it can have ended only by a failure of its own: then it tells nothing)."""
        state = stat_of(self.pid) if self.pid is not None else None
        return state is not None and state[2] not in ("Z", "X")

    def close(self) -> None:
        """End the witness and reap it."""
        for fd in (self._to, self._back):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._to = self._back = -1
        if self.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.pid, 0)
            self.pid = None


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)  # not find_library: it runs ldconfig in a child
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
