"""Who is writing a ring: host, process, rank, role, attempt, command line (secrets redacted), versions.

Read once at arm and stored in the ring's header metadata (``identity``).

Role: ``main`` for the job's own process (and for a rank its launcher started,
with ``RANK`` set); ``worker`` for a multiprocessing child (spawn or forkserver
DataLoader workers, which import the job's main module again); ``mp_service``
for multiprocessing's own helpers (the forkserver, the resource tracker);
``compile_worker`` for torch.compile's helper processes; ``child`` for any
other Python process started by a Python process of the job under ``blackbox
run``. Under ``blackbox run`` the job's own Python processes are ``main``: the
one it started, and any Python process with no Python process between it and
the job's start (a shell wrapper's, ``bash -c "python train.py; exit $?"``, a
``train.sh``), which ``FIRST_PY_ENV`` tells: the first Python process of each
branch of the job's process tree sets it to its own pid at start-up (where it is
not set), so every Python process below it sees another's.
Attempt: the launcher's restart count (torchrun's
``TORCHELASTIC_RESTART_COUNT``, Slurm's ``SLURM_RESTART_COUNT``), None where
there is no launcher that counts.
Job: the id every process of one job shares and another job does not, so that
recovery can tell the jobs of one folder apart (``job_id``): Slurm's
``SLURM_JOB_ID``; else ``blackbox run``'s run id where the run holds the whole
job (``RUN_JOB_ENV``: set by a ``blackbox run`` that no torchrun started, so
that ``blackbox run -- torchrun ...`` gives torchrun's agent and its ranks one
job, whatever ``--rdzv-id`` torchrun's ``--standalone`` picks); else
torchrun's ``TORCHELASTIC_RUN_ID`` (its ``--rdzv-id``;
``none``, torchrun's default without one, says nothing and gives None: a
``blackbox run`` per rank would otherwise give each rank a job of its own);
else ``blackbox run``'s run id (``BLACKBOX_RUN_ID``, its run folder's name),
unless the process is one rank of a launcher that started ``blackbox run`` per
rank (``RANK``, ``OMPI_COMM_WORLD_RANK`` or ``PMI_RANK`` set); else None. A
Kubernetes pod name is not used: a job of several pods has one per pod.

The command line is redacted before it reaches the disk: the value of any
option whose name says it is a secret (``--password``, ``--api-key``,
``--token``, ``--secret``, ``--credentials``...), values that look like a
known kind of key (``sk-...``, ``ghp_...``, ``hf_...``, ``AKIA...``, JSON web
tokens), and the password of a URL (``scheme://user:***@host``) become ``***``.
Environment variables are never recorded.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

from ..ring.liveness import boot_id, hostname

MAX_ARGV_CHARS = 16384
MAX_CODE_CHARS = 200  # of `python -c CODE`'s code, on one line
REDACTED = "***"
RUN_PID_ENV = "BLACKBOX_RUN_PID"  # set by `blackbox run`: its own pid, the job's parent
RUN_INIT_ENV = "BLACKBOX_RUN_INIT"  # set by a `blackbox run` that is its PID namespace's first process: that namespace
RUN_ID_ENV = "BLACKBOX_RUN_ID"  # set by `blackbox run`: its run folder's name, unique to the run
RUN_JOB_ENV = "BLACKBOX_RUN_JOB"  # set by a `blackbox run` that holds the whole job: its run id, every process's job
FIRST_PY_ENV = "BLACKBOX_RUN_PY"  # the pid of the first Python process of this branch of the job (run/bootstrap.py)
RANK_ENVS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")  # a launcher's rank: one of many processes
MAX_JOB_CHARS = 256
ATTEMPT_ENVS = ("TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT")

_SECRET_OPTION = re.compile(
    r"^--?[\w.-]*(pass(word|wd|phrase)?|secret|token|api[-_.]?key|access[-_.]?key|private[-_.]?key|"
    r"credentials?|auth|session[-_.]?key|signature)$",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    r"(sk-[A-Za-z0-9_-]{16,}|ghp_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|hf_[A-Za-z0-9]{20,}|"
    r"AKIA[0-9A-Z]{16}|xox[abprs]-[A-Za-z0-9-]{10,}|eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*)"
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*:)[^/\s@]*@")


def redact_value(text: str) -> str:
    """One argument with secret-looking parts replaced (keys by their shape, URL passwords)."""
    text = _URL_PASSWORD.sub(lambda m: f"{m.group('head')}{REDACTED}@", text)
    return _SECRET_VALUE.sub(REDACTED, text)


def redact_argv(argv: list[str]) -> list[str]:
    """The command line with secrets replaced by ``***`` (see the module docstring)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        name, eq, value = arg.partition("=")
        if _SECRET_OPTION.match(name):
            if eq:
                out.append(f"{name}={REDACTED}")
            else:
                out.append(arg)
                hide_next = True
            continue
        out.append(redact_value(arg))
    return out


