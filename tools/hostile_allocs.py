"""Hostile version-4 rings for ``tools/fuzz_recover.py --mode allocs``: the heap table and allocation stacks.

``alloc_case`` writes one ring with 1 to 3 traps chosen at random, every heap slot valid (its check word
right) unless the trap says otherwise:

- ``overflow``: weights and sizes of u64 max, 2**63, 0, which wrap when summed or multiplied as u64;
- ``times``: slot times and steps at i64/i32 min and max, negative; step records of i64 extremes;
- ``dangling``: stack fingerprints and thread ids that resolve to nothing;
- ``hostile entries``: kind-3 entries whose thread names and source lines hold escapes, ``;``, line breaks,
  broken UTF-8, 255 bytes; frames likewise; depth fields lying about the frame count; frame ids naming
  no frame; one fingerprint in many entries of both generations (colliding);
- ``many stacks``: up to a million heap slots and 200,000 alloc_sample records, each a distinct stack;
- ``huge heap``: a heap table declared a terabyte (or 64 GiB) on a file of a few MiB;
- ``garbage records``: alloc_sample / free_sample records of random payload words, frees of blocks never
  sampled, heap-slot words out of range.

It returns the case's shape and ``planted``: the exact sum of the weights of the valid slots the reader
is meant to take (the first ``heap.MAX_HEAP_SIZE`` bytes of the table), which recover's total must match.
"""

from __future__ import annotations

import random
import struct
from pathlib import Path
from typing import Any

import numpy as np
from craft_ring import craft_v4, records_of
from hostile_cases import EVIL

from blackbox.ring import format as fmt
from blackbox.ring.heap import MAX_HEAP_SIZE

U64 = (1 << 64) - 1
I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1
BROKEN = [b"\xff\xfe", b"\xc3", b"\xed\xa0\x80", b"\xe2\x80\xae", b"\x1b]0;x\x07", b";", b"\n", b"\r"]
TRAPS = ["overflow", "times", "dangling", "hostile entries", "many stacks", "huge heap", "garbage records"]


def _evil_bytes(rng: random.Random, size: int) -> bytes:
    """``size`` bytes (at most) of text holding escapes, ``;``, line breaks and broken UTF-8."""
    parts = [rng.choice([b"x", *BROKEN, rng.choice(EVIL).encode("utf-8", "surrogateescape")]) for _ in range(size)]
    return b"".join(parts)[:size]


def alloc_payload(fingerprint: int, depth: int, ids: list[int], thread: bytes, line: bytes) -> bytes:
    """A kind-3 payload laid out by hand (``format.alloc_stack_payload`` encodes text, this writes raw bytes)."""
    head = fmt.ALLOC_STACK_HEAD.pack(fingerprint & U64, depth & 0xFFFFFFFF, len(ids))
    return (head + struct.pack(f"<{len(ids)}I", *ids) + thread + b"\0" + line)[: fmt.MAX_ALLOC_STACK_BYTES]


def heap_slots(n: int, **fields: Any) -> np.ndarray:
    """``n`` valid slots (check words computed): addresses distinct, the rest from ``fields``."""
    slots = np.zeros(n, fmt.HEAP_DTYPE)
    slots["address"] = 0x7F00_0000_0000 + np.arange(n, dtype=np.uint64) * 64
    slots["size"], slots["weight"], slots["time"], slots["step"], slots["domain"] = 64, 1 << 19, 1, -1, 1
    for name, value in fields.items():
        slots[name] = value
    slots["address"][slots["address"] == 0] = 1  # a zero address is an empty slot
    slots["check"] = fmt.heap_check(slots)
    return slots


def _pick(rng: random.Random, n: int, values: list[int], dtype: str) -> np.ndarray:
    return np.array([rng.choice(values) for _ in range(n)], dtype=object).astype(dtype)


