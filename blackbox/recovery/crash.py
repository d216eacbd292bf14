"""A native crash, read from faulthandler's output: which signal, and the crashing thread's Python stack.

Pure functions over the text faulthandler wrote into the ring's crash region (``crash-<pid>.txt`` in the
bundle). Its first line names the fatal error ("Fatal Python error: Segmentation fault"); the block
headed "Current thread 0x... (most recent call first):" is the thread that crashed, one frame a line
(``  File "train.py", line 6 in die``). The stack is kept folded as the stack samples are (frames
``fn (path:line)``, outermost first, joined by ``;``), so the views show both alike.
"""

from __future__ import annotations

import os
import re
from typing import Any

from .allocs import site_of

# faulthandler's names of the fatal errors it handles -> the signal
FATAL = {"Segmentation fault": "SIGSEGV", "Aborted": "SIGABRT", "Floating-point exception": "SIGFPE",
         "Floating point exception": "SIGFPE", "Bus error": "SIGBUS", "Illegal instruction": "SIGILL"}  # fmt: skip
_FRAME = re.compile(r'^\s+File "(.*)", line (\d+|\?\?\?) in (.*)$')
_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
MAX_FRAMES = 100  # faulthandler writes at most 100 frames a thread


SHUTDOWN = re.compile(r"^Stack of every thread at (SIG[A-Z0-9]+), while the process shut down\s*$")


def shutdown_signal(text: str | None) -> str | None:
    """The signal whose stacks the C handler wrote as the process shut down, after its clean end (its first
    line: ``Stack of every thread at SIGTERM, while the process shut down``), else None."""
    m = SHUTDOWN.match((text or "").split("\n", 1)[0])
    return m[1] if m else None


def crash_signal(text: str | None) -> str | None:
    """The signal faulthandler's first line names (``SIGSEGV``), None where it names none."""
    for line in (text or "").splitlines()[:5]:
        m = re.match(r"Fatal Python error: (.+?)\s*$", line)
        if m:
            return FATAL.get(m[1])
    return None


def crashing_stack(text: str | None) -> str | None:
    """The crashing thread's Python stack, folded (outermost first); None where no thread is marked current
    (a crash outside any Python thread) or its block holds no frame."""
    frames: list[str] | None = None
    for line in (text or "").splitlines():
        thread = _THREAD.match(line)
        if thread:
            if frames is not None:
                break  # the current thread's block has ended
            frames = [] if thread[1] == "Current thread" else None
            continue
        m = _FRAME.match(line) if frames is not None else None
        if m and frames is not None and len(frames) < MAX_FRAMES:
            frames.append(f"{m[3]} ({m[1]}:{m[2]})")
        elif frames and not line.strip():
            break
    return ";".join(reversed(frames)) if frames else None


def short_frame(frame: str) -> str:
    """``fn (/a/b/train.py:12)`` -> ``fn (train.py:12)``: the file's base name."""
    name, sep, where = frame.rpartition(" (")
    return f"{name} ({os.path.basename(where)}" if sep else frame


def innermost_first(stack: str) -> str:
    """A folded stack as one line, innermost frame first, short file names: ``die (train.py:6) ← main (...)``."""
    return " ← ".join(short_frame(f) for f in reversed(stack.split(";")))


# The fault's native frame, which the C signal handler adds after the tracebacks (``_cwriter.c``, native_frame)
_NATIVE = re.compile(r"^Native frame: instruction (0x[0-9a-f]{1,16}) in (?:(no mapping|an anonymous mapping)|"
                     r"(/[^\n]{1,400}) at file offset (0x[0-9a-f]{1,16}))[ \t]*$", re.MULTILINE)  # fmt: skip


def native_frame(text: str | None) -> dict[str, Any] | None:
    """The faulting instruction and what holds it: ``{"instruction": "0x7f..", "file": "/usr/lib/libc.so.6",
    "offset": "0x167ad8"}`` (``file`` None, ``mapping`` said, where no file holds it); None where not written."""
    m = _NATIVE.search(text or "")
    if m is None:
        return None
    return {"instruction": m[1], "file": m[3], "offset": m[4], "mapping": m[2]}


