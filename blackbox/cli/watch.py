"""Follow a running job's rings read-only: memory, headroom to each limit, growth rate, step."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._errors import BlackboxError, RingNotFoundError, one_line
from ._common import run_rings, standalone

if TYPE_CHECKING:
    from ..ring.reader import Ring

MAX_SHOWN = 6  # rings a frame gives lines to (a screen's worth); the others are counted


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "ring",
        metavar="RING|DIR",
        help="the ring file of a running job, a folder of rings, or a `blackbox run` folder (its rings/): "
        "a folder's live rings are followed, new ones as they appear",
    )
    parser.add_argument("--interval", type=float, default=1.0, metavar="SECONDS",
                        help="seconds between refreshes (default 1)")  # fmt: skip
    parser.add_argument("--once", action="store_true", help="print one frame and exit")
    parser.add_argument("--json", action="store_true", help="one JSON object a line, a line per frame (bytes, seconds)")


def run(args: argparse.Namespace) -> int:
    target = str(args.ring)
    folder = _folder_of_rings(target)
    tty = sys.stdout.isatty() and not args.json
    try:
        while True:
            shown, data, running = _one_ring(Path(target)) if folder is None else _folder_frame(*folder)
            if args.json:
                text = json.dumps({"time": _now(), **data}, default=str) + "\n"
            else:
                text = ("\x1b[H\x1b[2J" if tty else "") + shown + ("" if tty else "\n")
            sys.stdout.write(text)
            sys.stdout.flush()  # each frame as it is made, to a terminal or a pipe
            if args.once or not running:
                return 0
            time.sleep(max(0.05, args.interval))
    except KeyboardInterrupt:
        return 0


def _folder_of_rings(target: str) -> tuple[Path, bool] | None:
    """The folder whose rings to follow, and whether a link may be followed to it: ``target`` (named by
    the user: yes), or a run folder's rings/ (no); None for a ring file. A bundle is what a job left once
    it ended: named as such, with the commands that read it."""
    from ..recovery.locate import holds_rings, is_one_bundle

    if not os.path.isdir(target) or holds_rings(target):
        return (Path(target), True) if os.path.isdir(target) else None
    rings = run_rings(target)
    if rings is not None:
        return rings, False
    if is_one_bundle(target) or os.path.lexists(os.path.join(target, "metadata.json")):
        raise BlackboxError(
            f"{one_line(target)}: expected a ring file, a folder of rings or a `blackbox run` folder, found a "
            f"bundle (what a job left once it ended: blackbox summary or blackbox plot reads it)"
        )
    raise RingNotFoundError(
        f"{one_line(target)}: expected a ring file, a folder of rings or a `blackbox run` folder (with rings/), "
        "found neither *.ring files nor rings/ in it"
    )


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime()) + f".{time.time_ns() // 1000 % 1_000_000:06d}Z"


def _one_ring(path: Path) -> tuple[str, dict[str, Any], bool]:
    """A frame both ways (the text for a person, the data for ``--json``), and whether the writer runs."""
    from ..recovery.cells import name_cells
    from ..ring.liveness import writer_alive
    from ..ring.reader import read_ring
    from ..views.live import frame, ring_state

    ring = read_ring(path)
    name_cells(ring)  # (a notebook's cells: Cell In[3])
    running = writer_alive(ring.writer_locked, ring.meta) and not ring.clean
    data = {"target": str(path), "live": int(running), "total": 1, "rings": [ring_state(ring, running)]}
    return frame(ring, running), data, running


def _folder_frame(folder: Path, follow: bool) -> tuple[str, dict[str, Any], bool]:
    """The frame of a folder's rings, listed afresh (a job's new processes arm new rings): its live
    rings, else the last ones written; and whether any is live. The folder is opened once a frame (a run
    folder's rings/ never through a link), and its rings are looked at and read through that descriptor."""
    from ..recovery.cells import name_cells
    from ..ring.inputs import open_named
    from ..ring.liveness import writer_alive
    from ..ring.reader import RING_SUFFIX, list_rings, probe, read_ring
    from ..views.live import job_frame, ring_state

    try:
        where = open_named(folder, follow)
    except RingNotFoundError:
        where = None
    with contextlib.nullcontext() if where is None else where:
        found = list_rings([where]) if where is not None else None
        paths = [p for p in found.rings if p.name.endswith(RING_SUFFIX)] if found is not None else []
        if where is None or not paths:  # a run folder whose job has armed nothing yet
            if _ended_run(folder):
                raise RingNotFoundError(f"{one_line(str(folder))}: expected the job's rings, found none "
                                        "(the job ended: see its bundle)") from None  # fmt: skip
            text = f"blackbox watch  {one_line(str(folder))}: waiting for the job's first ring\n"
            return text, {"target": str(folder), "live": 0, "total": 0, "rings": []}, True
        assert found is not None
        live: list[tuple[tuple[int, int], Path]] = []
        ended: list[tuple[float, Path]] = []
        for path in paths:
            try:
                header, locked = probe(path, where)
                meta = header.meta
                if writer_alive(locked, meta):
                    ident = meta.get("identity") or {}
                    rank, pid = ident.get("rank"), ident.get("pid")
                    live.append(((rank if isinstance(rank, int) else 1 << 31, pid if isinstance(pid, int) else 0),
                                 path))  # fmt: skip
                else:
                    ended.append((-found.stats[path].st_mtime, path))
            except (BlackboxError, OSError):  # being created, or not a ring: not followed
                continue
        chosen = [p for _, p in sorted(live)[:MAX_SHOWN]] if live else [p for _, p in sorted(ended)[:MAX_SHOWN]]
        shown: list[tuple[Ring, bool]] = []
        for path in chosen:
            try:
                ring = read_ring(path, where)
            except (BlackboxError, OSError):
                continue
            name_cells(ring)
            shown.append((ring, bool(live) and writer_alive(ring.writer_locked, ring.meta) and not ring.clean))
    text = job_frame(shown, one_line(str(folder)), len(live), len(live) + len(ended))
    data = {"target": str(folder), "live": len(live), "total": len(live) + len(ended),
            "rings": [ring_state(ring, running) for ring, running in shown]}  # fmt: skip
    return text, data, bool(live)


def _ended_run(rings: Path) -> bool:
    """A run folder's job has ended: its bundle is there (or recovery said there was nothing to recover)."""
    return rings.name == "rings" and (rings.parent / "bundle").exists()


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox watch", argv)
