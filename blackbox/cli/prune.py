"""Keep a folder of rings or of bundles within a count and a total size; the oldest go first.

A ring folder may hold ``blackbox run``'s run folders (``run-*/`` with ``rings/`` and ``bundle/``) besides
rings of its own: each run is one entry, its rings and its bundle removed together.

DIR is opened once (as root, never through a link) and everything is listed, looked into and removed
relative to that descriptor, each entry only while it is still the file listed. As root, a folder another
user owns is refused unless ``--as-owner``: the command then drops to that user (their uid, gid and
groups) for the rest of its life, so run it as its own process."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from ._common import standalone

if TYPE_CHECKING:
    from ..ring.inputs import Folder


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
    parser.add_argument(
        "--as-owner",
        action="store_true",
        help="as root, prune a folder another user owns as that user (root alone refuses it)",
    )


def run(args: argparse.Namespace) -> int:
    from .._errors import BlackboxError
    from .._units import human_bytes
    from ..recovery.bundle import METADATA
    from ..ring.file import RING_SUFFIX
    from ..ring.inputs import open_named
    from ..ring.retention import (
        RUN_PREFIX,
        bundle_entries,
        check_count,
        delete,
        folder_entries,
        parse_size,
        plan,
        refuse_other_owner,
        sweep,
    )

    if args.max_count is None and args.max_size is None:
        raise BlackboxError("expected --max-count and/or --max-size, found neither")
    max_bytes = parse_size(args.max_size) if args.max_size else None
    folder_path = Path(args.folder)
    root = os.geteuid() == 0
    try:
        folder = open_named(folder_path, follow=not root)  # as root, DIR itself is never a link
    except BlackboxError as exc:
        raise BlackboxError(f"{folder_path}: expected a folder of rings or bundles, found {_found(exc)}") from None
    with folder:  # listed, looked into and pruned through this one descriptor (ring.retention, ring.tree)
        if root and folder.uid != 0:
            if not args.as_owner:
                refuse_other_owner(folder)
            _become(folder)
        entries = folder_entries(folder) or bundle_entries(folder, METADATA)
        names = os.listdir(folder.fd)
        if not entries and folder_path.name.startswith(RUN_PREFIX) and "rings" in names:
            raise BlackboxError(
                f"{folder_path}: expected a folder of runs, found one run's folder: prune {folder_path.parent}"
            )
        if not entries and (other := sorted(n for n in names if RING_SUFFIX not in n)):
            named = ", ".join(repr(n) for n in other[:3]) + (", ..." if len(other) > 3 else "")
            raise BlackboxError(
                f"{folder_path}: expected rings (*.ring), blackbox run's run-* folders or bundles, found none of "
                f"them but {len(other)} other entries ({named})"
            )
        doomed = plan(entries, check_count(args.max_count), max_bytes)
        say = (lambda line: None) if args.json else print
        for e in doomed:
            say(f"{'would remove' if args.dry_run else 'removed'} {e.path} ({human_bytes(e.size)})")
            if not args.dry_run:
                delete(folder, e)
        swept = [] if args.dry_run else sweep(folder)
    for f in swept:
        say(f"removed {f} (left behind by no ring or by a dead writer)")
    in_use = sum(e.in_use for e in entries)
    left = len(entries) - len(doomed)
    total = sum(e.size for e in entries) - sum(e.size for e in doomed)
    if args.json:
        print(json.dumps({
            "folder": str(folder_path), "dry_run": bool(args.dry_run),
            "removed": [{"path": str(e.path), "bytes": e.size} for e in doomed],
            "swept": [str(f) for f in swept], "kept": left, "kept_bytes": total, "in_use": in_use,
        }))  # fmt: skip
        return 0
    note = f", {in_use} in use or too recent (never removed)" if in_use else ""
    print(f"{left} kept, {human_bytes(total)} in total{note}")
    return 0


def _found(exc: Exception) -> str:
    """What an error opening DIR found, without the path it already names."""
    return str(exc).rsplit(", found ", 1)[-1]


def _become(folder: Folder) -> None:
    """Drop from root to the folder's owner (their groups, their gid) for the rest of the command: the
    kernel then allows what that user may do, whatever is swapped in the folder meanwhile."""
    import pwd

    gid = os.fstat(folder.fd).st_gid
    try:
        user = pwd.getpwuid(folder.uid)
        os.initgroups(user.pw_name, user.pw_gid)
        gid = user.pw_gid
    except KeyError:  # a uid with no name (a removed user's folder): no supplementary groups
        os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(folder.uid, folder.uid, folder.uid)


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox prune", argv)