def _frame_words(frame: dict[str, Any] | None) -> tuple[str, str]:
    """(the headline's ", in libc.so.6", the evidence's sentence) of a native frame."""
    if frame is None:
        return "", ""
    if frame["file"] is None:
        null = frame["instruction"] == "0x0"
        return (", a call through a null function pointer" if null else f", in {frame['mapping']}",
                f"; the faulting instruction {frame['instruction']} is in {frame['mapping']}"
                f"{': a call through a null function pointer' if null else ''}")  # fmt: skip
    return f", in {os.path.basename(frame['file'])}", (
        f"; the faulting instruction {frame['instruction']} is in {frame['file']} at file offset {frame['offset']} "
        f"(`addr2line -f -e {frame['file']} {frame['offset']}` names its function)")


def crash_reading(pid: Any, text: str | None) -> dict[str, Any] | None:
    """``native_crash`` of a ring's metadata: the bundle ``file`` that holds faulthandler's tracebacks, its
    ``first_line``, the ``signal`` it names, the crashing thread's ``stack`` (folded) and ``site`` (its
    innermost frame of the job's own code); None without a crash. The same for ``shutdown_stacks`` (the
    stacks at a signal that ended the shutdown: ``shutdown_signal``), ``stack`` the thread that took it."""
    if text is None:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    stack = crashing_stack(text)
    return {"file": f"crash-{pid}.txt", "first_line": lines[0] if lines else "",
            "signal": crash_signal(text) or shutdown_signal(text), "stack": stack,
            "site": site_of(stack) if stack else None, "native_frame": native_frame(text)}  # fmt: skip


def native_crash(
    text: str | None, status_signal: str | None, pid: Any, signals: Any = ()
) -> tuple[dict[str, Any], str]:
    """(the crash as the headline tells it: ``signal``, ``site``, ``fault``; the evidence line) of a fatal
    signal in native code, from faulthandler's output: the signal it names (else the exit status's), the
    crashing thread's Python stack, and the file that holds every thread's; from the process's ``signals``
    rows, the fault the kernel raised (``fault_of``) or the process that sent the signal (``sent``)."""
    name = crash_signal(text) or status_signal
    stack = crashing_stack(text)
    first = next((ln for ln in (text or "").splitlines() if ln.strip()), "")
    shown = innermost_first(stack) if stack else "none (no Python thread)"
    row = _record_of(signals, name)
    fault = fault_of(name, row.get("signal_code"), row.get("address")) if row is not None else None
    if fault is not None:
        words = _frame_words(native_frame(text))
        fault = (fault[0] + words[0], fault[1] + words[1])
    crash: dict[str, Any] = {"signal": name, "site": site_of(stack) if stack else None,
                             "fault": fault[0] if fault else None, "fault_told": fault[1] if fault else None}
    if row is not None and _sent(row, pid):
        crash["sent"] = row  # (the diagnosis names its sender: ``killed_by``)
        return crash, (f"{name} from {_sent_by(row)} at {row['time']}: sent to it, not a crash in native code; "
                       f'faulthandler\'s "{first}" (crash-{pid}.txt) shows where each thread was: the one that took '
                       f"it, innermost frame first: {shown}")  # fmt: skip
    return crash, (
        f'{name or "a fatal signal"} in native code: faulthandler\'s "{first}" (crash-{pid}.txt); the crashing '
        f"thread's Python stack, innermost frame first: {shown}{'; ' + fault[1] if fault else ''}")  # fmt: skip


def crash_headline(who: str, crash: dict[str, Any]) -> str:
    """``The main process (pid 7) died of SIGSEGV in native code (a null pointer: address 0x0), called from die
    (train.py:7).``"""
    site = f", called from {short_frame(crash['site'])}" if crash.get("site") else ""
    if crash.get("sent"):
        where = f", in {short_frame(crash['site'])}" if crash.get("site") else ""
        return f"{who} was ended by {crash['signal']} from {_sent_by(crash['sent'])}, sent to it (not a crash){where}."
    fault = f" ({crash['fault']})" if crash.get("fault") else ""
    return f"{who} died of {crash['signal']} in native code{fault}{site}."


