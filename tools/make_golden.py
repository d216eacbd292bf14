"""Regenerate the golden ring files under tests/data/ (one per format version).

    python tools/make_golden.py [VERSION]   # writes tests/data/ring-vN.ring and ring-vN.expected.json
                                            # (N = the current format version unless given)

The ring is built byte by byte from blackbox.ring.format with fixed clocks and
identity, so it is the same on every machine. It exercises wrap-around, a torn
slot, a damaged string entry, the "region full" label, nulls and every kind.
The expected JSON is what the reader must recover from it; tests/test_golden.py
compares. Never regenerate an old version's file: it must stay readable as is.
"""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blackbox.recovery.timeline import ring_table  # noqa: E402
from blackbox.ring import format as fmt  # noqa: E402
from blackbox.ring.reader import read_ring  # noqa: E402

CAPACITY = 32
STRINGS = 4096
WALL, MONO = 1_767_225_600_000_000_000, 5_000_000_000  # 2026-01-01T00:00:00Z
META: dict[str, Any] = {
    "format_version": 0,  # set per version
    "writer": {"package": "blackbox", "version": "golden"},
    "identity": {
        "host": "golden-host",
        "pid": 4242,
        "ppid": 1,
        "rank": 1,
        "local_rank": 1,
        "world_size": 2,
        "argv": ["train.py", "--golden"],
        "boot_id": None,
    },
    "clock": {"wall_ns": WALL, "monotonic_ns": MONO},
    "started_at": "2026-01-01T00:00:00.000000Z",
    "versions": {"python": "3.11.7", "numpy": "2.4.6", "torch": None, "blackbox": "golden"},
    "sample_interval_s": 0.1,
    "cgroup": None,
}


def build(version: int) -> bytes:
    meta = dict(META, format_version=version)
    if version >= 3:
        meta["identity"] = dict(META["identity"], role="main", attempt=1)
        meta["liveness"] = "ofd-lock"
    header = fmt.encode_header(
        CAPACITY, STRINGS, meta, version=version, stacks_size=8192, crash_size=4096, heap_size=4096
    )
    h = fmt.decode_header(header, len(header))
    buf = bytearray(h.file_size)
    buf[: len(header)] = header
    entries = [
        fmt.string_entry(1, fmt.STRING_FULL_TEXT),
        fmt.string_entry(2, "loss"),
        fmt.string_entry(3, "forward"),
        fmt.string_entry(4, "damaged soon"),
        fmt.string_entry(5, "ünïcödé"),
    ]
    if version >= 2:
        entries += [
            fmt.string_entry(6, "uncaught"),
            fmt.string_entry(7, OOM_MESSAGE),
            fmt.string_entry(8, "observer"),
            fmt.string_entry(9, "builtins.ValueError: failed to allocate seat in queue"),
            fmt.string_entry(10, "SIGTERM"),
            fmt.string_entry(11, "Net.fc1"),
            fmt.string_entry(12, "default action"),
        ]
    if version >= 3:
        entries += [fmt.string_entry(13, "SIGUSR1"), fmt.string_entry(14, "handled by the job's handler")]
        entries += [fmt.string_entry(15, "pt_data_worker")]
    if version >= 5:
        entries += [fmt.string_entry(16, "memory critical"), fmt.string_entry(17, "forecast critical"),
                    fmt.string_entry(18, "signal sent"), fmt.string_entry(19, "handler returned"),
                    fmt.string_entry(20, "on_usr1 (train.py:9)")]  # fmt: skip
    pos = h.strings_offset
    for e in entries:
        buf[pos : pos + len(e)] = e
        pos += len(e)
    damaged_at = h.strings_offset + sum(len(e) for e in entries[:3]) + 16
    buf[damaged_at] ^= 0xFF  # entry 4's text: its CRC fails, its label is lost
    seq = 0
    thread = 0x7F00_0000_1000

    def put(
        kind: str,
        *,
        label: int = 0,
        value: int | None = None,
        step: int = -1,
        device: int = -1,
        payload: tuple[int, ...] | None = None,
    ) -> None:
        nonlocal seq
        seq += 1
        t = MONO + seq * 1_000_000
        off = h.records_offset + (seq % CAPACITY) * fmt.RECORD_SIZE
        flags, v = (0, 0) if value is None else (fmt.FLAG_VALUE, value)
        code = fmt.KIND_CODES[kind]
        if payload is None:
            fmt.EVENT_STRUCT.pack_into(buf, off, seq, t, thread, step, v, label, code, flags, device, seq)
        else:
            words = tuple(payload) + (-1,) * (fmt.PAYLOAD_WORDS - len(payload))
            fmt.SAMPLE_STRUCT.pack_into(buf, off, seq, t, thread, step, v, label, code, flags, device, *words, seq)

    put("arm", value=CAPACITY)
    put("sample", payload=(100 << 20, 200 << 20, 1 << 30, -1, -1, -1, -1, -1, -1))
    for step in range(8):
        put("step", value=step, step=step)
        put("phase_begin", label=3, step=step)
        put("phase_end", label=3, value=250_000 + step, step=step)
        put("mark", label=2, value=1000 - step, step=step)
        put(
            "sample",
            step=step,
            payload=((100 + 10 * step) << 20, (200 + 10 * step) << 20, 1 << 30, -1, -1, -1, -1, -1, -1),
        )
    if version >= 2:
        v2_events(put)
    if version >= 3:
        v3_events(put, buf, h)
    if version >= 4:
        v4_events(put, buf, h)
    if version >= 5:
        v5_events(put)
    put("mark", label=4, value=None, step=7)  # its string is damaged
    put("mark", label=1, value=-5, step=7)  # the region-full placeholder
    put("mark", label=5, value=-(1 << 63), step=7)
    put("mark", label=9, value=(1 << 63) - 1, step=7)  # id with no entry at all
    # a torn slot: the next record's seq written, commit not yet
    torn_seq = seq + 1
    off = h.records_offset + (torn_seq % CAPACITY) * fmt.RECORD_SIZE
    buf[off : off + fmt.RECORD_SIZE] = bytes(fmt.RECORD_SIZE)
    buf[off : off + 8] = torn_seq.to_bytes(8, "little")
    return bytes(buf)


