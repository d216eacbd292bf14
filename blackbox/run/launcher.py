"""``blackbox run``: start a job with every Python process armed, then recover what it left.

The job runs as it would without us:

- Its environment gains two entries on ``PYTHONPATH``, a run folder holding our
  ``sitecustomize.py`` and a link to the blackbox package alone (never the
  site-packages it is installed in, whose numpy or torch would shadow the job's).
- It stays in our process group, as it would have been in its launcher's had
  it been started directly: a signal to the group (``kill -KILL -PGID``,
  ``timeout -s KILL``, a terminal's Ctrl-C and Ctrl-Z) reaches every process
  of the job at once, SIGKILL and SIGSTOP included, which no relay could pass
  on; a job started from an interactive shell has the terminal as it would.
  It dies with us if we alone are SIGKILLed (as it would have been, had it
  been started directly).
- Every other signal sent to us is passed to it exactly once (read with
  ``sigtimedwait``, so we run no handler): a signal sent to our process group,
  or by a sender that signals every process of the job itself (Slurm's
  ``slurmstepd`` under ``proctrack/linuxproc``), has reached the job already,
  which a witness process placed like the job tells (``witness``), and is not
  passed on, except where the job's own process made a group of its own in our
  session and leads it (``timeout``) and the signal went to our group alone (a
  terminal's Ctrl-C, ``kill -INT -PGID``): unarmed, that group is the one it
  would have reached, so it is signalled as a whole. A second witness, alone in
  a group of its own, tells a signal to our group from one sent to every
  process, which reached that group already (a SIGKILL to ours cannot be
  passed on); one
  sent to our pid alone (``kill PID``, a terminal's hang-up, a pod's PID 1,
  ``proctrack/cgroup``) is relayed to the job's own process alone, as it would
  have reached it alone unarmed (its DataLoader workers and subprocesses, a
  shell wrapper's python, never get it from us); to no one once that process
  has ended. As a PID namespace's first process (a container's entrypoint),
  where unarmed the job's own process would be that first process, to which
  the kernel gives no signal it has no handler for, we pass on only what it
  has a handler for or blocks (``SigCgt``, ``SigBlk``); an armed Python process
  always has ours, and drops itself a signal that is not a fault where the
  job's own disposition is the default, whoever sent it
  (``collect.identity.stands_in_for_init``); once it ended, what it left is
  SIGKILLed at once, as the kernel does when a namespace's first process ends.
  Each relay is written down first, with its original sender (pid, uid,
  command, ``si_code``), in ``relayed.jsonl`` beside the rings: the job's rings
  name us as the sender, and recovery gives the signal back to whoever really
  sent it.
- We are its processes' subreaper: what it starts and leaves behind (a shell
  wrapper's python, once the shell has died) is ours to wait for, and we
  recover only once none of its processes is left in our group (or after
  ``GRACE_S``).
- A job still running a second after a signal sent to end it (SIGTERM, SIGINT, SIGHUP, SIGQUIT) may be
  SIGKILLed with us before we can write anything: a snapshot of it is written meanwhile (``snapshot``).
- We end as it ended: with its exit status, or killed by the signal that killed
  it, whatever recovery does.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..collect.identity import RUN_ID_ENV, RUN_INIT_ENV, RUN_JOB_ENV, RUN_PID_ENV, pid_namespace
from ..ring.relayed import MAX_RELAYED_BYTES, RELAYED, Relay, relay_line
from . import snapshot
from .bootstrap import BOOT_ENV, SITECUSTOMIZE
from .leftovers import descendants, stat_of
from .proc import argv_of, comm_of, command_of, own_proc, program_of, takes
from .torchelastic import RUN_ID_ENV as TORCHELASTIC_RUN_ID
from .witness import WAIT_S as WITNESS_WAIT_S
from .witness import Witness

FORWARDED = (
    signal.SIGINT,
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGWINCH,
)
GRACE_S = 10.0  # after the job's process ends, how long its other processes in our group may take to follow
STOP_SETTLE_S = 0.05  # after the job's process stopped, before we look whether it is stopped still
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
Outlived = Callable[[int, str], "int | None"]  # (the job's pid, the signal it outlived, as said) -> a child of ours


@dataclass
class Ended:
    """How the job ended: ``status`` as a shell reports it (128 + n when signal n killed it)."""

    status: int
    signal: int | None  # the signal that killed it, or None when it exited
    end_ns: int = 0  # UTC ns when we saw its process end
    pid: int = 0  # the job's process: the one we started, whose status this is
    snapshot: bool = False  # a snapshot of it was started: its notices are the end's to replace


def prepare(work: Path) -> tuple[Path, Path]:
    """(rings folder, boot folder): our sitecustomize and a link to this blackbox package, nothing else."""
    rings, boot = work / "rings", work / ".boot"
    for d in (rings, boot):
        d.mkdir(mode=0o700)
    fd = os.open(boot / "sitecustomize.py", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(SITECUSTOMIZE)
    os.symlink(Path(__file__).resolve().parents[1], boot / "blackbox")
    return rings, boot


def job_environment(rings: Path, boot: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(boot), env.get("PYTHONPATH", "")) if p)
    env["BLACKBOX_DIR"] = str(rings)
    env[BOOT_ENV] = str(boot)
    env[RUN_PID_ENV] = str(os.getpid())
    env.pop(RUN_INIT_ENV, None)
    if os.getpid() == 1 and (ns := pid_namespace()):  # a container's entrypoint: the job's own process stands for us
        env[RUN_INIT_ENV] = ns
    env[RUN_ID_ENV] = rings.parent.name  # the run folder's name (run-<UTC time>-XXXX): the job's id
    if not env.get(TORCHELASTIC_RUN_ID):  # not one rank's run: the whole job, torchrun's ranks below us included
        env[RUN_JOB_ENV] = env[RUN_ID_ENV]
    return env


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)  # not find_library: it runs ldconfig in a child
        libc.prctl(option, value, 0, 0, 0)


def _child_setup(mask: set[int], parent: int) -> None:
    """In the job's process, before exec: dying with us, our mask undone (our process group is kept)."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # we died before prctl took effect
        os._exit(128 + signal.SIGKILL)
    signal.pthread_sigmask(signal.SIG_SETMASK, mask)


