"""Follow a running job's ring read-only: memory, headroom to each limit, growth rate, step."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ring", help="the ring file of a running job")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    parser.add_argument("--once", action="store_true", help="print one frame and exit")


def run(args: argparse.Namespace) -> int:
    from ..ring.liveness import writer_alive
    from ..ring.reader import read_ring
    from ..views.live import frame

    tty = sys.stdout.isatty()
    try:
        while True:
            ring = read_ring(Path(args.ring))
            running = writer_alive(ring.path, ring.meta) and not ring.clean
            text = frame(ring, running)
            sys.stdout.write(("\x1b[H\x1b[2J" if tty else "") + text + ("" if tty else "\n"))
            sys.stdout.flush()
            if args.once or not running:
                return 0
            time.sleep(max(0.05, args.interval))
    except KeyboardInterrupt:
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox watch", argv)