def command_argv() -> list[str]:
    """``sys.argv``; for ``python -c CODE``, where ``sys.argv`` is ``['-c', ...]`` without the code, the code
    from ``sys.orig_argv`` on one line, its first ``MAX_CODE_CHARS`` (a summary's Command read ``-c``); for
    ``python -m MODULE`` armed before runpy set ``sys.argv[0]`` (``blackbox run``'s start), ``-m MODULE``."""
    argv = [str(a) for a in sys.argv]
    orig = [str(a) for a in getattr(sys, "orig_argv", ())]
    if argv[:1] == ["-m"] and "-m" in orig[:-1]:  # armed while runpy imports the module: its name from the command
        return ["-m", orig[orig.index("-m") + 1], *argv[1:]]
    if argv[:1] == ["-c"] and "-c" in orig[:-1]:
        code = " ".join(orig[orig.index("-c") + 1].split())
        return ["-c", code if len(code) <= MAX_CODE_CHARS else code[:MAX_CODE_CHARS] + "...", *argv[1:]]
    return argv


def bounded_argv(argv: list[str]) -> list[str]:
    out, used = [], 0
    for arg in argv:
        if used + len(arg) > MAX_ARGV_CHARS:
            out.append("...")
            break
        out.append(arg)
        used += len(arg)
    return out


def env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def attempt() -> int | None:
    """The launcher's restart count (0 for the first attempt), where a launcher counts them."""
    for name in ATTEMPT_ENVS:
        value = env_int(name)
        if value is not None:
            return value
    return None


def job_id() -> str | None:
    """The job's id, shared by its processes and by no other job (see the module docstring), or None."""
    if os.environ.get("SLURM_JOB_ID"):
        return os.environ["SLURM_JOB_ID"][:MAX_JOB_CHARS]
    if os.environ.get(RUN_JOB_ENV):
        return os.environ[RUN_JOB_ENV][:MAX_JOB_CHARS]
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        run_id = os.environ["TORCHELASTIC_RUN_ID"]
        return run_id[:MAX_JOB_CHARS] if run_id != "none" else None
    if any(os.environ.get(name) for name in RANK_ENVS):
        return None
    return os.environ.get(RUN_ID_ENV, "")[:MAX_JOB_CHARS] or None


def role() -> str:
    """``main``, ``worker``, ``compile_worker`` or ``child`` (see the module docstring). Works at
    ``sitecustomize`` time too, before multiprocessing is imported: it reads the whole command line."""
    command = " ".join(getattr(sys, "orig_argv", sys.argv))
    if "compile_worker" in command:
        return "compile_worker"
    if "--multiprocessing-fork" in command:
        return "worker"
    mp = sys.modules.get("multiprocessing")
    try:  # before the command line: a worker the forkserver forks has the forkserver's
        if mp is not None and mp.parent_process() is not None:
            return "worker"
    except Exception:  # an odd multiprocessing state: not a reason to fail arming
        pass
    if any(m in command for m in ("multiprocessing.forkserver", "multiprocessing.resource_tracker")):
        return "mp_service"
    if env_int("RANK") is not None:
        return "main"  # a rank its launcher started (torchrun): a job's main process of its own
    launcher, first = env_int(RUN_PID_ENV), os.environ.get(FIRST_PY_ENV)
    if launcher is not None and os.getppid() != launcher and first not in (None, str(os.getpid())):
        return "child"  # a Python process of the job started it
    return "main"


def start_method() -> str | None:
    """How multiprocessing started this process (``fork``, ``spawn``, ``forkserver``), None where it did
    not: the command line tells a spawn child (``--multiprocessing-fork``) and a forkserver's (the
    forkserver's own command line, which it inherits); any other multiprocessing child was forked."""
    command = " ".join(getattr(sys, "orig_argv", sys.argv))
    if "--multiprocessing-fork" in command:
        return "spawn"
    mp = sys.modules.get("multiprocessing")
    try:
        if mp is None or mp.parent_process() is None:
            return None
    except Exception:
        return None
    return "forkserver" if "multiprocessing.forkserver" in command else "fork"


