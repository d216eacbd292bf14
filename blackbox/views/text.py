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
