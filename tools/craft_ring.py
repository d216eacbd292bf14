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
import subprocess
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


def meta() -> dict[str, Any]:
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
            for part, part_slots in zip(np.split(rec, breaks), np.split(slots, breaks), strict=True):
                f.seek(h.records_offset + int(part_slots[0]) * fmt.RECORD_SIZE)
                f.write(part.tobytes())
    return path


def craft_v3(
    path: Path,
    strings: dict[int, str],
    frames: dict[tuple[int, int], str],
    stacks: dict[tuple[int, int], list[int]],
    records: np.ndarray,
    *,
    stacks_size: int = 8192,
    identity: dict[str, Any] | None = None,
    allocs: dict[tuple[int, int], bytes] | None = None,
    heap: bytes = b"",
    heap_size: int = 0,
    file_size: int | None = None,
) -> Path:
    """A version-3 ring holding exactly these strings (id -> text), stack-table entries ((generation, id)
    -> a frame's text, or a stack's frame ids; generation g in half (g - 1) % 2, frames first) and
    ``records`` (``fmt.RECORD_DTYPE``, seq 1..n, one slot each: capacity n), nothing else: a hostile
    writer's ring. Payloads are written raw: a frame may hold ``;``, escapes, anything."""
    m = meta()
    if identity is not None:
        m["identity"] = identity
    region = b"".join(fmt.string_entry(sid, text) for sid, text in strings.items())
    halves: list[list[bytes]] = [[], []]
    for (gen, fid), text in frames.items():
        payload = text.encode("utf-8", "surrogateescape")
        halves[(gen - 1) % 2].append(fmt.stack_entry(gen, fmt.STACK_FRAME, fid, payload))
    for (gen, sid), ids in stacks.items():
        payload = np.asarray(ids, "<u4").tobytes()
        halves[(gen - 1) % 2].append(fmt.stack_entry(gen, fmt.STACK_STACK, sid, payload))
    for (gen, sid), payload in (allocs or {}).items():  # version 4 (``craft_v4``): kind-3 entries, raw
        halves[(gen - 1) % 2].append(fmt.stack_entry(gen, fmt.STACK_ALLOC, sid, payload))
    table = [b"".join(h) for h in halves]
    half = max(4096, -(-max(map(len, table)) // 4096) * 4096, stacks_size // 2)
    capacity = max(1, len(records))
    header = fmt.encode_header(capacity, max(len(region), 4096), m, stacks_size=2 * half, crash_size=4096,
                               heap_size=heap_size)  # fmt: skip
    h = fmt.decode_header(header, len(header))
    rec = records.copy()
    rec["seq"] = rec["commit"] = np.arange(1, len(rec) + 1, dtype=np.uint64)
    with open(path, "wb") as f:
        f.write(header)
        f.write(region)
        f.seek(h.stacks_offset)
        f.write(table[0])
        f.seek(h.stacks_offset + half)
        f.write(table[1])
        f.seek(h.records_offset + fmt.RECORD_SIZE)  # seq k lives in slot k % capacity
        f.write(rec[: capacity - 1].tobytes() if len(rec) else b"")
        f.seek(h.records_offset)
        f.write(rec[capacity - 1 :].tobytes() if len(rec) else b"")
        if heap:
            f.seek(h.heap_offset)
            f.write(heap)
        f.truncate(h.file_size if file_size is None else file_size)
    return path


def craft_v4(
    path: Path,
    strings: dict[int, str],
    frames: dict[tuple[int, int], str],
    allocs: dict[tuple[int, int], bytes],
    heap: bytes,
    records: np.ndarray,
    *,
    heap_size: int | None = None,
    stacks_size: int = 8192,
    file_size: int | None = None,
) -> Path:
    """A version-4 ring (``craft_v3``'s, plus its allocation sampling): kind-3 stack-table entries
    ((generation, id) -> a raw payload, ``format.alloc_stack_payload`` or anything), ``heap`` written at
    the heap table's start (``format.heap_slot_bytes`` slots, or anything) of a table declared
    ``heap_size`` bytes (default: ``heap``'s size), and the file cut at ``file_size`` (default: the size
    its header declares; a hostile writer may declare a terabyte of table on a small file)."""
    size = len(heap) if heap_size is None else heap_size
    return craft_v3(path, strings, frames, {}, records, stacks_size=stacks_size, allocs=allocs, heap=heap,
                    heap_size=max(fmt.PAGE, size), file_size=file_size)  # fmt: skip


def records_of(kind: str, n: int, **words: Any) -> np.ndarray:
    """``n`` records of one kind, a microsecond apart, steps and devices unset; ``words``: a field
    (``label``, ``p0`` ...) set to a value or an array of ``n``."""
    rec = np.zeros(n, fmt.RECORD_DTYPE)
    rec["time"] = time.monotonic_ns() + np.arange(n, dtype=np.int64) * 1000
    rec["step"] = -1
    rec["device"] = -1
    rec["kind"] = fmt.KIND_CODES[kind]
    for i in range(fmt.PAYLOAD_WORDS):
        rec[f"p{i}"] = -1
    for name, value in words.items():
        rec[name] = value
    return rec


def mixed_records(n: int, seed: int) -> np.ndarray:
    """``n`` marks (label 2) with, among them, 60 records of every kind whose payload words hold anything:
    -1, 0, small numbers, ASCII text, random bits (a hostile or damaged writer's)."""
    rng = np.random.default_rng(seed)
    rec = records_of("mark", n, label=2, value=np.arange(n))
    few = rng.choice(n, 60 * len(fmt.KIND_CODES), replace=False)
    rec["kind"][few] = np.array(list(fmt.KIND_CODES.values()), np.uint8).repeat(60)
    choices = np.array([-1, 0, 7, 1 << 40, int.from_bytes(b"python3\0", "little")], np.int64)
    for i in range(fmt.PAYLOAD_WORDS):
        words = rng.choice(choices, n)
        noise = rng.random(n) < 0.2
        words[noise] = rng.integers(-(1 << 62), 1 << 62, int(noise.sum()))
        rec[f"p{i}"] = words
    return rec


def stack_bomb(
    path: Path, stacks_size: int = 8 << 20, frame_bytes: int = 1000, depth: int = fmt.MAX_STACK_DEPTH, hot: int = 0
) -> Path:
    """A version-3 ring whose every record names a different stack of ``depth`` frames of ``frame_bytes``
    bytes, as many as a table of ``stacks_size`` bytes holds (both halves): little on disk, a
    gigabyte or more once each stack is folded into text. ``hot``: the last stack is sampled that many
    times more, at the end (the one a reader must render)."""
    entry = fmt.pad8(fmt.STACK_ENTRY.size + 4 * depth)
    frames: dict[tuple[int, int], str] = {}
    stacks: dict[tuple[int, int], list[int]] = {}
    keys = []
    for gen in (1, 2):
        for fid in range(1, 2 * depth + 1):  # two frames per position: 2**depth stacks to pick from
            frames[(gen, fid)] = f"f{fid}_".ljust(frame_bytes - 12, "x") + f" (m.py:{fid})"
        room = stacks_size // 2 - 2 * depth * fmt.pad8(fmt.STACK_ENTRY.size + frame_bytes)
        for sid in range(1, room // entry + 1):
            stacks[(gen, sid)] = [1 + j + depth * ((sid >> (j % 20)) & 1) for j in range(depth)]
            keys.append((gen, sid))
    keys += keys[-1:] * hot
    gens, sids = np.array(keys, np.int64).T
    rec = records_of("stack_sample", len(keys), label=2, p0=1, p1=sids, p2=gens, p3=depth)
    return craft_v3(path, {2: "MainThread"}, frames, stacks, rec, stacks_size=stacks_size)


def label_bomb(path: Path, labels: int = 30_000, size: int = fmt.MAX_STRING_BYTES) -> Path:
    """A version-3 ring of ``labels`` marks, each with its own label of ``size`` bytes, the labels alike
    but for their last digits (as a job that puts a counter in a long label would write them)."""
    strings = {2 + i: f"{'x' * (size - 12)}{i:012d}" for i in range(labels)}
    rec = records_of("mark", labels, label=np.arange(2, 2 + labels), value=1, flags=fmt.FLAG_VALUE)
    return craft_v3(path, strings, {}, {}, rec)


def text_ring(path: Path, text: str) -> Path:
    """A version-3 ring whose every piece of text holds ``text`` (escape sequences, a newline, a bidi
    override, a ``;``, as a hostile writer chooses): the host name, argv, a thread name, two frames of the
    stack sampled, a mark's label, an uncaught exception's message, a signal's sender; then no clean end."""
    child = subprocess.Popen(["true"])
    child.wait()  # its pid: a writer that is no more
    ident = dict(identity(), host=f"host{text}", argv=["train.py", f"--name={text}"], pid=child.pid)
    strings = {2: f"thread{text}", 3: f"mark{text}", 4: f"ValueError: boom{text}", 5: "uncaught", 6: "SIGTERM"}
    frames = {(1, 1): f"outer{text} (train.py:1)", (1, 2): f"inner{text} (train.py:2)"}
    comm = f"kill{text}".encode("utf-8", "surrogateescape")[:16].ljust(16, b"\0")
    sender = np.frombuffer(comm, "<i8")
    parts = [
        records_of("mark", 3, label=3, value=7, flags=fmt.FLAG_VALUE),
        records_of("stack_sample", 4, label=2, p0=1, p1=1, p2=1, p3=2),
        records_of("sample", 4, label=0, p0=100 << 20),
        records_of("exception", 1, label=4, p0=5),
        records_of("signal", 1, label=6, value=15, flags=fmt.FLAG_VALUE, p1=4242, p3=sender[0], p4=sender[1]),
    ]
    rec = np.concatenate(parts)
    rec["time"] = time.monotonic_ns() + np.arange(len(rec), dtype=np.int64) * 1_000_000
    return craft_v3(path, strings, frames, {(1, 1): [1, 2]}, rec, identity=ident)


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
