"""Recover rings (files or folders of rings) into a bundle, or node bundles into one job-wide bundle."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ._common import own_process, standalone, writing
from ._tty import progress


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "rings",
        nargs="+",
        metavar="RING|DIR|BUNDLE|URI",
        help="ring files or folders holding *.ring files, or a bundle's rings/ folder or one of its *.ring.zst "
        "(a bundle: timeline.parquet, ranks.parquet, metadata.json, summary.md, rings/); or node bundles, "
        "folders or URI prefixes of them (a job-wide bundle: "
        "ranks.parquet of every host, metadata.json, summary.md)",
    )
    parser.add_argument(
        "-o",
        "--out",
        required=True,
        metavar="OUT",
        help="bundle folder, or a pyarrow filesystem URI (s3://, gs://, hdfs://, file://)",
    )
    parser.add_argument("--summary", action="store_true", help="print summary.md after writing")
    parser.add_argument(
        "--no-raw",
        dest="raw",
        action="store_false",
        help="keep no copy of the rings read in the bundle (by default each goes to rings/<ring>.zst, zstd-compressed)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print what was written as one JSON object (--summary: summary.md in it)"
    )


def run(args: argparse.Namespace) -> int:
    own_process()
    from .._errors import one_line
    from .._postmortem import printable, write_job, write_postmortem
    from ..recovery.bundle import read_summary
    from ..recovery.locate import kind_of
    from ..views.summary import claimed_lines

    out = args.out
    targets = [str(t) for t in args.rings]  # a URI never goes through Path
    earlier = _holds_something(out)
    if kind_of(targets) != "rings":
        with writing(out, "the job-wide bundle", reads_too=True):
            meta = write_job(targets, out)
        _say_replaced(out, earlier)
        if args.json:
            return _json(out, meta, args.summary)
        print(f"wrote {out}/ (job-wide: {_count(meta['ring_count'], 'ring')} on {_count(meta['hosts'], 'host')} "
              f"from {_count(len(meta['bundles']), 'bundle')})")  # fmt: skip
        for unread in meta["unread_bundles"]:
            print(f"blackbox: not read: {one_line(unread['reason'])}", file=sys.stderr)
        for line in claimed_lines(meta["claimed_twice"])[2:-1]:  # the summary's lines, without the heading
            print(f"blackbox: held twice:{line[1:]}", file=sys.stderr)
        if args.summary:
            sys.stdout.write(printable(read_summary(out)))
        return 0
    with writing(out, "the bundle", reads_too=True), progress("recovering") as tick:
        meta = write_postmortem([Path(p) for p in targets], out, progress=tick, raw=args.raw)
    _say_replaced(out, earlier)
    if args.json:
        return _json(out, meta, args.summary)
    rec = meta["recovery"]
    state = "clean end" if meta.get("clean") else "no clean end"
    print(f"wrote {out}/ ({meta['events']} events, {rec.get('torn', 0)} torn slots dropped, {state})")
    for unread in meta.get("unread_rings", []):  # recovered without them: say which and why, one line each
        print(f"blackbox: not recovered: {unread['reason']}", file=sys.stderr)
    if meta.get("rings_left_out"):
        left = meta["rings_left_out"]
        print(f"blackbox: not recovered: {left['count']} rings over the limit of {left['limit']} (the newest were "
              "recovered); metadata.json names them (rings_left_out)", file=sys.stderr)  # fmt: skip
    if args.summary:
        sys.stdout.write(printable(read_summary(out)))  # rendered escaped; read back, it is a file like any other
    return 0


def _json(out: str, meta: dict[str, Any], summary: bool) -> int:
    """One JSON object: where the bundle went and what it holds (every control character escaped)."""
    from .._errors import one_line
    from ..recovery.bundle import read_summary

    first = meta.get("first_death") if "first_death" in meta else meta.get("death")
    said: dict[str, Any] = {
        "out": str(out),
        "scope": meta.get("scope") or "bundle",
        "cause": meta.get("cause") or (first or {}).get("cause"),
        "first_death": first,
        "events": meta.get("events"),
        "clean": meta.get("clean"),
        "torn": (meta.get("recovery") or {}).get("torn"),
        "rings": meta.get("ring_count") or len(meta.get("rings") or [meta]),
        "unread": [one_line(u["reason"]) for u in meta.get("unread_rings") or meta.get("unread_bundles") or []],
    }
    if "claimed_twice" in meta:  # job-wide: rings two bundles each hold
        said["claimed_twice"] = meta["claimed_twice"]
    if summary:
        said["summary"] = read_summary(out)
    print(json.dumps(said, indent=1, default=str))
    return 0


def _holds_something(out: str) -> bool:
    """OUT is a local folder with something in it: an earlier bundle, which the new one replaces whole (a
    folder holding anything else is refused, untouched)."""
    if "://" in out:
        return False
    try:
        with os.scandir(out) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def _say_replaced(out: str, earlier: bool) -> None:
    if earlier:
        print(f"blackbox: replaced the earlier bundle at {out}/", file=sys.stderr)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox recover", argv)
