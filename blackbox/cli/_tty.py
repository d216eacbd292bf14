"""What the command shows only to a person at a terminal: progress on long work, and colour.

Neither reaches a pipe or a file: progress goes to standard error only where standard error is a
terminal, colour to standard output only where standard output is one, and never where ``NO_COLOR``
is set (https://no-color.org) or ``TERM`` is ``dumb``. What a pipe receives is the same with or
without a terminal on the other streams.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from typing import TextIO

MIN_INTERVAL_S = 0.1  # a progress line is redrawn at most this often (but always at the last ring)
BOLD, UNDERLINE, RESET = "\x1b[1m", "\x1b[4m", "\x1b[0m"
_BOLD_SPAN = re.compile(r"\*\*([^*]+)\*\*")


def _terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty() and os.environ.get("TERM") != "dumb"
    except (AttributeError, ValueError):  # a stream that is closed, or no stream at all
        return False


def colour_on(stream: TextIO | None = None) -> bool:
    """Colour for ``stream`` (standard output): a terminal, and no ``NO_COLOR``."""
    return _terminal(stream or sys.stdout) and not os.environ.get("NO_COLOR")


@contextlib.contextmanager
def progress(what: str, stream: TextIO | None = None) -> Iterator[Callable[[int, int, str], None] | None]:
    """A callback ``(done, all, name)`` that redraws one line on a terminal's standard error (cleared
    at the end), or None where standard error is not a terminal: nothing is written then."""
    out = stream or sys.stderr
    if not _terminal(out):
        yield None
        return
    last = [0.0, False]

    def tick(done: int, total: int, name: str) -> None:
        now = time.monotonic()
        if done < total and now - float(last[0]) < MIN_INTERVAL_S:
            return
        last[0], last[1] = now, True
        label = re.sub(r"[\x00-\x1f\x7f-\x9f]", "?", os.path.basename(name))[-60:]
        out.write(f"\r\x1b[K{what} {done}/{total} {label}")
        out.flush()

    try:
        yield tick
    finally:
        if last[1]:
            out.write("\r\x1b[K")
            out.flush()


def colour_markdown(text: str) -> str:
    """summary.md for a terminal: headings bold and underlined, ``**bold**`` bold (the cause of death),
    without the asterisks. ``text`` is already printable (its control characters escaped), so these
    are the only escapes in it."""
    out = []
    for line in text.split("\n"):
        if line.startswith("#"):
            line = f"{BOLD}{UNDERLINE}{line.lstrip('#').strip()}{RESET}"
        else:
            line = _BOLD_SPAN.sub(lambda m: f"{BOLD}{m.group(1)}{RESET}", line)
        out.append(line)
    return "\n".join(out)