OOM_MESSAGE = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "79.11 GiB of which 1.50 GiB is free. Including non-PyTorch memory, this process has 77.60 GiB memory in use. "
    "Of the allocated memory 70.00 GiB is allocated by PyTorch, with 1.00 GiB allocated in private pools "
    "(e.g., CUDA Graphs), and 6.50 GiB is reserved by PyTorch but unallocated."
)


def v2_events(put) -> None:  # type: ignore[no-untyped-def]
    """One of each kind version 2 added, late enough in the ring to survive its wrap-around."""
    gib = 1 << 30
    put("gpu_sample", device=0, payload=(60 * gib, 70 * gib, 61 * gib, 2 * gib, 9 * gib, 80 * gib, 3, 0, 65 * gib))
    put("module_begin", label=11, payload=(60 * gib, 100 << 20))
    put("alloc", value=2 * gib, device=0, payload=(0x7F00_0000, 0, 1_767_225_600_000_000))
    put("oom", value=2 * gib, device=0, payload=(8, 80 * gib, gib))
    put("oom", label=7, payload=(6, -1, -1))
    put("exception", label=9, payload=(6,))
    put("signal", label=10, value=15, payload=(12,))


def v3_events(put, buf: bytearray, h: fmt.Header) -> None:  # type: ignore[no-untyped-def]
    """Version 3: signals as the C handler writes them (no step, the sender), stack samples resolved
    through both halves of the stack table (one stack cut at the depth cap, one lost), the crash region."""
    half = h.stacks_size // 2
    gen1 = [
        fmt.stack_entry(1, fmt.STACK_FRAME, 1, b"<module> (train.py:40)"),
        fmt.stack_entry(1, fmt.STACK_FRAME, 2, b"leak (train.py:12)"),
        fmt.stack_entry(1, fmt.STACK_STACK, 1, struct.pack("<2I", 1, 2)),
        fmt.stack_entry(1, fmt.STACK_FRAME, 3, b"damaged (train.py:1)"),
    ]
    gen2 = [
        fmt.stack_entry(2, fmt.STACK_FRAME, 1, "idle (träin.py:20)".encode()),
        fmt.stack_entry(2, fmt.STACK_STACK, 1, struct.pack("<1I", 1)),
    ]
    for lo, entries in ((h.stacks_offset, gen1), (h.stacks_offset + half, gen2)):
        pos = lo
        for e in entries:
            buf[pos : pos + len(e)] = e
            pos += len(e)
    buf[h.stacks_offset + sum(map(len, gen1[:3])) + 30] ^= 0xFF  # the damaged frame's CRC fails
    thread = 0x7F00_0000_2000
    put("stack_sample", step=7, payload=(thread, 1, 1, 2))
    put("stack_sample", step=7, payload=(thread, 1, 2, 70))  # deeper than the cap: outer frames cut
    put("stack_sample", step=7, payload=(thread, 9, 2, 3))  # no such stack: lost
    comm = int.from_bytes(b"slurmstepd\0\0\0\0\0\0"[:8], "little"), int.from_bytes(b"pd\0\0\0\0\0\0", "little")
    put("signal", label=13, value=10, payload=(14, 4242, 0, *comm))  # step -1: filled from the record before
    put("signal", label=10, value=15, payload=(12, -1, 128, 0, 0))  # from the kernel (a terminal): no sender
    mib = 1 << 20
    put("cgroup_sample", step=7, payload=(900 * mib, 80 * mib, 16 * mib, 4 * mib, 0, 12))
    put("child_sample", label=15, step=7, payload=(4343, 700 * mib))
    put("exit", value=2, step=7)
    crash = b"Fatal Python error: Segmentation fault\n\nCurrent thread 0x00007f00 (most recent call first):\n"
    buf[h.crash_offset : h.crash_offset + len(crash)] = crash


