"""The verdict's one sentence (pure): who died of what, from the diagnosis's cause and its facts."""

from __future__ import annotations

import re
import signal
from typing import Any

from ..ring import format as fmt
from .allocs import site_of
from .crash import crash_headline, innermost_first, short_frame
from .exits import signal_of

MESSAGE_SAID = 120  # characters of an exception's message the headline says (its first line)
SGR = re.compile(r"\x1b\[[0-9;]*m")  # a terminal colour (IPython's tracebacks in nbconvert's message)
_NAMES_AN_ERROR = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b(:|$)")
TRACEBACK_SAID = 8  # frames of an exception's traceback the evidence says
_LEFT_OUT = re.compile(re.escape(fmt.FRAMES_LEFT_OUT).replace(r"\{\}", r"(\d{1,9})"))  # the frames it stands for

# What a signal with no sender (the kernel's) whose default action ended the process means (collect/signals.py,
# ENDINGS): it named no one, and a bare "ended by SIGXCPU" leaves the reader to look the limit up.
KERNEL_ENDINGS = {
    "SIGXCPU": "its CPU-time limit ran out (RLIMIT_CPU: `ulimit -t`, or a scheduler's CPU-time limit)",
    "SIGALRM": "an alarm (`alarm()`, `signal.alarm`, `setitimer`) that no handler took",
    "SIGVTALRM": "a virtual timer (`setitimer`) that no handler took",
    "SIGPROF": "a profiling timer (`setitimer`) that no handler took: a profiler's, left running after it",
    "SIGPIPE": "it wrote to a pipe or socket whose reader had gone (`| head` done, a `tee` killed)",
}


def headline(
    cause: str,
    victim: dict[str, Any],
    killed_by: dict[str, Any] | None,
    status: int | None,
    handled: dict[str, Any] | None = None,
    *,
    in_shutdown: bool = False,
    crash: dict[str, Any] | None = None,
    raised: dict[str, Any] | None = None,
    said: str | None = None,
) -> str:
    """One plain sentence: who died of what (``raised``: the exception's row, its type named; where the job
    caught it and exited, said so; ``said``: the message a failing ``sys.exit("...")`` printed)."""
    method = f", started by {victim['start_method']}" if victim.get("start_method") else ""
    who = f"The {victim.get('role', 'process')} (pid {victim.get('pid')}{method})"
    if cause == "signal" and crash and crash.get("signal"):
        return crash_headline(who, crash)
    sender = sender_named(killed_by)
    by = f" {killed_by['signal']} from {sender}" if killed_by and sender else ""
    if by and killed_by and killed_by.get("sender_pid") == victim.get("pid") and victim.get("pid"):
        by = f" {killed_by['signal']}, which it sent itself"
        if killed_by["signal"] == "SIGPIPE":  # the kernel's, for a write of its own (si_pid: the writer)
            by = f" SIGPIPE: {KERNEL_ENDINGS['SIGPIPE']}"
    if by and killed_by and killed_by.get("reason"):
        by += f": {str(killed_by['reason']).split(' (Slurm')[0]}"
    if cause == "killed" and killed_by and killed_by.get("dropped") and not in_shutdown:
        return (f"{who} was killed with SIGKILL after{by or ' ' + str(killed_by['signal'])}, which it had no handler "
                "for: as a container's first process it is spared such a signal, and it ran on until the SIGKILL.")
    if in_shutdown and cause == "killed":
        return f"{who} was killed with SIGKILL while it shut down{', after' + by if by else ''}, before it could exit."
    if in_shutdown and cause in ("signal", "interrupted") and by and not crash:
        return f"{who} was ended by{by} while it shut down, after its work."
    job = "The job" if victim.get("role", "main process") == "main process" else who  # a helper's own end
    kind = str((raised or {}).get("label") or "").split(":", 1)[0].strip()[:80]
    kind = kind if kind.replace(".", "").replace("_", "").isalnum() else ""  # a type's name, or none said
    if handled is not None:
        sent = f" from {handled['sender']}" if handled.get("sender") else ""
        if cause == "signal":  # its handler raised the exception it died of
            return f"{job} was ended by {handled['label']}{sent}: its handler raised {kind or 'an exception'}."
        if cause == "interrupted":
            return (f"The job was interrupted by {handled['label']}{sent}; it caught the KeyboardInterrupt and "
                    f"exited with status {status}.")  # fmt: skip
        n = handled.get("steps_after")  # (the job went on that many steps after it: no shutdown told)
        after = (f", {n} steps after {handled['label']}{sent}, which its own handler took." if n else
                 f" after {handled['label']}{sent}, which its own handler took (a graceful shutdown).")
        if cause == "clean_exit":
            return "The job exited cleanly" + after
        if cause == "nonzero_exit":
            return f"The job exited with status {status}" + after
    detail = str((raised or {}).get("detail") or "")
    site = raised_site(raised)
    at = f" at {site}" if site else ""
    if cause == "exception" and kind and detail.startswith(fmt.HANDLED_EXIT_PREFIX):
        article = "an" if kind[:1].lower() in "aeiou" else "a"
        return f"{job} died of {article} {kind}{at}, which it caught and exited with status {status}."
    message = _first_line(str((raised or {}).get("label") or "").partition(":")[2]) if kind else ""
    message = f': "{message if len(message) <= MESSAGE_SAID else message[: MESSAGE_SAID - 1] + "…"}"' if message else ""
    return {
        "clean_exit": f"{job} exited cleanly.",
        "nonzero_exit": f"{job} exited with status {status}" + (f', saying "{said}".' if said else "."),
        "interrupted": f"{job} was interrupted by{by}." if by else f"{job} was interrupted (Ctrl-C or SIGINT).",
        "exception": f"{job} died of an uncaught {kind or 'exception'}{at}{message}.",
        "oom_exception": f"{job} died of an out-of-memory exception{f' ({kind})' if kind else ''}{at}.",
        "host_oom_kill": f"{who} was killed by the kernel OOM killer.",
        "userspace_oom_kill": f"{who} was killed by a userspace OOM killer ({(killed_by or {}).get('sender')}).",
        "killed": f"{who} was killed with SIGKILL (no handler runs for it), after{by}." if by else
                  f"{who} was killed with SIGKILL (no handler runs for it), after {killed_by['signal']}." if killed_by
                  else f"{who} was killed with SIGKILL; no handler ran.",  # ("no handler ran" read as the SIGTERM's)
        "signal": f"{who} was ended by{by}." if by else f"{who} was ended by {_unsent(killed_by, status)}.",
    }.get(cause, "The cause of death is unknown.")


