"""Rings of a chosen shape, written directly (no recorder): for memory benchmarks and hostile-input tests.

    .venv/bin/python tools/craft_ring.py OUT.ring --capacity 1048576 --kind sample [--events N] [--sparse]

``with_meta`` and ``meta_with`` rewrite a ring's metadata JSON as a hostile writer
would: any text, the header laid out again around it, its CRC computed.

A crafted ring has a valid header (``format.encode_header``) for any capacity and
string region size, and ``events`` valid records of one kind (seq 1..events, the
newest ``capacity`` kept, as a wrapped ring holds them), each with a value and
payload words of -1 (not measured) unless ``payload`` says otherwise. With
``sparse``, only the written records take disk space: the rest of the file is a
hole, as a hostile writer may declare terabytes and write nothing there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from blackbox.collect.identity import identity, versions  # noqa: E402
from blackbox.ring import format as fmt  # noqa: E402

CHUNK = 1 << 16


def meta() -> dict[str, object]:
    wall, mono = time.time_ns(), time.monotonic_ns()
    return {
        "format_version": fmt.FORMAT_VERSION,
        "clock": {"wall_ns": wall, "monotonic_ns": mono},
        "identity": identity(),
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(wall / 1e9)),
        "versions": versions("crafted"),
        "sample_interval_s": 1.0,
        "cgroup": None,
        "writer": {"package": "tools/craft_ring.py", "version": "0", "backend": "python"},
        "liveness": "pid",
    }


def craft(
    path: Path,
    capacity: int,
    kind: str = "mark",
    events: int | None = None,
    *,
    strings_size: int = 64 << 10,
    sparse: bool = False,
    payload: int = -1,
) -> Path:
    """Write the ring; returns its path. ``events`` defaults to ``capacity`` (a full ring)."""
    events = capacity if events is None else events
    header = fmt.encode_header(capacity, strings_size, meta(), stacks_size=8192, crash_size=4096)
    h = fmt.decode_header(header, len(header))
    label = fmt.string_entry(2, "crafted")
    with open(path, "wb") as f:
        f.write(header)
        f.write(fmt.string_entry(1, fmt.STRING_FULL_TEXT) + label)
        f.truncate(h.file_size)  # zero everywhere else: a hole until written
        if not sparse:
            zeros = bytes(8 << 20)
            for at in range(len(header) + 4096, h.file_size, len(zeros)):
                f.seek(at)
                f.write(zeros[: h.file_size - at])
        first = max(1, events - capacity + 1)
        t0 = time.monotonic_ns()
        for lo in range(first, events + 1, CHUNK):
            seq = np.arange(lo, min(events + 1, lo + CHUNK), dtype=np.uint64)
            rec = np.zeros(len(seq), fmt.RECORD_DTYPE)
            rec["seq"] = rec["commit"] = seq
            rec["time"] = t0 + seq.astype(np.int64) * 1000
            rec["step"] = -1
            rec["value"] = seq.astype(np.int64)
            rec["flags"] = fmt.FLAG_VALUE
            rec["label"] = 2
            rec["kind"] = fmt.KIND_CODES[kind]
            rec["device"] = -1
            for i in range(fmt.PAYLOAD_WORDS):
                rec[f"p{i}"] = payload
            slots = (seq % np.uint64(capacity)).astype(np.int64)
            breaks = np.flatnonzero(np.diff(slots) != 1) + 1
            for part, at in zip(np.split(rec, breaks), np.split(slots, breaks), strict=True):
                f.seek(h.records_offset + int(at[0]) * fmt.RECORD_SIZE)
                f.write(part.tobytes())
    return path


def with_meta(data: bytes, blob: bytes) -> bytes:
    """The ring ``data`` with its metadata JSON replaced by ``blob`` (any bytes), the header laid out
    again around it and its CRC computed, as a hostile writer would."""
    magic, version, state, _, hsize, rsize, cap, roff, soff, ssize, _ = fmt.PREFIX.unpack_from(data)
    size = -(-(fmt.PREFIX_SIZE + len(blob)) // fmt.PAGE) * fmt.PAGE
    fields = (size, rsize, cap, roff + size - hsize, soff + size - hsize, ssize)
    crc = zlib.crc32(fmt.PREFIX.pack(magic, version, state, 0, *fields, len(blob))[fmt.CRC_START :] + blob)
    head = fmt.PREFIX.pack(magic, version, state, crc, *fields, len(blob)) + blob
    return head + bytes(size - len(head)) + data[hsize:]


def meta_with(meta: dict[str, Any], *changes: tuple[tuple[str, ...], str]) -> bytes:
    """``meta`` as JSON with the value at each path replaced by raw JSON text (which json.dumps could not
    write: NaN, 100000 levels of nesting, a lone surrogate, a 5000-digit int); () is the whole document.
    A path inside one already replaced is left out."""
    doc = json.loads(json.dumps(meta))
    texts: dict[str, str] = {}
    done: list[tuple[str, ...]] = []
    for path, raw in changes:
        if not path:
            return raw.encode("utf-8", "surrogatepass")
        if any(path[: len(p)] == p or p[: len(path)] == path for p in done):
            continue
        node = doc
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        mark = f"\u2603{len(texts)}\u2603"
        node[path[-1]] = mark
        texts[json.dumps(mark)] = raw
        done.append(path)
    text = json.dumps(doc)
    for mark, raw in texts.items():
        text = text.replace(mark, raw)
    return text.encode("utf-8", "surrogatepass")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--capacity", type=int, default=1 << 20)
    ap.add_argument("--kind", default="mark", choices=sorted(fmt.KIND_CODES))
    ap.add_argument("--events", type=int, default=None)
    ap.add_argument("--sparse", action="store_true")
    args = ap.parse_args()
    craft(args.out, args.capacity, args.kind, args.events, sparse=args.sparse)
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