class Relayer:
    """Passes signals that reached us alone on to the job's processes, each written down first with its
    real sender."""

    def __init__(self, rings: Path, witness: Witness, lone: Witness | None = None) -> None:
        self.job = 0  # the job's own process
        self.witness = witness
        self.lone = lone  # a witness in a group of its own: it sees only what was sent to every process
        self.ours: set[int] = set()  # our own children beside the job (a snapshot's writer): never the job's
        self._log = -1
        self._room = MAX_RELAYED_BYTES  # what recovery reads; a signal storm must not fill the disk
        with contextlib.suppress(OSError):  # unrecorded, a relay still happens: the job comes first
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            self._log = os.open(rings / RELAYED, flags, 0o600)

    def relay(self, info: Any) -> None:
        moved = 0
        if self.witness.saw(info.si_signo):  # sent to our process group, or to every process below us
            # We may hold it a second time: `timeout` sends to our pid, then at once to its group (ours), and we
            # may have taken the first before the second came. Unarmed, both reach a Python job before its
            # handler runs, which runs once: passed on later, it would run twice.
            _sigtimedwait({info.si_signo}, 0.005)
            # Sent to our group alone (a terminal's Ctrl-C, Ctrl-\, hang-up, sent by the kernel; `kill -INT
            # -PGID`): the group the job made (timeout's) needs it too. Sent to every process (Slurm's
            # linuxproc, systemd's control group), it reached that group already, and the witness alone in a
            # group of its own has it too: passed on, the job would get it twice.
            moved = self.moved_group()
            lone = self.lone if self.lone is not None and self.lone.alive() else None  # (none: we cannot tell)
            wait = WITNESS_WAIT_S if moved and info.si_code <= 0 else 0.0  # (else only drop one it has)
            every = lone is not None and lone.saw(info.si_signo, wait)
            if not moved or (info.si_code <= 0 and (lone is None or every)):
                return  # the job has it already
        elif self.job <= 0:  # sent to us alone once the job's own process has ended: unarmed, it would reach no
            return  # one (what that process left, a shell wrapper's python and its workers, never had it)
        elif os.getpid() == 1 and takes(self.job, info.si_signo) is False:
            return  # unarmed, the job's own process would be the namespace's first: the kernel drops what it takes not
        if info.si_code > 0 or info.si_pid <= 0:  # sent by the kernel (a terminal's hang-up)
            relay = Relay(info.si_signo, info.si_code, None, None, None, None, os.getpid(), time.time_ns())
        else:  # by a process (kill, sigqueue): who, read now, while it is most likely still there
            argv = argv_of(info.si_pid)
            name = program_of(argv, comm_of(info.si_pid)) or None  # None: it ended before it could be named
            relay = Relay(info.si_signo, info.si_code, info.si_pid, info.si_uid, name,
                          command_of(info.si_pid) if name else None, os.getpid(), time.time_ns())  # fmt: skip
        line = relay_line(relay)
        if self._log >= 0 and len(line) <= self._room:
            with contextlib.suppress(OSError):
                self._room -= os.write(self._log, line)  # one O_APPEND write: a line is never split
        if moved:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(moved, info.si_signo)
        else:
            self.signal_job(info.si_signo)

    def moved_group(self) -> int:
        """The process group the job's own process made and leads in our session (``timeout`` and a shell
        with job control move there), 0 where it stayed in ours or left the session (``setsid``: unarmed, a
        terminal's signals never reach it either). Unarmed, that group is the one a signal to the job's
        group (Ctrl-C, ``kill -INT -PGID``) reaches: armed, ours does, and it is passed on to that group."""
        job = self.job
        try:
            group, session = (os.getpgid(job), os.getsid(job)) if job > 0 else (0, 0)
        except OSError:
            return 0
        return group if group == job and group != os.getpgrp() and session == os.getsid(0) else 0

    def job_processes(self) -> list[int]:
        """The job's processes a signal to our group reaches: those below us in our group (the witness
        aside), and the job's own process wherever it is."""
        pids = set(descendants(os.getpid(), os.getpgrp())) - {self.witness.pid} - self.ours
        return sorted(pids | ({self.job} if self.job > 0 else set()))

    def signal_job(self, signo: int) -> None:
        """What was sent to us alone: to the job's own process alone, as a `kill` of its pid reaches it unarmed."""
        if self.job > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.job, signo)

    def end_namespace(self) -> None:
        """We are our PID namespace's first process, which unarmed the job's own process was, and it has ended:
        the kernel SIGKILLs every other process of a namespace whose first process ends, so what it left is
        SIGKILLed now (our own children aside), not given ``GRACE_S`` to end by itself."""
        if not own_proc():  # (another namespace's /proc: its pids are not ours to kill)
            return
        ours = self.ours | {w.pid for w in (self.witness, self.lone) if w is not None and w.pid is not None}
        for pid in set(descendants(os.getpid())) - ours:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)

    def close(self) -> None:
        self.witness.close()
        if self.lone is not None:
            self.lone.close()
        if self._log >= 0:
            os.close(self._log)
            self._log = -1