def v4_events(put, buf: bytearray, h: fmt.Header) -> None:  # type: ignore[no-untyped-def]
    """Version 4: allocation samples (no step, resolved through kind-3 entries of either half, one whose
    stack was never written, one from a native thread), and the heap table (valid, torn, empty slots)."""
    half = h.stacks_size // 2
    leak, unwritten = 0x1234_5678_9ABC_DEF0, 0x0FED_CBA9_8765_4321
    gen1_end = h.stacks_offset + 8 * 24 + 120  # after version 3's first-half entries
    entries = [
        fmt.stack_entry(1, fmt.STACK_FRAME, 4, b"cache_fill (train.py:33)"),
        fmt.stack_entry(1, fmt.STACK_ALLOC, 1, fmt.alloc_stack_payload(leak, 3, [1, 4], "metrics-cache",
                                                                          "_cache.append(torch.ones(n))")),
    ]  # fmt: skip
    pos = max(gen1_end, h.stacks_offset + 256)
    for e in entries:
        buf[pos : pos + len(e)] = e
        pos += len(e)
    gen2 = fmt.stack_entry(2, fmt.STACK_ALLOC, 1, fmt.alloc_stack_payload(leak ^ 1, 1, [1], "", ""))
    at = h.stacks_offset + half + 256
    buf[at : at + len(gen2)] = gen2  # frame 1 of generation 2: "idle (träin.py:20)"
    mib = 1 << 20
    thread = 0x7F00_0000_3000
    put("alloc_sample", value=4 * mib, payload=(0x7F10_0000, 5 * mib, leak, 2, 0))
    put("alloc_sample", value=64, payload=(0x7F20_0000, mib, leak ^ 1, 1, 1))
    put("alloc_sample", value=8 * mib, payload=(0x7F30_0000, 9 * mib, unwritten, 2, -1))  # heap full, no text
    put("alloc_sample", value=mib, payload=(0x7F40_0000, 2 * mib, fmt.NO_PYTHON_STACK, 2, 2))
    put("free_sample", value=mib, payload=(0x7F40_0000, 2 * mib, fmt.NO_PYTHON_STACK, 2, 2))
    put("alloc_sample", value=4096, device=0, payload=(0xA000, mib, leak, 3, 3))
    slots = [
        fmt.heap_slot_bytes(0x7F10_0000, 4 * mib, 5 * mib, leak, MONO + 40_000_000, thread, 6, 2),
        fmt.heap_slot_bytes(0x7F20_0000, 64, mib, leak ^ 1, MONO + 41_000_000, thread, 7, 1),
        fmt.heap_slot_bytes(0x7F50_0000, 2 * mib, 3 * mib, unwritten, MONO + 42_000_000, thread, -1, 2),
    ]
    torn = bytearray(fmt.heap_slot_bytes(0x7F60_0000, mib, mib, leak, MONO, thread, 7, 2))
    torn[56] ^= 0xFF  # its check word fails: cut mid-write
    for i, slot in enumerate([*slots, bytes(torn)]):
        at = h.heap_offset + (3 * i + 1) * fmt.HEAP_SLOT
        buf[at : at + fmt.HEAP_SLOT] = slot


def v5_events(put) -> None:  # type: ignore[no-untyped-def]
    """Version 5: alerts (the host's cgroup with a forecast in seconds and steps; a GPU's without steps) and
    what blackbox did about them (the alert signal sent, the job's handler returned)."""
    mib, gib = 1 << 20, 1 << 30
    put("alert", label=16, value=980 * mib, step=7, payload=(1, 3, 1, gib, 12 * mib, 3700, 400, 21, 3))
    put("alert", label=17, value=70 * gib, step=7, device=0, payload=(4, 3, 4, 80 * gib, 200 * mib, 45_000, 8000))
    put("alert_action", label=13, value=10, step=7, payload=(18, 4, 3))
    put("alert_action", label=20, step=7, payload=(19, 4, 3))


def expected(path: Path) -> dict[str, object]:
    ring = read_ring(path)
    table = ring_table(ring)
    rows = []
    for row in table.to_pylist():
        row["time"] = row["time"].isoformat()
        rows.append(row)
    return {"recovery": ring.recovery.as_dict(), "clean": ring.clean, "rows": rows}


def main() -> int:
    data_dir = ROOT / "tests" / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    version = int(sys.argv[1]) if len(sys.argv) > 1 else fmt.FORMAT_VERSION
    if version not in fmt.SUPPORTED_VERSIONS:
        print(f"make_golden: expected a version in {fmt.SUPPORTED_VERSIONS}, found {version}", file=sys.stderr)
        return 2
    ring = data_dir / f"ring-v{version}.ring"
    ring.write_bytes(build(version))
    (data_dir / f"ring-v{version}.expected.json").write_text(
        json.dumps(expected(ring), indent=1, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    print(f"wrote {ring} ({ring.stat().st_size} bytes) and its expected timeline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
