"""``folded.jsonl``: helpers of a ``blackbox run`` job that ended cleanly, one JSON line each.

A helper process (a multiprocessing worker, a torch.compile worker, another
Python subprocess of the job) that ends cleanly under ``blackbox run`` leaves no
ring: it appends one line here and removes its ring, so hundreds of short-lived
helpers cost a few hundred bytes each. A line holds ``pid``, ``ppid``, ``role``,
``argv`` (its first three words, redacted at arm), ``started_at``, ``ended_at``
(UTC ISO-8601), ``peak_rss`` (bytes, -1 if unknown) and ``rank``. Readers treat
the file as untrusted: bounded size, one JSON object per line, fields checked.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from .._errors import BlackboxError
from .inputs import Folder, folder_at, open_input, read_at

FOLDED = "folded.jsonl"
MAX_FOLDED_BYTES = 16 << 20
MAX_LINE = 4096


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns / 1e9)) + f".{(ns // 1000) % 1_000_000:06d}Z"


def fold_line(ident: dict[str, Any], started_ns: int, peak_rss: int) -> bytes:
    """The line for one helper that ended cleanly now."""
    entry = {
        "pid": ident.get("pid"),
        "ppid": ident.get("ppid"),
        "rank": ident.get("rank"),
        "role": ident.get("role"),
        "argv": list(ident.get("argv") or [])[:3],
        "started_at": _iso(started_ns),
        "ended_at": _iso(time.time_ns()),
        "peak_rss": peak_rss,
    }
    line = json.dumps(entry, separators=(",", ":"))
    return (line[: MAX_LINE - 1] if len(line) >= MAX_LINE else line).encode() + b"\n"


_FIELDS: dict[str, tuple[type, ...]] = {
    "pid": (int,),
    "ppid": (int,),
    "rank": (int, type(None)),
    "role": (str,),
    "argv": (list,),
    "started_at": (str,),
    "ended_at": (str,),
    "peak_rss": (int,),
}


def read_folded(folder: Folder | Path, owners: Collection[int] = ()) -> list[dict[str, Any]]:
    """The folded helpers of a ring folder; lines that are not such an object are skipped. The file is
    read as untrusted input (``inputs``): a regular file of the folder's owner or of ``owners`` (the
    owners of the rings recovered from it), never through a link; anything else counts as no file."""
    try:
        with folder_at(folder) as where:
            fd, _ = open_input(where, FOLDED, {where.uid, *owners}, "a folded.jsonl of the rings' owner")
    except BlackboxError:
        return []
    try:
        data = read_at(fd, MAX_FOLDED_BYTES, 0)
    finally:
        os.close(fd)
    out = []
    for raw in data.splitlines():
        if len(raw) > MAX_LINE:
            continue
        try:
            entry = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(entry, dict) and all(isinstance(entry.get(k), t) for k, t in _FIELDS.items()):
            if all(isinstance(a, str) for a in entry["argv"]) and not isinstance(entry["pid"], bool):
                out.append({k: entry[k] for k in _FIELDS})
    return out
