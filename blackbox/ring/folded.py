"""``folded.jsonl``: helpers of a ``blackbox run`` job that ended cleanly, one JSON line each.

A helper process (a multiprocessing worker, a torch.compile worker, another
Python subprocess of the job) that ends cleanly under ``blackbox run`` leaves no
ring: it appends one line here and removes its ring, so hundreds of short-lived
helpers cost a few hundred bytes each. A line holds ``pid``, ``ppid``, ``role``,
``argv`` (its first three words, redacted at arm), ``started_at``, ``ended_at``
(UTC ISO-8601), ``peak_rss`` (bytes, -1 if unknown), ``rank``, for a multiprocessing
child ``name`` (what it ran: ``DataLoader worker``, ``multiprocessing Pool worker``) and
``start_method`` (``fork``, ``spawn``, ``forkserver``) where known, and, where its allocations were
sampled, ``sites``: its largest allocation sites live at its end (``site``, ``thread``, ``line``,
``live_bytes``, ``error_bytes``, ``blocks``; at most three, fewer where the line would pass 4 KiB).
A helper whose parent died before it ended is not folded: its ring is kept. Readers treat
the file as untrusted: bounded size, one JSON object per line, fields checked.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from .._errors import BlackboxError
from .inputs import Folder, folder_at, open_input, read_at

FOLDED = "folded.jsonl"
MAX_FOLDED_BYTES = 16 << 20
MAX_LINE = 4096
MAX_SITES = 3  # allocation sites kept per folded helper


def _iso(ns: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns / 1e9)) + f".{(ns // 1000) % 1_000_000:06d}Z"


def fold_line(ident: dict[str, Any], started_ns: int, peak_rss: int, sites: Sequence[dict[str, Any]] = ()) -> bytes:
    """The line for one helper that ended cleanly now; ``sites``: its largest allocation sites (as many as fit
    the line)."""
    entry: dict[str, Any] = {
        "pid": ident.get("pid"),
        "ppid": ident.get("ppid"),
        "rank": ident.get("rank"),
        "role": ident.get("role"),
        "argv": list(ident.get("argv") or [])[:3],
        "started_at": _iso(started_ns),
        "ended_at": _iso(time.time_ns()),
        "peak_rss": peak_rss,
    }
    said = {"name": ident.get("helper"), "start_method": ident.get("start_method")}
    entry |= {k: v for k, v in said.items() if isinstance(v, str)}
    kept = list(sites)[:MAX_SITES]
    while True:
        line = json.dumps({**entry, "sites": kept} if kept else entry, separators=(",", ":"))
        if len(line.encode()) < MAX_LINE or not kept:
            break
        kept.pop()  # the smallest site first: the line stays whole JSON
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


# str fields a line may hold: plain words (they are written into summary.md, so never markup or a new line)
_OPTIONAL = {"name": re.compile(r"[A-Za-z0-9 ._-]{1,64}"), "start_method": re.compile(r"fork|spawn|forkserver")}


_SITE_FIELDS: dict[str, type] = {"site": str, "thread": str, "line": str, "live_bytes": int, "error_bytes": int,
                                 "blocks": int}  # fmt: skip


def _sites(value: Any) -> list[dict[str, Any]]:
    """A line's ``sites`` where each is well formed (else none): untrusted input."""
    if not isinstance(value, list) or len(value) > MAX_SITES:
        return []
    ok = all(isinstance(s, dict) and all(isinstance(s.get(k), t) and not isinstance(s.get(k), bool)
                                         for k, t in _SITE_FIELDS.items()) for s in value)  # fmt: skip
    return [{k: s[k] for k in _SITE_FIELDS} for s in value] if ok else []


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
                more = {k: v for k, words in _OPTIONAL.items()
                        if isinstance(v := entry.get(k), str) and words.fullmatch(v)}  # fmt: skip
                out.append({**{k: entry[k] for k in _FIELDS}, **more, "sites": _sites(entry.get("sites"))})
    return out
