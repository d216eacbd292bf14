"""The verdict in one line where people look when a job dies: Kubernetes' termination message (what
``kubectl describe pod`` shows under Last State) and the Slurm job's comment (``squeue``, ``scontrol show
job``, ``sacct -o Comment``).

Kubernetes reads the file at ``terminationMessagePath`` (``/dev/termination-log`` unless the pod says
otherwise; ``BLACKBOX_TERMINATION_LOG`` names another) when the container ends, at most 4096 bytes of it.
``blackbox run`` writes its verdict there only where the file exists (the kubelet made it: we are in a
pod), is a regular file we can write, and the job left it empty: the job's own message wins. Opened
without following links and never created. A snapshot's message (``SNAPSHOT``: the job outlived the
signal sent to end it, and a SIGKILL may come before its end) is the one the verdict of its end replaces.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from typing import Any

from .._errors import one_line

TERMINATION_LOG = "/dev/termination-log"
TERMINATION_ENV = "BLACKBOX_TERMINATION_LOG"
MAX_MESSAGE = 4096  # bytes Kubernetes keeps of a termination message
SNAPSHOT = "blackbox: still running"  # how a snapshot's message begins: the end's verdict may replace it
MAX_COMMENT = 1000  # characters of a Slurm job's comment we write (scontrol takes more; squeue shows less)
SBIN = ("/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin", "/bin", "/sbin")


def verdict_line(meta: dict[str, Any], bundle: str | None = None) -> str:
    """``blackbox: CAUSE (CONFIDENCE): HEADLINE [alerts: ...] bundle: PATH``: the first death, and what the
    alerts of its process said before it (the first that mattered, the signal and the job's handler)."""
    death = meta.get("first_death") or meta.get("death") or {}
    text = f"blackbox: {meta.get('cause', 'unknown')}"
    if death.get("confidence"):
        text += f" ({death['confidence']})"
    if death.get("headline"):
        text += f": {death['headline']}"
    report = _alerts_of(meta, death)
    if report:
        from ..recovery.alerts import lines

        said = [s for s in lines(report) if not s.startswith("the forecasts did not")]
        if said:
            text += " Before it: " + "; ".join(said[:2]) + "."
    if bundle:
        text += f" Bundle: {bundle}"
    return one_line(text)


def _alerts_of(meta: dict[str, Any], death: dict[str, Any]) -> dict[str, Any] | None:
    """The ``alerts`` of the process that died first (one ring's metadata, or the ring of that pid)."""
    if "alerts" in meta:
        return meta.get("alerts")
    for ring in meta.get("rings") or []:
        if isinstance(ring, dict) and ring.get("pid") == death.get("pid") and ring.get("host") == death.get("host"):
            return ring.get("alerts")
    return None


def termination_message(line: str, path: str | None = None) -> str | None:
    """Write ``line`` as the pod's termination message; the file written, or None (not in a pod, not ours to
    write, or the job wrote its own). A snapshot's message there is replaced."""
    path = path or os.environ.get(TERMINATION_ENV) or TERMINATION_LOG
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size:
            if os.pread(fd, len(SNAPSHOT), 0) != SNAPSHOT.encode():
                return None
            os.ftruncate(fd, 0)
        os.pwrite(fd, line.encode("utf-8", "replace")[:MAX_MESSAGE], 0)
        return path
    except OSError:
        return None
    finally:
        os.close(fd)


def slurm_comment(job: str, line: str, timeout: float = 10.0) -> str:
    """Make ``line`` the Slurm job's comment; what happened, in a few words. ``scontrol update`` while the
    job runs (``blackbox run`` is the job's own process: its user may); a finished job (the epilogue)
    refuses it on Slurm 22.05 ("Job has already finished"), so there the accounting database's record is
    changed instead (``sacctmgr modify job``, where slurmdbd keeps one: ``sacct -o Comment`` shows it)."""
    comment = line[:MAX_COMMENT].replace("\n", " ")
    said = _slurm(["scontrol", "update", f"JobId={job}", f"Comment={comment}"], timeout)
    if said is None:
        return "the verdict is the job's comment (scontrol show job)"
    if "finished" not in said:
        return f"no comment: {said}"
    later = _slurm(["sacctmgr", "-i", "modify", "job", "where", f"JobId={job}", "set", f"Comment={comment}"], timeout)
    if later is None:
        return "the verdict is the job's comment in the accounting database (sacct -o Comment)"
    return f"no comment: {said}; {later}"


def _slurm(argv: list[str], timeout: float) -> str | None:
    """Run a Slurm client; None where it succeeded, else what went wrong."""
    program = shutil.which(argv[0]) or shutil.which(argv[0], path=os.pathsep.join(SBIN))
    if program is None:
        return f"{argv[0]} not found"
    try:
        done = subprocess.run([program, *argv[1:]], capture_output=True, text=True, timeout=timeout, check=False,
                              stdin=subprocess.DEVNULL)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {type(exc).__name__}"
    if done.returncode:
        return f"{argv[0]} said: {one_line((done.stderr or done.stdout).strip())[:200]}"
    return None