# A fault the kernel raised for an instruction: (signal, si_code) -> its name and what it means
_FAULTS = {("SIGSEGV", 1): ("SEGV_MAPERR", "no memory is mapped at {a}"),
           ("SIGSEGV", 2): ("SEGV_ACCERR", "the memory at {a} does not allow that access (a write to read-only "
                                           "memory, or code run from data)"),
           ("SIGSEGV", 128): ("SI_KERNEL", "a general protection fault (a non-canonical address: a pointer "
                                           "overwritten with data)"),
           ("SIGBUS", 1): ("BUS_ADRALN", "a misaligned access at {a}"),
           ("SIGBUS", 2): ("BUS_ADRERR", "{a} lies past the end of a mapped file (a file truncated while mapped, "
                                         "or /dev/shm full)"),
           ("SIGBUS", 3): ("BUS_OBJERR", "a hardware error for the object at {a}"),
           ("SIGBUS", 4): ("BUS_MCEERR_AR", "an uncorrectable memory error the hardware reported at {a}"),
           ("SIGFPE", 1): ("FPE_INTDIV", "an integer division by zero, at instruction {a}"),
           ("SIGFPE", 2): ("FPE_INTOVF", "an integer overflow, at instruction {a}")}  # fmt: skip
ILLEGAL = "an illegal instruction at {a} (code built for a CPU feature this one lacks, or a corrupt jump)"
NULL_PAGE = 4096  # an address below it is a null pointer (or a field of a null struct)


def fault_of(signal: str | None, code: Any, address: Any) -> tuple[str, str] | None:
    """(the headline's words, the evidence's) of a fault the kernel raised, from the signal record's
    ``signal_code`` and ``address`` (version 5); None for any other signal, or an older ring's record."""
    if signal is None or code is None or address is None or not 0 < int(code) <= 128:
        return None
    at = f"address {int(address) & (2**64 - 1):#x}"
    if signal == "SIGILL":
        name, means = f"si_code {int(code)}", ILLEGAL
    elif (signal, int(code)) in _FAULTS:
        name, means = _FAULTS[signal, int(code)]
    else:
        name, means = f"si_code {int(code)}", "a fault at {a}"
    null = signal == "SIGSEGV" and int(code) == 1 and 0 <= int(address) < NULL_PAGE
    short = f"a null pointer: {at}" if null else means.format(a=at).split(" (")[0]
    log = _KERNEL_LOG.get(signal)
    told = f"; the kernel log (dmesg) has its {log} line, which names the instruction and its library" if log else ""
    return short, (f"the kernel raised it for an instruction ({name}): {means.format(a=at)}"
                   f"{': a null pointer' if null else ''}{told}")


_KERNEL_LOG = {"SIGSEGV": '"segfault at"', "SIGFPE": '"trap divide error"', "SIGILL": '"trap invalid opcode"'}


def _record_of(signals: Any, name: str | None) -> dict[str, Any] | None:
    """The last record of the crash signal ``name`` among a process's signal rows."""
    return next((s for s in reversed(list(signals)) if s["label"] == name), None) if name else None


def _sent(row: dict[str, Any], pid: Any) -> bool:
    """The signal's record says another process sent it (``kill -SEGV``, ``kill -ABRT`` to have a hung job dump
    its stacks and a core): no crash in native code. Not where the kernel raised it, or the process itself did
    (abort(), a library's raise)."""
    return row.get("sender_pid") is not None and (row.get("signal_code") or 0) <= 0 and \
        str(row["sender_pid"]) != str(pid)  # fmt: skip


def _sent_by(row: dict[str, Any]) -> str:
    return f"{row['sender'] or 'a process'} (pid {row['sender_pid']})"


def shutdown_where(text: str | None, signal: str, frames: int = 4) -> str:
    """``in poll (popen_fork.py:27) ← wait (popen_fork.py:43) ← …``: where the thread that took ``signal`` was
    as it ended the shutdown (``shutdown_signal``'s text), innermost frames first; "" where that text is not
    this signal's or holds no frame."""
    stack = crashing_stack(text) if shutdown_signal(text) == signal else None
    if not stack:
        return ""
    parts = stack.split(";")
    shown = innermost_first(";".join(parts[-frames:]))
    return f"in {shown}{' ← …' if len(parts) > frames else ''}"


def faulthandler_frame(stack: str) -> str:
    """The innermost frame of faulthandler's stack (``  File "x.py", line 5 in f``) as ``f (x.py:5)``."""
    m = re.search(r'File "(.*)", line (\d+) in (.*)', stack)
    return f"{m[3]} ({m[1]}:{m[2]})" if m else "a frame faulthandler could not name"