def launch(command: list[str], rings: Path, boot: Path, on_end: Callable[[Ended], None] | None = None,
           tick: Callable[[], None] | None = None, outlived: Outlived | None = None) -> Ended:  # fmt: skip
    """Run ``command`` armed until it ends; returns how it ended. ``on_end`` is called as soon as the job's
    process has ended, before the rest of its process group is waited for; ``tick`` every half second, and
    at each signal, while the job's process runs; ``outlived`` once, where the job's process still runs
    ``snapshot.OUTLIVED_S`` after a signal meant to end it."""
    watched: set[int] = {int(s) for s in (*FORWARDED, signal.SIGCHLD)}
    before = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    relayer = Relayer(rings, Witness(FORWARDED), Witness(FORWARDED, own_group=True))
    try:
        try:
            child = subprocess.Popen(
                command,
                env=job_environment(rings, boot),
                preexec_fn=lambda: _child_setup(before, os.getppid()),
            )
        except OSError as exc:
            print(f"blackbox run: cannot start {command[0]!r}: {exc.strerror or exc}", file=sys.stderr)
            return Ended(127 if isinstance(exc, FileNotFoundError) else 126, None)
        relayer.job = child.pid
        asked = _Asked(outlived)
        try:
            ended = _wait(child.pid, watched, relayer, tick, asked)
            relayer.job = 0  # reaped: its pid may be another process's now
            ended.end_ns, ended.pid = time.time_ns(), child.pid
            if on_end is not None:
                on_end(ended)
            if os.getpid() == 1:
                relayer.end_namespace()
            _wait_for_the_group(watched, relayer, asked, child.pid)
            ended.snapshot = asked.started
        finally:
            for pid in relayer.ours:  # the snapshot's writer: the bundle of the job's end replaces it
                snapshot.stop(pid)
            relayer.ours.clear()
        return ended
    finally:
        relayer.close()
        # The forwarded signals stay blocked: once the job has ended, a signal has nobody to reach and
        # must not end us with another status while we recover (unarmed, the process is already gone).
        # end_like unblocks the job's own signal to die by it; others die pending with this process.
        signal.pthread_sigmask(signal.SIG_SETMASK, set(before) | {int(s) for s in FORWARDED})


