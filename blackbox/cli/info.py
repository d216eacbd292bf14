"""Show a ring's header, identity, slot counts and whether its writer ended cleanly."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from ._common import standalone


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ring", metavar="RING", help="a ring file")
    parser.add_argument("--json", action="store_true", help="print the facts as JSON")


def ring_facts(path: str) -> dict[str, Any]:
    from ..recovery.metadata import iso, writer_state
    from ..ring.liveness import writer_alive
    from ..ring.reader import read_ring, without_c_extension

    ring = read_ring(path)
    h, rec = ring.header, ring.recovery
    ident = ring.meta.get("identity") or {}
    clock = ring.meta.get("clock") or {}
    return {
        "ring": str(ring.path),
        "format_version": h.version,
        "record_size": h.record_size,
        "capacity": h.capacity,
        "file_size": ring.file_size,
        "expected_file_size": h.file_size,
        "strings_size": h.strings_size,
        "host": ident.get("host"),
        "pid": ident.get("pid"),
        "rank": ident.get("rank"),
        "world_size": ident.get("world_size"),
        "argv": ident.get("argv"),
        "started_at": iso(clock.get("wall_ns")) if isinstance(clock.get("wall_ns"), int) else None,
        "valid": rec.valid,
        "empty": rec.empty,
        "torn": rec.torn,
        "stale": rec.stale,
        "slots_read": rec.slots_read,
        "newest_seq": rec.last_seq,
        "oldest_seq": rec.first_seq,
        "overwritten": rec.overwritten,
        "strings": rec.strings,
        "strings_not_read": ring.strings_cut,
        "stack_table": _stack_table(ring.stacks, h.stacks_size),
        "writer": writer_state(ring, writer_alive(ring.writer_locked, ring.meta)),
        "c_extension": not without_c_extension(ring.meta),
        "signals_that_ended_it": sorted(ring.signal_stacks),
    }


def _stack_table(scan: Any, size: int) -> dict[str, Any] | None:
    """Version 3: what the stack table holds (its two newest generations, one per half)."""
    if scan is None:
        return None
    generations = sorted({g for g, _ in scan.frames} | {g for g, _ in scan.stacks})
    return {"bytes": size, "generations": generations, "frames": len(scan.frames), "stacks": len(scan.stacks),
            "damaged_entries": scan.damaged, "bytes_not_read": scan.cut}  # fmt: skip


def run(args: argparse.Namespace) -> int:
    from ..views.text import shown

    f = ring_facts(args.ring)
    if args.json:
        print(json.dumps(f, indent=2))  # ASCII: JSON escapes every control character
        return 0
    f = shown(f)  # the host, argv and path were written by the ring's owner: no escape reaches the terminal
    mib = f["capacity"] * f["record_size"] / 2**20
    size_note = ""
    if f["file_size"] < f["expected_file_size"]:
        size_note = f" (TRUNCATED: {f['file_size']} of {f['expected_file_size']} bytes)"
    print(f"ring:       {f['ring']}{size_note}")
    print(
        f"format:     version {f['format_version']}, {f['record_size']}-byte records, "
        f"{f['capacity']} slots ({mib:.1f} MiB), {f['strings_size'] // 1024} KiB of strings"
    )
    print(f"identity:   host {f['host']}, pid {f['pid']}, rank {f['rank']}, world size {f['world_size']}")
    print(f"started:    {f['started_at']}")
    print(f"command:    {' '.join(f['argv'] or [])}")
    print(
        f"slots:      {f['valid']} valid, {f['empty']} empty, {f['torn']} torn, {f['stale']} stale "
        f"({f['slots_read']} read)"
    )
    print(
        f"seq:        newest {f['newest_seq']}, oldest {f['oldest_seq']}, {f['overwritten']} overwritten by wrap-around"
    )
    print(
        f"strings:    {f['strings']} interned"
        + (f" ({f['strings_not_read'] // 1024} KiB past what a reader keeps not read)" if f["strings_not_read"] else "")
    )
    st = f["stack_table"]
    if st is not None:
        cut = f", {st['bytes_not_read'] // 1024} KiB past what a reader keeps not read" if st["bytes_not_read"] else ""
        print(f"stacks:     {st['stacks']} stacks, {st['frames']} frames in generations {st['generations'] or '-'} "
              f"({st['bytes'] // 1024} KiB table, {st['damaged_entries']} damaged entries{cut})")  # fmt: skip
    print(f"writer:     {f['writer']}")
    if not f["c_extension"]:
        from ..ring.writer import NO_C_EXTENSION

        print(f"recorder:   {NO_C_EXTENSION}")
    if f["signals_that_ended_it"]:
        print(f"signal:     {', '.join(f['signals_that_ended_it'])} with its default action (faulthandler's stack "
              "in its slot)")  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return standalone(sys.modules[__name__], "blackbox info", argv)