def alloc_case(path: Path, rng: random.Random) -> dict[str, Any]:
    """Write one hostile ring at ``path``; returns its shape: traps, slots, records, planted."""
    traps = sorted(set(rng.sample(TRAPS, rng.randint(1, 3))))
    frames: dict[tuple[int, int], str] = {}
    allocs: dict[tuple[int, int], bytes] = {}
    parts: list[np.ndarray] = []
    fingerprints = [0xF00D + i for i in range(8)]
    for gen in (1, 2):
        for fid in range(1, 9):
            frames[(gen, fid)] = f"fn{fid} (/job/train.py:{fid})"
    for i, fp in enumerate(fingerprints):  # honest entries, the reference
        allocs[(1, 100 + i)] = alloc_payload(fp, 3, [1, 2, 3 + i % 5], b"MainThread", b"x.append(y)")
    n_slots = rng.choice([1, 16, 1000])
    fields: dict[str, Any] = {"stack": _pick(rng, n_slots, fingerprints, "<u8"), "thread": 7}
    if "overflow" in traps:
        values = [U64, 1 << 63, (1 << 63) - 1, 0, 1 << 62, 1]
        fields["weight"] = _pick(rng, n_slots, values, "<u8")
        fields["size"] = _pick(rng, n_slots, values, "<u8")
    if "times" in traps:
        fields["time"] = _pick(rng, n_slots, [I64_MIN, I64_MAX, -1, -(1 << 40), 0, 1 << 62], "<i8")
        fields["step"] = _pick(rng, n_slots, [I32_MIN, I32_MAX, -1, -2, 0], "<i4")
        steps = rng.choice([[0, I64_MAX], [I64_MIN, I64_MAX], [I64_MAX - 1, I64_MAX], [0, 1 << 40]])
        parts.append(records_of("step", len(steps), value=steps, step=steps, flags=fmt.FLAG_VALUE, thread=7))
    else:
        parts.append(records_of("step", 20, value=np.arange(20), step=np.arange(20), flags=fmt.FLAG_VALUE, thread=7))
    if "dangling" in traps:
        fields["stack"] = np.array([rng.getrandbits(64) for _ in range(n_slots)], dtype=object).astype("<u8")
        fields["thread"] = _pick(rng, n_slots, [U64, 0, 1 << 63, 12345], "<u8")
    if "hostile entries" in traps:
        for gen in (1, 2):
            for fid in range(1, 9):
                frames[(gen, fid)] = _evil_bytes(rng, rng.choice([8, 200, 1000])).decode("utf-8", "surrogateescape")
        for k in range(200):
            fp = rng.choice(fingerprints)  # colliding: one fingerprint, many entries, both generations
            n = rng.randint(0, fmt.MAX_STACK_DEPTH)
            ids = [rng.choice([1, 2, 3, 4, 5, 6, 7, 8, 99, U64 & 0xFFFFFFFF]) for _ in range(n)]
            depth = rng.choice([n, 0, n + 1, 0xFFFFFFFF, max(0, n - 1)])
            thread = rng.choice([_evil_bytes(rng, 255), b"T" * 255, b"\x00evil", _evil_bytes(rng, 30)])
            line = _evil_bytes(rng, rng.choice([10, 200, 600]))
            allocs[(rng.choice([1, 2]), 1000 + k)] = alloc_payload(fp, depth, ids, thread, line)
        allocs[(1, 5000)] = struct.pack("<QII", fingerprints[0], 3, 200)  # n past the payload: malformed
    if "many stacks" in traps:
        n_slots = rng.choice([100_000, 1 << 20])
        fields = {k: v for k, v in fields.items() if np.ndim(v) == 0}
        fields["stack"] = np.arange(n_slots, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) + np.uint64(2)
        for k in range(rng.choice([1000, 30_000])):
            allocs[(1, 10_000 + k)] = alloc_payload(int(fields["stack"][k]), 2, [1, 2], b"T%d" % k, b"")
        n_rec = rng.choice([50_000, 200_000])
        parts.append(records_of("alloc_sample", n_rec, p0=np.arange(n_rec) * 64 + 4096, p1=1 << 19,
                                p2=np.arange(n_rec, dtype=np.int64) * 7919 + 3, p3=1, p4=-1, thread=7))  # fmt: skip
    slots = heap_slots(n_slots, **fields)
    heap = slots.tobytes()
    if "garbage records" in traps:
        n_rec = rng.choice([100, 5000])
        kinds = [rng.choice(["alloc_sample", "free_sample"]) for _ in range(n_rec)]
        for kind in ("alloc_sample", "free_sample"):
            count = kinds.count(kind)
            words = {f"p{i}": np.frombuffer(rng.randbytes(8 * count), "<i8") for i in range(fmt.PAYLOAD_WORDS)}
            parts.append(records_of(kind, count, label=rng.choice([0, 2, 99999]), thread=rng.getrandbits(63),
                                    **words))  # fmt: skip
        never = 0xDEAD_0000 + np.arange(50) * 64  # frees of blocks never sampled
        parts.append(records_of("free_sample", 50, p0=never, p1=1 << 19, p2=U64 >> 1, p3=rng.choice([0, 1, 2, 3, 77]),
                                p4=rng.choice([-1, 0, 1 << 40]), thread=7))  # fmt: skip
        if rng.random() < 0.5:  # torn: valid-looking slots with one word changed after the check
            torn = bytearray(heap_slots(50).tobytes())
            for j in range(50):
                torn[64 * j + 8] ^= 1
            heap += bytes(torn)
    records = np.concatenate(parts)
    records["time"] = np.sort(records["time"])
    heap_size = rng.choice([1 << 40, 1 << 36]) if "huge heap" in traps else None
    planted = int(sum(int(w) for w in slots["weight"][: MAX_HEAP_SIZE // fmt.HEAP_SLOT].tolist()))
    craft_v4(path, {2: "MainThread", 99999: "x" + rng.choice(EVIL)}, frames, allocs, heap, records,
             heap_size=heap_size, stacks_size=8192)  # fmt: skip
    if heap_size is not None:  # cut just past the heap's written slots: the records lie past the end
        with open(path, "r+b") as f:
            h = fmt.decode_header(f.read(fmt.MAX_HEADER_SIZE), heap_size)
            f.truncate(h.heap_offset + len(heap) + rng.choice([0, 1 << 20]))
    return {"traps": traps, "slots": n_slots, "records": len(records), "planted": planted}
