"""Text from rings and bundles as it is shown: every control and format character escaped.

Host names, argv, thread and frame names, labels, exception messages and signal
senders were written by whoever ran the job, and summary.md reaches a terminal
(root's, in an epilogue): an escape sequence there sets a window title, clears
the screen or draws a fake prompt; a newline forges a line; a bidi override
reverses what is read. Rendering escapes them (``one_line``: ``\\x1b``, ``\\n``,
``\\u202e``); the data (timeline.parquet, metadata.json) keeps them as written.
"""

from __future__ import annotations

from typing import Any

from .._errors import one_line

_PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")  # what a backslash escapes in CommonMark
MAX_DEPTH = 64  # metadata nested deeper than this (only a planted bundle is) is not shown


def shown(value: Any, depth: int = 0) -> Any:
    """``value`` (metadata: dicts, lists, strings, numbers) with every string escaped (keys too)."""
    if isinstance(value, str):
        return one_line(value)
    if depth > MAX_DEPTH and isinstance(value, (dict, list, tuple)):
        return "..."
    if isinstance(value, dict):
        return {shown(k): shown(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown(v, depth + 1) for v in value]
    return value


def inert(markdown: str) -> str:
    """``markdown`` with no link, image, HTML tag or autolink that its text could form (the module's note);
    blackbox's own links are reference links (``[text][label]``), which this leaves."""
    return "\n".join(_inert_line(line) if "](" in line or "<" in line else line for line in markdown.split("\n"))


def as_text(markdown: str) -> str:
    """summary.md to be read as text (a terminal, a log), not rendered: ``inert``'s escapes taken out."""
    return markdown.replace("]\\(", "](").replace("\\<", "<")


def _inert_line(line: str) -> str:
    out: list[str] = []
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c == "\\" and i + 1 < n and line[i + 1] in _PUNCTUATION:  # an escaped character: as it is
            out.append(line[i : i + 2])
            i += 2
        elif c == "`":  # a code span runs to the next run of as many backticks; without one, the run is text
            end = _run_end(line, i)
            close = _closing(line, end, end - i)
            out.append(line[i : close if close else end])
            i = close or end
        elif c == "]" and line.startswith("(", i + 1):
            out.append("]\\(")
            i += 2
        elif c == "<" and i + 1 < n and (line[i + 1].isascii() and line[i + 1].isalpha() or line[i + 1] in "/!?"):
            out.append("\\<")
            i += 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _run_end(line: str, i: int) -> int:
    while i < len(line) and line[i] == "`":
        i += 1
    return i


def _closing(line: str, start: int, length: int) -> int | None:
    """The end of the first run of exactly ``length`` backticks from ``start``, if any."""
    i = line.find("`", start)
    while i >= 0:
        end = _run_end(line, i)
        if end - i == length:
            return end
        i = line.find("`", end)
    return None
