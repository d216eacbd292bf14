"""Keeping a ring folder and a bundle folder inside the limits a user sets.

``plan`` is pure: given the entries (their age, size and whether they are in
use), it names the oldest to delete until both the count and the total size are
within bounds. An entry in use (a ring whose writer is still running) is never
chosen, and it still counts towards the limits.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from .._errors import BlackboxError
from . import format as fmt
from .file import SIDECAR_SUFFIXES, sidecar
from .liveness import writer_alive
from .reader import read_header

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass(frozen=True)
class Entry:
    path: Path
    mtime: float
    size: int
    in_use: bool


def plan(entries: list[Entry], max_count: int | None, max_bytes: int | None) -> list[Entry]:
    """The entries to delete, oldest first, so that what is left fits both limits where it can."""
    kept = sorted(entries, key=lambda e: e.mtime)  # oldest first
    count, total = len(kept), sum(e.size for e in kept)
    doomed: list[Entry] = []
    for e in kept:
        over = (max_count is not None and count > max_count) or (max_bytes is not None and total > max_bytes)
        if not over:
            break
        if e.in_use:
            continue
        doomed.append(e)
        count, total = count - 1, total - e.size
    return doomed


def parse_size(text: str) -> int:
    """``"20G"`` -> bytes (K, M, G, T are powers of 1024; a plain number is bytes)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in _UNITS and not t[-1:].isdigit() else ""
    try:
        value = float(t[: len(t) - len(unit)])
    except ValueError:
        raise BlackboxError(f"expected a size such as 500M or 20G, found {text!r}") from None
    return int(value * _UNITS[unit])


def ring_entries(folder: Path) -> list[Entry]:
    """Every ``*.ring`` (with its sidecar files) in a folder; a ring still armed by a live writer is in use."""
    out = []
    for ring in sorted(folder.glob("*.ring")):
        try:
            header = read_header(ring)
            in_use = header.state != fmt.STATE_CLEAN and writer_alive(ring, header.meta)
        except BlackboxError:
            in_use = False  # not a ring we can read: old junk, removable
        files = [ring, *(sidecar(ring, s) for s in SIDECAR_SUFFIXES)]
        size = sum(f.stat().st_size for f in files if f.exists())
        out.append(Entry(ring, ring.stat().st_mtime, size, in_use))
    return out


def bundle_entries(folder: Path) -> list[Entry]:
    """Every bundle (a sub-folder holding metadata.json) in a folder."""
    out = []
    for d in sorted(p for p in folder.iterdir() if (p / "metadata.json").is_file()):
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
        out.append(Entry(d, (d / "metadata.json").stat().st_mtime, size, False))
    return out


def delete(entry: Entry) -> None:
    if entry.path.is_dir():
        shutil.rmtree(entry.path)
        return
    for f in (entry.path, *(sidecar(entry.path, s) for s in SIDECAR_SUFFIXES)):
        f.unlink(missing_ok=True)


KEEP_ENV = "BLACKBOX_KEEP"


def parse_keep(text: str) -> tuple[int | None, int | None]:
    """``BLACKBOX_KEEP="count=20,size=20G"`` -> (20, 20 GiB); either part may be left out."""
    count = size = None
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, _, value = part.partition("=")
        if key == "count" and value.isdigit():
            count = int(value)
        elif key == "size":
            size = parse_size(value)
        else:
            raise BlackboxError(
                f"{KEEP_ENV}: expected count=N and/or size=SIZE (e.g. count=20,size=20G), found {part!r}"
            )
    return count, size


def prune_ring_folder(folder: Path, keep: str) -> list[Path]:
    """At arm: make room in the ring folder by ``BLACKBOX_KEEP`` (the new ring counts as one more)."""
    count, size = parse_keep(keep)
    doomed = plan(ring_entries(folder), None if count is None else max(0, count - 1), size)
    for e in doomed:
        delete(e)
    return [e.path for e in doomed]