def mp_parent() -> int | None:
    """The pid of the process that made this multiprocessing child (its Process object's), None where it is
    none: the parent for fork and spawn, the process that asked the forkserver (its parent) for one forked
    by a forkserver."""
    mp = sys.modules.get("multiprocessing")
    try:
        parent = mp.parent_process() if mp is not None else None
        pid = parent.pid if parent is not None else None
    except Exception:
        return None
    return pid if isinstance(pid, int) and not isinstance(pid, bool) else None


SPAWNED_RANK = "torch.multiprocessing.spawn process"  # mp.spawn's: a rank, whatever its parent's SIGTERM says
HELPER_TARGETS = {("torch.utils.data._utils.worker", "_worker_loop"): "DataLoader worker",
                  ("multiprocessing.pool", "worker"): "multiprocessing Pool worker",
                  ("torch.multiprocessing.spawn", "_wrap"): SPAWNED_RANK}  # fmt: skip


def helper_name() -> str | None:
    """What this multiprocessing child runs, by its Process's target (``DataLoader worker``,
    ``multiprocessing Pool worker``, else ``multiprocessing worker``); None where it is no such child or
    its Process is not known yet (a spawn child before its bootstrap)."""
    mp = sys.modules.get("multiprocessing")
    try:
        if mp is None or mp.parent_process() is None:
            return None
        target = getattr(mp.current_process(), "_target", None)
    except Exception:
        return None
    if target is None:
        return None
    key = (getattr(target, "__module__", None), getattr(target, "__qualname__", None))
    return HELPER_TARGETS.get(key, "multiprocessing worker")  # type: ignore[arg-type]


def identity() -> dict[str, Any]:
    """The ``identity`` object of a ring's header metadata."""
    return {
        "host": hostname(),
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "rank": env_int("RANK"),
        "local_rank": env_int("LOCAL_RANK"),
        "world_size": env_int("WORLD_SIZE"),
        "role": role(),
        "start_method": start_method(),
        "mp_parent": mp_parent(),
        "attempt": attempt(),
        "job": job_id(),
        "argv": bounded_argv(redact_argv(command_argv())),
        "boot_id": boot_id(),
        "start_ticks": start_ticks(),
        "pid_ns": pid_namespace(),
    }


def pid_namespace() -> str | None:
    """The process's pid namespace (``pid:[4026531836]``): containers on one host name reuse pids."""
    try:
        return os.readlink("/proc/self/ns/pid")[:64]
    except OSError:
        return None


def start_ticks() -> int | None:
    """The process's start time, in clock ticks since boot (``/proc/self/stat``, field 22): an ``exec`` keeps
    it, a pid used again by another process does not, so two rings of one pid and one start are one process
    that replaced its program (recovery tells the first ring's end so)."""
    try:
        with open("/proc/self/stat", "rb") as f:
            return int(f.read(4096).rsplit(b")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def versions(blackbox_version: str) -> dict[str, str | None]:
    import numpy

    torch = sys.modules.get("torch")  # never import torch ourselves
    return {
        "python": sys.version.split()[0],
        "numpy": numpy.__version__,
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "blackbox": blackbox_version,
    }


def parent_gone(ident: dict[str, Any]) -> bool:
    """Whether the process that started this one (``ppid`` at arm) has died since: this one was handed to
    another parent (a DataLoader worker whose main process was killed)."""
    ppid = ident.get("ppid")
    return isinstance(ppid, int) and not isinstance(ppid, bool) and os.getppid() != ppid


def stands_in_for_init() -> bool:
    """This process is its PID namespace's first process (a container's entrypoint, armed by ``arm()``), or stands
    for it: the job's own process of a ``blackbox run`` that is that first process (``RUN_INIT_ENV`` names that
    namespace, and it is this one: not a namespace the job made below it). The kernel gives that first process no
    signal it has no handler for (but a fault the kernel forced), whoever sent it: armed, the recorder's handler is in
    force, so the recorder drops such a signal, as the kernel would (the first process's own would otherwise be
    recorded as a death it did not die, and one standing for it would die of it)."""
    if os.getpid() == 1:
        return True
    ns = pid_namespace()
    return ns is not None and os.environ.get(RUN_INIT_ENV) == ns and os.getppid() == 1