def _sigtimedwait(watched: set[int], timeout: float) -> Any:
    """``signal.sigtimedwait``, but None for what is no signal of ``watched``. Interrupted (EINTR: a stop and a
    continue, Ctrl-Z then fg) after its timeout ran out, CPython (3.10-3.13) returns the siginfo it never
    filled in: a signal number of whatever the stack held, which relayed to the job was an EINVAL that ended
    blackbox run (seen under load, test_run_groups' Ctrl-Z, 1 run in 5 with 30 busy processes beside it)."""
    info = signal.sigtimedwait(watched, timeout)
    return info if info is not None and info.si_signo in watched else None


class _Asked:
    """The first signal meant to end the job (``snapshot.ENDING``), and the snapshot it leads to, once, where a
    process of the job (its own, or what it left: a shell wrapper's python) still runs ``OUTLIVED_S`` later."""

    def __init__(self, outlived: Outlived | None) -> None:
        self.outlived = outlived
        self.when: float | None = None
        self.said = ""
        self.started = False

    def note(self, info: Any) -> None:
        if self.when is None and info.si_signo in snapshot.ENDING:
            self.when, self.said = time.monotonic(), _asked(info)

    def wait_s(self, most: float) -> float:
        """How long to wait for the next signal: at most until the snapshot is due."""
        if self.when is None or self.outlived is None:
            return most
        return min(max(self.when + snapshot.OUTLIVED_S - time.monotonic(), 0.01), most)

    def check(self, job: int, relayer: Relayer) -> None:
        """A process of the job runs still: start the snapshot where it is due."""
        if self.when is None or self.outlived is None or time.monotonic() - self.when < snapshot.OUTLIVED_S:
            return
        outlived, self.outlived = self.outlived, None
        with contextlib.suppress(Exception):  # a snapshot, never a reason to stop waiting for the job
            if (ours := outlived(job, self.said)) is not None:
                relayer.ours.add(ours)
                self.started = True


