"""Slurm's own account of why it ended a job: its time limit, a cancel, a requeue, its memory limit.

A SIGTERM from ``slurmstepd`` looks the same whatever Slurm meant by it. Where
Slurm's account can be read (``scontrol show job`` answers while the job is still
known to slurmctld: during ``blackbox run``'s recovery inside the job, and in the
epilogue), it says which: a requeue raised the job's ``Restarts`` beyond the
ring's own attempt (``SLURM_RESTART_COUNT``); a time limit is a run time at the
job's ``TimeLimit``; a final state names the others (``TIMEOUT``, ``CANCELLED``,
``PREEMPTED``, ``NODE_FAIL``, ``OUT_OF_MEMORY``, ``DEADLINE``); a job still
completing at neither is a cancel (``scancel``). ``scontrol`` is looked for on
PATH and where Slurm's packages put it (an epilogue has no PATH), asked once per
job id (digits only) with a short time limit; where it is missing or does not
know the job, nothing is said.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from typing import Any

BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin", "/bin")
TIMEOUT_S = 5.0
MAX_OUTPUT = 1 << 16
_FIELD = re.compile(r"(\w+)=(\S*)")
FINAL = {
    "TIMEOUT": "the job's time limit",
    "CANCELLED": "a cancel (scancel)",
    "PREEMPTED": "preemption",
    "NODE_FAIL": "a node failure",
    "OUT_OF_MEMORY": "Slurm's memory limit",
    "DEADLINE": "the job's deadline",
    "BOOT_FAIL": "a node boot failure",
}
SENDERS = ("slurmstepd", "slurmd", "slurmctld", "srun")


@functools.lru_cache(maxsize=32)
def account(job_id: str) -> dict[str, str] | None:
    """``scontrol show job``'s fields for ``job_id`` (the first value of each name), or None."""
    if not job_id.isdigit() or len(job_id) > 20:
        return None
    exe = shutil.which("scontrol") or shutil.which("scontrol", path=os.pathsep.join(BIN_DIRS))
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "-o", "show", "job", job_id], capture_output=True, timeout=TIMEOUT_S,
                              stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    text = proc.stdout[:MAX_OUTPUT].decode("utf-8", "replace")
    if proc.returncode != 0 or f"JobId={job_id}" not in text:
        return None
    fields: dict[str, str] = {}
    for m in _FIELD.finditer(text):
        fields.setdefault(m.group(1), m.group(2)[:256])
    return fields


def seconds(text: str | None) -> int | None:
    """Slurm's ``[D-]HH:MM:SS`` (or ``MM:SS``) in seconds; None for UNLIMITED or what is not a time."""
    m = re.fullmatch(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+)", text or "")
    if not m:
        return None
    days, hours, minutes, secs = (int(g) if g else 0 for g in m.groups())
    return ((days * 24 + hours) * 60 + minutes) * 60 + secs


def why_ended(fields: dict[str, str], attempt: int | None) -> str | None:
    """Why Slurm ended the attempt ``attempt`` (its ``SLURM_RESTART_COUNT``, None for the first), in
    words with the fields that say it; None where the account does not tell."""
    restarts = fields.get("Restarts", "")
    if restarts.isdigit() and int(restarts) > (attempt or 0):
        return f"a requeue (Slurm's account: Restarts={restarts}, this attempt {attempt or 0})"
    state = fields.get("JobState", "")
    if state in FINAL:
        return f"{FINAL[state]} (Slurm's account: JobState={state})"
    limit, ran = seconds(fields.get("TimeLimit")), seconds(fields.get("RunTime"))
    if limit is not None and ran is not None and ran >= limit:
        return f"the job's time limit (Slurm's account: RunTime={fields['RunTime']}, TimeLimit={fields['TimeLimit']})"
    if state == "COMPLETING":
        return f"a cancel (scancel) (Slurm's account: JobState={state}, within its time limit, not requeued)"
    if state == "RUNNING":
        return "a signal sent through Slurm while the job runs (scancel -s or --signal; Slurm's account: RUNNING)"
    return None


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def size(text: str | None) -> int | None:
    """Slurm's memory size (``200M``, ``4G``; a bare number is MiB) in bytes; None for 0 or what is not one."""
    m = re.fullmatch(r"(\d{1,12})([KMGT]?)", text or "")
    if not m or int(m.group(1)) == 0:
        return None
    return int(m.group(1)) * _UNITS.get(m.group(2) or "M", 1 << 20)


def memory_limit(fields: dict[str, str]) -> int | None:
    """The job's memory limit on each node (``--mem``, or ``--mem-per-cpu`` times its CPUs on a node)."""
    per_node = size(fields.get("MinMemoryNode"))
    if per_node is not None:
        return per_node
    per_cpu, cpus, nodes = size(fields.get("MinMemoryCPU")), fields.get("NumCPUs", ""), fields.get("NumNodes", "1")
    if per_cpu is None or not cpus.isdigit() or not nodes.isdigit() or int(nodes) == 0:
        return None
    return per_cpu * max(1, int(cpus) // int(nodes))


def slurm_account(ident: dict[str, Any]) -> tuple[str | None, int | None]:
    """(why Slurm ended the job a ring's identity names, the job's memory limit per node), where
    ``scontrol`` knows the job."""
    job, attempt = ident.get("job"), ident.get("attempt")
    fields = account(job) if isinstance(job, str) else None
    if not fields:
        return None, None
    return why_ended(fields, attempt if isinstance(attempt, int) else None), memory_limit(fields)