def raised_site(raised: dict[str, Any] | None) -> str | None:
    """Where an exception's row says it was raised: the innermost frame of the job's own code in its traceback
    (``load (train.py:4)``), else of a library's (``allocs.site_of``); None where no traceback was recorded."""
    folded = str((raised or {}).get("traceback") or "")
    return short_frame(site_of(folded)) if folded else None


def _first_line(message: str) -> str:
    """A message's first line with a word in it (torchelastic's ChildFailedError opens with a line of ``=``),
    its colours (ANSI SGR codes) left out. Where that line only announces what follows (it ends with ``:``:
    nbconvert's "An error occurred while executing the following cell:", papermill's) and a later line names
    an exception (``KeyError: 'labels'``, the cell's own error), the last such line."""
    lines = [ln.strip() for ln in SGR.sub("", message).splitlines()]
    first = next((ln for ln in lines if any(c.isalnum() for c in ln)), "")
    named = [ln for ln in lines if _NAMES_AN_ERROR.match(ln)] if first.endswith(":") else []
    return named[-1] if named else first


def raised_from(folded: str, frames: int = TRACEBACK_SAID) -> str:
    """A traceback as evidence says it, innermost frame first: ``load (train.py:4) ← main (train.py:9)``, the
    outer ones past ``frames`` counted."""
    stack = folded.split(";")
    cut = sum(int(m.group(1)) - 1 for f in stack[:-frames] if (m := _LEFT_OUT.fullmatch(f)))  # a placeholder's count
    more = f" ← … ({len(stack) - frames + cut} more)" if len(stack) > frames else ""
    return innermost_first(";".join(stack[-frames:])) + more