def _wait(pid: int, watched: set[int], relayer: Relayer, tick: Callable[[], None] | None, asked: _Asked) -> Ended:
    while True:
        info = _sigtimedwait(watched, asked.wait_s(0.5))
        if tick is not None:
            with contextlib.suppress(Exception):  # a look at the job, never a reason to stop waiting for it
                tick()
        if info is not None and info.si_signo != signal.SIGCHLD:
            asked.note(info)
            relayer.relay(info)
            continue
        done, status = os.waitpid(pid, os.WNOHANG | os.WUNTRACED)
        if done == 0:
            asked.check(pid, relayer)
            continue
        if os.WIFSTOPPED(status):
            _stopped(pid, relayer)
            continue
        if os.WIFSIGNALED(status):
            sig = os.WTERMSIG(status)
            return Ended(128 + sig, sig)
        return Ended(os.WEXITSTATUS(status), None)


def _asked(info: Any) -> str:
    """A signal as said: ``SIGTERM from timeout (pid 12)``; with no sender where the kernel sent it."""
    name = signal.Signals(info.si_signo).name
    if info.si_code > 0 or info.si_pid <= 0:
        return name
    sender = program_of(argv_of(info.si_pid), comm_of(info.si_pid))
    return f"{name} from {sender} (pid {info.si_pid})" if sender else f"{name} from pid {info.si_pid}"


def _stopped(pid: int, relayer: Relayer) -> None:
    """The job's process stopped. By a stop sent to our group (Ctrl-Z) we stopped with it, and whoever
    continued the group continued it too. By one sent to it alone, we stop too, so that the shell sees its
    job stopped, and continue the job's process when we are continued (`fg`)."""
    time.sleep(STOP_SETTLE_S)  # a SIGCONT to the group reaches its processes one after another
    if (stat_of(pid) or (0, 0, ""))[2] != "T":
        return
    os.kill(os.getpid(), signal.SIGSTOP)
    relayer.signal_job(signal.SIGCONT)


def _wait_for_the_group(watched: set[int], relayer: Relayer, asked: _Asked, job: int) -> None:
    """Reap the job's leftovers (reparented to us) until none of its processes is left in our group, or
    GRACE_S passed (a signal sent to us alone meanwhile reaches none of them, as unarmed), and a leftover that
    outlives a signal meant to end the job (a shell wrapper died of it, its python saves) gets the snapshot."""
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline:
        _reap(relayer)
        if not relayer.job_processes():
            # one that ended between the reaping above and that look is a zombie of ours now (the look
            # counts only live processes): reaped too, so none of the job's is left once we are gone
            _reap(relayer)
            return
        asked.check(job, relayer)
        info = _sigtimedwait(watched, asked.wait_s(0.25))  # a leftover's end wakes us (SIGCHLD: it is ours now)
        if info is not None and info.si_signo != signal.SIGCHLD:
            asked.note(info)
            relayer.relay(info)


def _reap(relayer: Relayer) -> None:
    """Reap every child of ours that ended; a snapshot's writer among them is no longer ours to stop (its pid
    may be another process's from now on)."""
    with contextlib.suppress(ChildProcessError):
        while (pid := os.waitpid(-1, os.WNOHANG)[0]) > 0:
            relayer.ours.discard(pid)


def end_like(ended: Ended) -> int:
    """End this process the way the job ended: killed by its signal (a shell or a scheduler then sees
    exactly that), else its exit status. Returns the status for callers that cannot die here."""
    if ended.signal is not None:
        with contextlib.suppress(OSError, ValueError):  # a terminal that hung up
            sys.stdout.flush()
            sys.stderr.flush()
        with contextlib.suppress(OSError, ValueError):
            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the job's core dump, if any, is the job's
        with contextlib.suppress(OSError, ValueError):  # SIGKILL and SIGSTOP need (and allow) no reset
            signal.signal(ended.signal, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {ended.signal})
        os.kill(os.getpid(), ended.signal)
    return ended.status
