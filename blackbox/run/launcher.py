"""``blackbox run``: start a job with every Python process armed, then recover what it left.

The job gets a folder holding a ``sitecustomize.py`` (see ``bootstrap``) first on
``PYTHONPATH`` and ``$BLACKBOX_DIR`` pointing at this run's ring folder. When it
ends, by any death, every ring it left is recovered into one bundle and the
job's exit status is returned as a shell reports it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._errors import BlackboxError
from .._postmortem import write_postmortem
from ..recovery.bundle import SUMMARY
from ..ring.file import default_dir
from ..ring.reader import find_rings
from .bootstrap import BOOT_ENV, SITECUSTOMIZE

FORWARDED = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)


@dataclass
class RunResult:
    """How a job run under blackbox ended, and where its bundle is (None when it left no ring)."""

    status: int
    bundle: Path | None
    meta: dict[str, Any] | None


def exit_status(returncode: int) -> int:
    """As a shell reports it: 128 + the signal number when a signal ended the job."""
    return 128 - returncode if returncode < 0 else returncode


def work_folder(requested: str | None) -> Path:
    """``--dir``, else a fresh ``run-<UTC time>-<pid>`` in the default ring folder."""
    if requested:
        return Path(requested)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    return default_dir() / f"run-{stamp}-{os.getpid()}"


def job_environment(rings: Path, boot: Path) -> dict[str, str]:
    """The job's environment: our sitecustomize and the package first on PYTHONPATH, rings in ``rings``."""
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(boot), package_parent, env.get("PYTHONPATH", "")) if p)
    env["BLACKBOX_DIR"] = str(rings)
    env[BOOT_ENV] = str(boot)
    return env


def launch(command: list[str], work: Path) -> int:
    """Run ``command`` armed; returns its exit status (as a shell reports it)."""
    rings, boot = work / "rings", work / ".boot"
    for d in (rings, boot):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
    child = subprocess.Popen(command, env=job_environment(rings, boot))
    previous = {s: signal.signal(s, lambda signum, _f: child.send_signal(signum)) for s in FORWARDED}
    try:
        while True:
            try:
                returncode = child.wait()
                break
            except KeyboardInterrupt:  # the job got the same Ctrl-C from the terminal: wait for it
                continue
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    return exit_status(returncode)


def run(command: list[str], work: Path) -> RunResult:
    """Launch the job, then recover every ring it left into ``work/bundle``."""
    rings, bundle = work / "rings", work / "bundle"
    print(f"blackbox run: rings in {rings}/", file=sys.stderr, flush=True)
    status = launch(command, work)
    try:
        found = find_rings([rings])
    except BlackboxError:
        found = []
    if not found:
        print(
            f"blackbox run: the job left no ring in {rings}/ (not a Python job, or run with -S / -I)",
            file=sys.stderr,
        )
        return RunResult(status, None, None)
    meta = write_postmortem([rings], bundle, exit_status=status)
    return RunResult(status, bundle, meta)


def summary_text(result: RunResult) -> str:
    """summary.md of the run's bundle ("" when there is none)."""
    return (result.bundle / SUMMARY).read_text() if result.bundle else ""