def short_text(text: str | None, n: int = 300) -> str:
    """``text`` on one line, without a terminal's colours (IPython's traceback in a message), cut at ``n``."""
    text = SGR.sub("", text or "").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def sent_from(row: dict[str, Any]) -> str:
    """`` from NAME (pid N)`` for a signal's sender; `` from pid N`` where it ended before it could be named (a
    /bin/kill); "" where none was recorded (the kernel's)."""
    pid = row.get("sender_pid")
    pid = pid if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None
    if row.get("sender"):
        return f" from {row['sender']} (pid {pid})" if pid else f" from {row['sender']}"
    return f" from pid {pid}" if pid else ""


SCHEDULERS = ("slurmstepd", "slurmd", "srun", "scancel", "kubelet", "containerd-shim", "timeout", "systemd")
# Launchers that tear a job's other processes down when one fails, by their command (as a signal's sender
# records it) -> the name said: torchrun's agent names its main thread pt_elastic, which /proc shows.
LAUNCHERS = {
    "pt_elastic": "torchrun",  # the agent's thread name, what a ring's own signal record shows
    "torchrun": "torchrun",
    "torch.distributed.run": "torchrun",  # `python -m torch.distributed.run`: a relayed signal names the module
    "torch.distributed.launch": "torchrun",
    "slurmstepd": "slurmstepd",
}
AGENTS = tuple(name for name, said in LAUNCHERS.items() if said == "torchrun")  # torchrun's agent, by its names
_INIT = "a container's init, passing on a signal it got: `docker stop`, a pod's deletion; who sent it is not recorded"
_PASSED = ", passing on a signal it got; who sent it is not recorded"
RELAYS = {  # senders that only pass on what they get (the job's ring names them, not who sent it to them)
    "tini": _INIT, "tini-static": _INIT, "docker-init": _INIT, "dumb-init": _INIT, "catatonit": _INIT,
    "uv": f"`uv run`{_PASSED}", "sudo": f"`sudo`{_PASSED}",
}  # fmt: skip


def sender_role(sender: str) -> str:
    """What a signal from ``sender`` meant, said after it: a scheduler's (its time limit, a preemption), a relay's
    (``RELAYS``: a container's init, `uv run`: not who sent it), or torchrun's
    agent stopping its ranks (it read "a scheduler" too: the agent stops them whatever ended it, or a rank; under
    `accelerate launch` too, whose agent is torchrun's: "the launcher")."""
    if sender in AGENTS:
        return " (the launcher stopping its ranks: one of them ended, or the launcher itself was stopped)"
    if sender in RELAYS:
        return f" ({RELAYS[sender]})"
    return " (a scheduler: time limit or preemption)" if sender in SCHEDULERS else ""


def still_running(victim: dict[str, Any]) -> str:
    """The verdict's sentence for a ring whose writer runs still (recovered while it ran: a process of the job
    left running after `blackbox run`'s job ended, or a snapshot taken by hand)."""
    return (f"The {victim.get('role') or 'process'} (pid {victim.get('pid')}) is still running: this is a snapshot "
            "of it, not a death.")  # fmt: skip


def _unsent(killed_by: dict[str, Any] | None, status: int | None) -> str:
    """A signal that ended the process with no sender named: as recorded (with what it means where the kernel
    sends it), else as the exit status names it."""
    name = str((killed_by or {}).get("signal") or "") or _signal_named(status)
    if not name:
        return "a signal"
    meaning = KERNEL_ENDINGS.get(name) if killed_by and not killed_by.get("sender_pid") else None
    return f"{name}: {meaning}" if meaning else name


def _signal_named(status: int | None) -> str | None:
    """The signal an exit status names (``SIGQUIT`` for 131 or -3), where it names one."""
    signum = signal_of(status)
    try:
        return signal.Signals(signum).name if signum is not None else None
    except ValueError:
        return None


def sender_named(killed_by: dict[str, Any] | None) -> str | None:
    """Who sent the signal: its command name (with what it is, for a sender that passes signals on: ``RELAYS``),
    else its pid (a sender that ended before the recorder read its name: ``/bin/kill``), else None."""
    if not killed_by:
        return None
    if killed_by.get("sender"):  # (one that passes signals on is said to: `docker run --init`'s tini, `uv run`)
        sender = str(killed_by["sender"])
        return f"{sender} ({RELAYS[sender]})" if sender in RELAYS else sender
    pid = killed_by.get("sender_pid")
    return f"pid {pid}" if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None
