"""Run a command with blackbox armed in every Python process, then recover and diagnose what it left."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dir",
        metavar="D",
        help="folder for this run's rings and bundle (default: $BLACKBOX_DIR or /var/tmp/blackbox-<uid>, "
        "then run-<UTC time>-<pid>)",
    )
    parser.add_argument("--quiet", action="store_true", help="do not print the summary")
    parser.add_argument("job", nargs=argparse.REMAINDER, metavar="-- CMD...", help="the job to run")


def exit_status(returncode: int) -> int:
    """As a shell reports it: 128 + the signal number when a signal ended the job."""
    return 128 - returncode if returncode < 0 else returncode


def run(args: argparse.Namespace) -> int:
    from .._bootstrap import BOOT_ENV, SITECUSTOMIZE
    from .._bundle import SUMMARY, write_bundle
    from .._errors import BlackboxError
    from .._reader import find_rings
    from .._ringfile import default_dir

    command = args.job[1:] if args.job[:1] == ["--"] else args.job
    if not command:
        raise BlackboxError("expected a command after `--` (blackbox run -- python train.py ...), found none")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    work = Path(args.dir) if args.dir else default_dir() / f"run-{stamp}-{os.getpid()}"
    rings, bundle, boot = work / "rings", work / "bundle", work / ".boot"
    for d in (rings, boot):
        d.mkdir(mode=0o700, parents=True, exist_ok=True)
    (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
    package_parent = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(boot), package_parent, env.get("PYTHONPATH", "")) if p)
    env["BLACKBOX_DIR"] = str(rings)
    env[BOOT_ENV] = str(boot)
    print(f"blackbox run: rings in {rings}/", file=sys.stderr, flush=True)

    child = subprocess.Popen(command, env=env)
    forward = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
    previous = {s: signal.signal(s, lambda signum, _f: child.send_signal(signum)) for s in forward}
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
    status = exit_status(returncode)

    try:
        found = find_rings([rings])
    except BlackboxError:
        found = []
    if not found:
        print(
            f"blackbox run: the job left no ring in {rings}/ (not a Python job, or run with -S / -I)",
            file=sys.stderr,
        )
        return status
    meta = write_bundle([rings], bundle, exit_status=status)
    death = meta.get("death") or (meta.get("first_death") or {})
    print(
        f"blackbox run: exit status {status}; cause: {death.get('cause', 'n/a')}; bundle in {bundle}/",
        file=sys.stderr,
    )
    if not args.quiet:
        sys.stdout.write((bundle / SUMMARY).read_text())
    return status


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox run", argv)
