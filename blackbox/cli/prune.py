"""Keep a folder of rings or of bundles within a count and a total size; the oldest go first.

A ring folder may hold ``blackbox run``'s run folders (``run-*/`` with ``rings/`` and ``bundle/``) besides
rings of its own: each run is one entry, its rings and its bundle removed together."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "folder",
        metavar="DIR",
        help="a ring folder (*.ring files and blackbox run's run-* folders) or a folder of bundles",
    )
    parser.add_argument("--max-count", type=int, metavar="N", help="keep at most N rings, runs or bundles")
    parser.add_argument("--max-size", metavar="SIZE", help="keep at most SIZE in total (500M, 20G)")
    parser.add_argument("--dry-run", action="store_true", help="print what would go, delete nothing")
    parser.add_argument("--json", action="store_true", help="print what went and what was kept as one JSON object")


def run(args: argparse.Namespace) -> int:
    from .._errors import BlackboxError
    from .._units import human_bytes
    from ..recovery.bundle import METADATA
    from ..ring.file import RING_SUFFIX
    from ..ring.retention import (
        RUN_PREFIX,
        bundle_entries,
        check_count,
        delete,
        folder_entries,
        parse_size,
        plan,
        sweep,
    )

    folder = Path(args.folder)
    if not folder.is_dir():
        raise BlackboxError(f"{folder}: expected a folder of rings or bundles, found none")
    if args.max_count is None and args.max_size is None:
        raise BlackboxError("expected --max-count and/or --max-size, found neither")
    max_bytes = parse_size(args.max_size) if args.max_size else None
    entries = folder_entries(folder) or bundle_entries(folder, METADATA)
    if not entries and folder.name.startswith(RUN_PREFIX) and (folder / "rings").is_dir():
        raise BlackboxError(f"{folder}: expected a folder of runs, found one run's folder: prune {folder.parent}")
    if not entries and (other := sorted(p.name for p in folder.iterdir() if RING_SUFFIX not in p.name)):
        named = ", ".join(repr(n) for n in other[:3]) + (", ..." if len(other) > 3 else "")
        raise BlackboxError(
            f"{folder}: expected rings (*.ring), blackbox run's run-* folders or bundles, found none of them "
            f"but {len(other)} other entries ({named})"
        )
    doomed = plan(entries, check_count(args.max_count), max_bytes)
    say = (lambda line: None) if args.json else print
    for e in doomed:
        say(f"{'would remove' if args.dry_run else 'removed'} {e.path} ({human_bytes(e.size)})")
        if not args.dry_run:
            delete(e)
    swept = [] if args.dry_run else sweep(folder)
    for f in swept:
        say(f"removed {f} (left behind by no ring or by a dead writer)")
    in_use = sum(e.in_use for e in entries)
    left = len(entries) - len(doomed)
    total = sum(e.size for e in entries) - sum(e.size for e in doomed)
    if args.json:
        print(json.dumps({
            "folder": str(folder), "dry_run": bool(args.dry_run),
            "removed": [{"path": str(e.path), "bytes": e.size} for e in doomed],
            "swept": [str(f) for f in swept], "kept": left, "kept_bytes": total, "in_use": in_use,
        }))  # fmt: skip
        return 0
    note = f", {in_use} in use or too recent (never removed)" if in_use else ""
    print(f"{left} kept, {human_bytes(total)} in total{note}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox prune", argv)
