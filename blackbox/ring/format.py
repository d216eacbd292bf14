"""The ring file format: the one module that knows byte offsets.

``FORMAT.md`` beside this file is the normative description; ``tests/test_format_spec.py``
keeps the two in step. A version-4 or 5 ring file is six regions (versions 1 and 2
have no stack table and no crash region, version 3 no heap table)::

    [ header (header_size bytes, a multiple of 4096) ]
    [ string region (strings_size bytes)              ]
    [ stack table (stacks_size bytes, two halves)     ]
    [ heap table (heap_size bytes, 64-byte slots)     ]
    [ record slots (capacity x 128 bytes)             ]
    [ crash region (crash_size bytes, then the end)   ]

Nothing here does I/O: functions take bytes or buffers and return values, so
the writer, the reader and the golden-file tool share one definition.
"""

from __future__ import annotations

import json
import struct
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._errors import CorruptHeaderError, NotARingError, UnsupportedVersionError
from .schema import escape_surrogates, lone_surrogate, parse_meta

MAGIC = b"\x89BLKBOX\n"
FORMAT_VERSION = 5
SUPPORTED_VERSIONS = (1, 2, 3, 4, 5)
PAGE = 4096

# ---------------------------------------------------------------- header prefix
#   0  magic[8]   8 version u2   10 state u2   12 header_crc u4   16 header_size u4
#  20 record_size u4   24 capacity u8   32 records_offset u8   40 strings_offset u8
#  48 strings_size u8  56 meta_len u8   64 meta JSON (meta_len bytes), zero padding
PREFIX = struct.Struct("<8sHHIIIQQQQQ")
PREFIX_SIZE = PREFIX.size  # 64
STATE_OFFSET = 10
STATE_STRUCT = struct.Struct("<H")
CRC_START = 16  # the CRC covers bytes [16, 64 + meta_len): everything but magic/version/state/crc
STATE_ARMED = 1
STATE_CLEAN = 2
STATE_NAMES = {STATE_ARMED: "armed", STATE_CLEAN: "clean"}
MAX_HEADER_SIZE = 1 << 20

# ---------------------------------------------------------------- record slots
RECORD_SIZE = 128
NULL = -1  # gauges, step and device use -1 for "not measured / none"
FLAG_VALUE = 0x01  # flags bit 0: the value field holds a value (else value is null)
PAYLOAD_WORDS = 9
RECORD_DTYPE = np.dtype(
    [
        ("seq", "<u8"),
        ("time", "<i8"),
        ("thread", "<u8"),
        ("step", "<i8"),
        ("value", "<i8"),
        ("label", "<u4"),
        ("kind", "u1"),
        ("flags", "u1"),
        ("device", "<i2"),
    ]
    + [(f"p{i}", "<i8") for i in range(PAYLOAD_WORDS)]
    + [("commit", "<u8")]
)
# Same layout for struct.pack_into: an event leaves the payload zero, a sample fills it.
EVENT_FORMAT = "<QqQqqIBBh72xQ"
SAMPLE_FORMAT = "<QqQqqIBBh9qQ"
EVENT_STRUCT = struct.Struct(EVENT_FORMAT)
SAMPLE_STRUCT = struct.Struct(SAMPLE_FORMAT)
assert RECORD_DTYPE.itemsize == EVENT_STRUCT.size == SAMPLE_STRUCT.size == RECORD_SIZE
# The writer's view of the same bytes: label, kind, flags and device (offset 40..48)
# packed as one little-endian word, so the hot path passes four fewer arguments.
TAGGED_EVENT_STRUCT = struct.Struct("<QqQqqQ72xQ")
TAGGED_SAMPLE_STRUCT = struct.Struct("<QqQqqQ9qQ")


def tag(label: int, kind: int, flags: int, device: int) -> int:
    """The word at offset 40 of a slot: ``label | kind << 32 | flags << 40 | device << 48``."""
    return label | kind << 32 | flags << 40 | (device & 0xFFFF) << 48


KINDS: dict[int, str] = {
    1: "arm",
    2: "disarm",
    3: "sample",
    4: "step",
    5: "mark",
    6: "phase_begin",
    7: "phase_end",
    8: "gpu_sample",
    9: "oom",
    10: "exception",
    11: "signal",
    12: "alloc",
    13: "free_requested",
    14: "free",
    15: "segment_alloc",
    16: "segment_free",
    17: "segment_map",
    18: "segment_unmap",
    19: "module_begin",
    20: "module_end",
    21: "stack_sample",
    22: "exit",
    23: "child_sample",
    24: "cgroup_sample",
    25: "alloc_sample",
    26: "free_sample",
    27: "alert",
    28: "alert_action",
}
KIND_CODES = {name: code for code, name in KINDS.items()}
NOTE_PREFIX = "blackbox: "  # a ``mark`` with this label prefix is the recorder's own note (a collector failed)
# A ``mark`` the armed process writes just before it calls exec (``collect.execs``): the command line it becomes;
# ``EXEC_FAILED`` follows where the exec raised (the process went on)
EXEC_PREFIX, EXEC_FAILED = "blackbox exec: ", "blackbox exec failed"
EXEC_MARKS = (EXEC_PREFIX, EXEC_FAILED)
JOINS_PREFIX = "blackbox joins: "  # a ``mark``: the main thread, stood still, waits in the join of this thread
HELPER_PREFIX = "blackbox helper: "  # a ``mark`` naming what a multiprocessing child runs (``DataLoader worker``)
CELL_PREFIX = "blackbox cell: "  # a ``mark``: ``In[N] NAME``, the count IPython gave the cell it compiled as NAME
RANK_PREFIX = "blackbox rank: "  # a ``mark``: ``R of N``, the rank torch.distributed gave a process its env did not
# Two notes recovery reads back: PyTorch's allocator history lost actions between drains (the mark's value
# is the total lost so far), and the caching allocator runs with expandable segments.
NOTE_HISTORY_LOST = ("allocator history: actions lost between drains (PyTorch's history was full; raise "
                     "allocator_history)")
NOTE_EXPANDABLE = ("allocator: expandable_segments is on (segments grow and shrink in place: an OOM is not "
                   "fragmentation in the caching allocator's sense; the history has segment_map/unmap)")  # fmt: skip
# An ``exit`` record's detail: how its status was learnt. ``sys.exit`` raises SystemExit, which the job
# may still catch; ``os._exit`` ends the process at once (no exit handlers); ``process exit`` is the
# status the process really exited with, written inside libc's exit() after the interpreter finished.
EXIT_SYS, EXIT_OS, EXIT_PROCESS = "sys.exit", "os._exit", "process exit"
# An exception's detail where the job caught it and then called sys.exit with a failing status in its handler
# (``except Exception: log(...); sys.exit(1)``, torch.multiprocessing.spawn's workers): what the process died of
HANDLED_EXIT_PREFIX = "uncaught; caught by the job, which exited with status "
HANDLED_EXIT = HANDLED_EXIT_PREFIX + "{}"
# A signal's detail where the process was its PID namespace's first process (a container's entrypoint), or stood
# for it (`blackbox run` was that process, pid 1), and had no handler for it: the kernel drops it there, whoever
# sent it, but a fault; so did blackbox
DROPPED_AS_INIT = ("dropped (no handler; the kernel spares its PID namespace's first process: this one, or "
                   "`blackbox run` in its place)")
# ...where it was read at exit from sys.last_exc, the job's own excepthook not calling blackbox's: an uncaught
# one where the process then exits with a failing status (sys.last_exc may be an older one where it exits 0)
LAST_EXC = "uncaught; read at exit from sys.last_exc (the job's excepthook did not call blackbox's)"
# the frame a traceback cut to fit a string holds in place of its middle ones (the ``traceback`` column)
FRAMES_LEFT_OUT = "<blackbox: {} frames left out>"
ALLOCATOR_KINDS = ("alloc", "free_requested", "free", "segment_alloc", "segment_free", "segment_map", "segment_unmap")

# Payload words p0..p8: which timeline column each word of a kind fills, per format
# version (None or absent = unused). Integer words use -1 for "not measured"; a
# word whose column is a string (STRING_COLUMNS) holds a string id, 0 = none.
_ALLOC_WORDS = ("address", "stream", "allocator_time_us")
_MODULE_WORDS = ("gpu_allocated", "host_rss")
PAYLOAD_COLUMNS: dict[int, dict[str, tuple[str | None, ...]]] = {
    1: {
        "sample": (
            "host_rss",
            "cgroup_usage",
            "cgroup_limit",
            "gpu_allocated",
            "gpu_reserved",
            "device_free",
            "device_total",
        ),
    },
    2: {
        "sample": (
            "host_rss",
            "cgroup_usage",
            "cgroup_limit",
            "children_rss",
            "mem_available",
            "cgroup_oom_kills",
            "psi_some_us",
            "psi_full_us",
        ),
        "gpu_sample": (
            "gpu_allocated",
            "gpu_reserved",
            "gpu_active",
            "gpu_inactive_split",
            "device_free",
            "device_total",
            "gpu_alloc_retries",
            "gpu_ooms",
            "gpu_peak_allocated",
        ),
        "oom": ("detail", "device_total", "device_free"),
        "exception": ("detail",),
        "signal": ("detail",),
        "module_begin": _MODULE_WORDS,
        "module_end": _MODULE_WORDS,
        **dict.fromkeys(ALLOCATOR_KINDS, _ALLOC_WORDS),
    },
}
PAYLOAD_COLUMNS[3] = {
    **PAYLOAD_COLUMNS[2],
    # p3..p4: the sender's command name, 16 bytes of text (read by the handler from /proc/<pid>/comm)
    "signal": ("detail", "sender_pid", "signal_code", "sender", "sender"),
    # p0: the sampled thread (it fills the ``thread`` column); p1, p2: the stack's id and generation
    # in the stack table (resolved into ``detail``, the folded stack); p3: its depth before the cap
    "stack_sample": ("thread", "stack_id", "stack_generation", "stack_depth"),
    # one per child process (a DataLoader worker) at each sample: its pid and resident memory
    "child_sample": ("child_pid", "child_rss"),
    # p0: how the status was learnt (EXIT_SYS, EXIT_OS, EXIT_PROCESS); older writers left 0 (no detail)
    "exit": ("detail",),
    # the memory cgroup's memory.stat (where the limit is), at each sample
    "cgroup_sample": (
        "cgroup_anon",
        "cgroup_file",
        "cgroup_shmem",
        "cgroup_file_dirty",
        "cgroup_file_writeback",
        "cgroup_pgmajfault",
    ),
}
# Version 4: allocations sampled by bytes (collect/allocs.py). p2 names the allocating stack by its
# fingerprint (resolved into ``detail`` through the stack table's allocation stacks); p4 is the block's
# slot in the heap table (-1: the table was full).
_SAMPLE_WORDS = ("address", "sample_weight", "alloc_stack", "alloc_domain", "heap_slot")
PAYLOAD_COLUMNS[4] = {**PAYLOAD_COLUMNS[3], "alloc_sample": _SAMPLE_WORDS, "free_sample": _SAMPLE_WORDS}
# Version 5: alerts (collect/alerts.py), written by the sampler before the death. An ``alert`` names what
# (alert_kind), how bad (alert_level), against which limit (limit_kind, limit_bytes), the growth per second
# the fit found and the forecast of the time (ms) and steps to the limit with the half-widths of their 95%
# intervals; an ``alert_action`` is what blackbox did about one (its ``detail``) and the alert it answered.
# p8 of ``sample`` (version 5): the process's anonymous resident memory (statm's resident less shared), what
# the sampled allocations are compared with.
PAYLOAD_COLUMNS[5] = {
    **PAYLOAD_COLUMNS[4],
    "sample": (*PAYLOAD_COLUMNS[4]["sample"], "host_anon"),
    "alert": ("alert_kind", "alert_level", "limit_kind", "limit_bytes", "growth_per_s", "forecast_ms",
              "forecast_error_ms", "forecast_steps", "forecast_steps_error"),
    "alert_action": ("detail", "alert_kind", "alert_level"),
    # p5 of ``signal``: the faulting address of a fault the kernel raised (SIGSEGV, SIGBUS, SIGILL, an integer
    # SIGFPE: si_code > 0); older writers of version 5 left -1 (null)
    "signal": (*PAYLOAD_COLUMNS[4]["signal"], "address"),
    # the last word of ``exception`` (p1) and ``oom`` (p3): where it was raised, its traceback folded (a string
    # id); older writers of version 5 left 0 (none)
    "exception": ("detail", "traceback"),
    "oom": (*PAYLOAD_COLUMNS[4]["oom"], "traceback"),
}  # fmt: skip
STRING_COLUMNS = frozenset({"detail", "traceback"})  # the word holds a string id (0 = none)
TEXT_COLUMNS = frozenset({"sender"})  # consecutive words hold UTF-8 text, zero padded
ALLOC_DOMAINS = {1: "python", 2: "native", 3: "gpu"}  # alloc_domain codes: the allocator the block came from
ALERT_KINDS = {1: "memory", 2: "leak", 3: "fragmentation", 4: "forecast"}
ALERT_LEVELS = {1: "info", 2: "warning", 3: "critical"}
LIMIT_KINDS = {1: "cgroup", 2: "host", 3: "rlimit_as", 4: "gpu"}
CODED_COLUMNS = {"alloc_domain": ALLOC_DOMAINS, "alert_kind": ALERT_KINDS, "alert_level": ALERT_LEVELS,
                 "limit_kind": LIMIT_KINDS}  # the word holds a code, shown as its name  # fmt: skip
RESOLVED_WORDS = frozenset({"thread", "stack_id", "stack_generation", "alloc_stack", "heap_slot"})  # read by the reader
# Every payload column, in timeline order.
PAYLOAD_COLUMN_ORDER = tuple("""
host_rss host_anon cgroup_usage cgroup_limit children_rss mem_available cgroup_oom_kills psi_some_us
psi_full_us gpu_allocated gpu_reserved gpu_active gpu_inactive_split gpu_peak_allocated
gpu_alloc_retries gpu_ooms device_free device_total address stream allocator_time_us sender_pid
signal_code sender stack_depth child_pid child_rss cgroup_anon cgroup_file cgroup_shmem
cgroup_file_dirty cgroup_file_writeback cgroup_pgmajfault sample_weight alloc_domain alert_kind
alert_level limit_kind limit_bytes growth_per_s forecast_ms forecast_error_ms forecast_steps
forecast_steps_error detail traceback
""".split())
SAMPLE_FIELDS = PAYLOAD_COLUMNS[FORMAT_VERSION]["sample"]
GPU_SAMPLE_FIELDS = PAYLOAD_COLUMNS[FORMAT_VERSION]["gpu_sample"]
assert all(len(words) <= PAYLOAD_WORDS for layout in PAYLOAD_COLUMNS.values() for words in layout.values())
assert {c for layout in PAYLOAD_COLUMNS.values() for w in layout.values() for c in w if c} == set(
    PAYLOAD_COLUMN_ORDER
) | RESOLVED_WORDS


def payload_columns(version: int) -> dict[int, tuple[str | None, ...]]:
    """Kind code -> the column of each payload word, for a ring of this version."""
    return {KIND_CODES[k]: words for k, words in PAYLOAD_COLUMNS.get(version, {}).items()}


def kind_name(code: int) -> str:
    """Name of a kind code; codes this reader does not know come out as ``kind_<n>``."""
    return KINDS.get(code, f"kind_{code}")


# ---------------------------------------------------------------- string region
#   entry: id u4, length u4, crc32 u4, reserved u4, then `length` UTF-8 bytes, zero padded to 8
STRING_ENTRY = struct.Struct("<IIII")
STRING_ID_STRUCT = struct.Struct("<II")
MAX_STRING_BYTES = 4096
STRING_FULL_ID = 1
STRING_FULL_TEXT = "<blackbox: string region full, label lost>"
STRING_BUSY_ID = 0xFFFF_FFFF  # never written: a label first seen inside a signal handler that interrupted interning
STRING_BUSY_TEXT = "<blackbox: label lost (first used inside a signal handler during interning)>"


def pad8(n: int) -> int:
    return (n + 7) & ~7


def string_entry(string_id: int, text: str) -> bytes:
    """Encode one interned string; text longer than MAX_STRING_BYTES is cut at a character."""
    data = text.encode("utf-8", "replace")
    if len(data) > MAX_STRING_BYTES:
        data = data[: MAX_STRING_BYTES - 3].decode("utf-8", "ignore").encode() + "\u2026".encode()
    crc = zlib.crc32(data, zlib.crc32(STRING_ID_STRUCT.pack(string_id, len(data))))
    body = STRING_ENTRY.pack(string_id, len(data), crc, 0) + data
    return body + bytes(pad8(len(body)) - len(body))


# ---------------------------------------------------------------- stack table (version 3)
#   two halves; generation g fills half (g - 1) % 2, and when it is full generation g + 1 zeroes and fills
#   the other one. entry: generation u4, kind u2, flags u2, id u4, length u4, crc32 u4, reserved u4, then
#   `length` payload bytes, zero padded to 8. kind 1: a frame, UTF-8 "function (file:line)"; kind 2: a
#   stack, u4 frame ids of the same generation, outermost first.
STACK_ENTRY = struct.Struct("<IHHIIII")
STACK_FRAME = 1
STACK_STACK = 2
MAX_FRAME_BYTES = 1024
MAX_STACK_DEPTH = 64
STACK_TRUNCATED_TEXT = "<blackbox: outer frames cut>"
# version 4, kind 3: an allocation stack, keyed by its fingerprint (the id is a per-generation counter):
# fingerprint u8, depth u4, frame count n u4, n frame ids u4 (outermost first), then UTF-8 text: the
# allocating thread's name, a zero byte, the source line of the innermost frame outside libraries.
STACK_ALLOC = 3
ALLOC_STACK_HEAD = struct.Struct("<QII")
MAX_ALLOC_TEXT = 512
MAX_ALLOC_STACK_BYTES = ALLOC_STACK_HEAD.size + 4 * MAX_STACK_DEPTH + MAX_ALLOC_TEXT
NO_PYTHON_STACK = 1  # the fingerprint of a thread with no Python frames (a native thread)
NO_PYTHON_TEXT = "<no Python frames: a native thread>"
STACK_UNWRITTEN_TEXT = "<blackbox: allocation stack not in the table (first seen in the last tick, or overwritten)>"


def stack_crc(gen: int, kind: int, sid: int, payload: bytes) -> int:
    return zlib.crc32(payload, zlib.crc32(struct.pack("<IHII", gen, kind, sid, len(payload))))


def stack_entry(gen: int, kind: int, sid: int, payload: bytes) -> bytes:
    """Encode one stack-table entry (a frame's text or a stack's frame ids)."""
    body = STACK_ENTRY.pack(gen, kind, 0, sid, len(payload), stack_crc(gen, kind, sid, payload), 0) + payload
    return body + bytes(pad8(len(body)) - len(body))


def alloc_stack_payload(fingerprint: int, depth: int, frame_ids: list[int], thread: str, line: str) -> bytes:
    """The payload of a kind-3 entry: ``frame_ids`` outermost first (at most MAX_STACK_DEPTH)."""
    text = (thread.encode("utf-8", "replace")[:255] + b"\0" + line.encode("utf-8", "replace"))[:MAX_ALLOC_TEXT]
    head = ALLOC_STACK_HEAD.pack(fingerprint & ((1 << 64) - 1), depth, len(frame_ids))
    return head + struct.pack(f"<{len(frame_ids)}I", *frame_ids) + text


def parse_alloc_stack(payload: bytes) -> tuple[int, int, tuple[int, ...], str, str] | None:
    """(fingerprint, depth, frame ids, thread name, source line) of a kind-3 payload, None if malformed."""
    if len(payload) < ALLOC_STACK_HEAD.size or len(payload) > MAX_ALLOC_STACK_BYTES:
        return None
    fingerprint, depth, n = ALLOC_STACK_HEAD.unpack_from(payload)
    end = ALLOC_STACK_HEAD.size + 4 * n
    if n > MAX_STACK_DEPTH or end > len(payload):
        return None
    ids = struct.unpack_from(f"<{n}I", payload, ALLOC_STACK_HEAD.size)
    thread, _, line = payload[end:].partition(b"\0")
    return fingerprint, depth, ids, thread.decode("utf-8", "replace"), line.decode("utf-8", "replace")


# ---------------------------------------------------------------- heap table (version 4)
#   heap_size / 64 slots, one per sampled block live at the last write. A slot whose address is 0 is
#   empty; a slot is valid when its check word equals heap_check of its first seven words (the
#   writer stores the address last, and zeroes it first when the block is freed).
HEAP_SLOT = 64
HEAP_DTYPE = np.dtype(
    [
        ("address", "<u8"),
        ("size", "<u8"),
        ("weight", "<u8"),
        ("stack", "<u8"),
        ("time", "<i8"),
        ("thread", "<u8"),
        ("step", "<i4"),
        ("domain", "<u2"),
        ("flags", "<u2"),
        ("check", "<u8"),
    ]
)
assert HEAP_DTYPE.itemsize == HEAP_SLOT
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


def _mix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, elementwise on uint64 (wrapping)."""
    z = z + _MIX[0]
    z = (z ^ (z >> np.uint64(30))) * _MIX[1]
    z = (z ^ (z >> np.uint64(27))) * _MIX[2]
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


def heap_check(slots: np.ndarray) -> np.ndarray:
    """The check word of each HEAP_DTYPE slot: c = 0, then c = mix64(c ^ word) over words 0..6."""
    words = np.ascontiguousarray(slots).view("<u8").reshape(len(slots), HEAP_SLOT // 8)
    c = np.zeros(len(slots), np.uint64)
    with np.errstate(over="ignore"):
        for i in range(7):
            c = _mix64(c ^ words[:, i])
    return c


def heap_slot_bytes(address: int, size: int, weight: int, stack: int, time: int, thread: int, step: int,
                    domain: int) -> bytes:  # fmt: skip
    """One valid slot, as the writer leaves it (for the golden-file tool and tests)."""
    slot = np.zeros(1, HEAP_DTYPE)
    slot[0] = (address, size, weight, stack, time, thread, step, domain, 0, 0)
    slot["check"] = heap_check(slot)
    return slot.tobytes()


# ---------------------------------------------------------------- signal slots
# A writer without the C extension has faulthandler write the Python stack into slot i, past the end of
# the ring, when SIGNAL_SLOTS[i] arrives with its default action (which then ends the process): FORMAT.md.
CRASH_TEXT_MAX = 1 << 20  # readers take at most this much crash text from the crash region's start
SIGNAL_SLOTS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
SIGNAL_SLOT_SIZE = 128 << 10  # faulthandler's stack of one thread: at most 100 frames of about 1 KiB


def signal_slot_offset(header: Header, i: int) -> int:
    """Where slot i starts: past the most crash text readers take, so none of them reads it as a crash."""
    return header.crash_offset + CRASH_TEXT_MAX + i * SIGNAL_SLOT_SIZE

# ---------------------------------------------------------------- header
DEFAULT_CRASH_SIZE = 64 << 10


@dataclass
class Header:
    version: int
    state: int
    header_size: int
    record_size: int
    capacity: int
    records_offset: int
    strings_offset: int
    strings_size: int
    meta: dict[str, Any]
    stacks_size: int = 0  # version 3: the stack table, between the strings and the records
    crash_size: int = 0  # version 3: faulthandler's output, after the records
    heap_size: int = 0  # version 4: the heap table, between the stack table and the records

    @property
    def stacks_offset(self) -> int:
        return self.strings_offset + self.strings_size

    @property
    def heap_offset(self) -> int:
        return self.stacks_offset + self.stacks_size

    @property
    def crash_offset(self) -> int:
        return self.records_offset + self.capacity * self.record_size

    @property
    def file_size(self) -> int:
        return self.crash_offset + self.crash_size


def _page(n: int) -> int:
    return -(-n // PAGE) * PAGE


def encode_header(
    capacity: int,
    strings_size: int,
    meta: dict[str, Any],
    version: int = FORMAT_VERSION,
    *,
    stacks_size: int = 0,
    crash_size: int = 0,
    heap_size: int = 0,
) -> bytes:
    """The header region's bytes (prefix, metadata JSON, zero padding), state ``armed``.

    ``version`` other than the current one is for the golden-file tool only. Version 3
    sizes (rounded up to pages; the stack table to two pages at least) go in the metadata,
    and from version 4 the heap table's (rounded up to pages; 0: none).
    """
    meta = dict(meta, record_dtype=[[n, RECORD_DTYPE[n].str] for n in RECORD_DTYPE.names or ()])
    if version >= 3:
        stacks_size = max(2 * PAGE, -(-stacks_size // (2 * PAGE)) * 2 * PAGE)
        meta["regions"] = {"stacks_size": stacks_size, "crash_size": _page(crash_size)}
        if version >= 4:
            heap_size = _page(heap_size)
            meta["regions"]["heap_size"] = heap_size
    else:
        stacks_size = 0
    if version < 4:
        heap_size = 0
    blob = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
    if lone_surrogate(meta, blob):  # its reader would refuse it: a command line's bytes that are not UTF-8
        blob = json.dumps(escape_surrogates(meta), sort_keys=True, separators=(",", ":")).encode()
    header_size, strings_size = _page(PREFIX_SIZE + len(blob)), _page(strings_size)
    if header_size > MAX_HEADER_SIZE:
        raise ValueError(f"ring metadata is {len(blob)} bytes; at most {MAX_HEADER_SIZE - 64} fit")
    records_offset = header_size + strings_size + stacks_size + heap_size
    fields = (header_size, RECORD_SIZE, capacity, records_offset, header_size, strings_size)
    tail = PREFIX.pack(MAGIC, version, STATE_ARMED, 0, *fields, len(blob))[CRC_START:] + blob
    crc = zlib.crc32(tail)
    raw = PREFIX.pack(MAGIC, version, STATE_ARMED, crc, *fields, len(blob)) + blob
    return raw + bytes(header_size - len(raw))


MAX_REGION = 1 << 40


def _regions(meta: dict[str, Any], problems: list[str], version: int) -> tuple[int, int, int]:
    """(stacks_size, crash_size, heap_size) of a version-3 or 4 header's metadata, checked."""
    regions = meta.get("regions")
    sizes = []
    for key in ("stacks_size", "crash_size", "heap_size")[: 3 if version >= 4 else 2]:
        v = regions.get(key) if isinstance(regions, dict) else None
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_REGION or v % PAGE:
            problems.append(f"regions.{key} {v!r} (expected a multiple of {PAGE})")
            v = 0
        sizes.append(v)
    if sizes[0] % (2 * PAGE):
        problems.append(f"a stack table of {sizes[0]} bytes (expected two whole halves)")
    return sizes[0], sizes[1], sizes[2] if version >= 4 else 0


def decode_header(raw: bytes, file_size: int, name: str = "ring") -> Header:
    """Parse and check a header read from the start of a file of ``file_size`` bytes.

    ``raw`` must hold at least the prefix and the metadata it declares (the
    caller reads ``PREFIX_SIZE`` bytes first, then ``64 + meta_len``).
    """
    if len(raw) < PREFIX_SIZE or raw[:8] != MAGIC:
        # never the file's bytes: recovery may run as root, and the message may land in a shared bundle
        found = "an empty file" if file_size == 0 else f"a {file_size}-byte file that does not start with it"
        raise NotARingError(f"{name}: expected a blackbox ring (magic {MAGIC!r}), found {found}")
    magic, version, state, crc, hsize, rsize, cap, roff, soff, ssize, mlen = PREFIX.unpack_from(raw)
    if version not in SUPPORTED_VERSIONS:
        raise UnsupportedVersionError(
            f"{name}: expected format version {', '.join(map(str, SUPPORTED_VERSIONS))}, "
            f"found version {version} (written by a newer blackbox? upgrade to read it)"
        )
    if mlen > MAX_HEADER_SIZE - PREFIX_SIZE or len(raw) < PREFIX_SIZE + mlen:
        raise CorruptHeaderError(
            f"{name}: expected header metadata of at most {MAX_HEADER_SIZE} bytes within the file, "
            f"found a length of {mlen} bytes"
        )
    blob = raw[PREFIX_SIZE : PREFIX_SIZE + mlen]
    actual = zlib.crc32(raw[CRC_START:PREFIX_SIZE] + blob)
    if actual != crc:
        raise CorruptHeaderError(f"{name}: expected header checksum {crc:#010x}, found {actual:#010x} (header damaged)")
    meta, problems = parse_meta(blob)  # types, ranges, depth: see ``schema``
    stacks, crash, heap = _regions(meta, problems, version) if version >= 3 else (0, 0, 0)
    if rsize != RECORD_SIZE:
        problems.append(f"record size {rsize} (expected {RECORD_SIZE})")
    if hsize % PAGE or hsize < PREFIX_SIZE + mlen or hsize > MAX_HEADER_SIZE:
        problems.append(f"header size {hsize}")
    if soff != hsize or roff != soff + ssize + stacks + heap or roff % 64:
        problems.append(f"region offsets strings={soff}+{ssize} stacks={stacks} heap={heap} records={roff}")
    if not 1 <= cap <= MAX_REGION // RECORD_SIZE or ssize > MAX_REGION:
        problems.append(f"capacity {cap}, strings size {ssize}")
    expected_dtype = [[n, RECORD_DTYPE[n].str] for n in RECORD_DTYPE.names or ()]
    if meta and meta.get("record_dtype") != expected_dtype:
        problems.append(f"a record dtype that differs from format version {version}")
    if problems:
        raise CorruptHeaderError(f"{name}: expected a consistent version-{version} header, found {'; '.join(problems)}")
    return Header(version, state, hsize, rsize, cap, roff, soff, ssize, meta, stacks, crash, heap)


# ---------------------------------------------------------------- the commit rule
@dataclass
class SlotCensus:
    valid: np.ndarray  # bool per slot
    empty: int
    torn: int
    stale: int  # intact but out of slot position or window: never returned


def classify(slots: np.ndarray, capacity: int) -> SlotCensus:
    """Apply the commit rule to an array of RECORD_DTYPE slots (index = slot number).

    A slot is *empty* when all its bytes are zero. It is *valid* when
    ``seq != 0``, ``commit == seq`` and ``seq % capacity == slot index``, and its
    seq lies within ``capacity`` of the newest valid seq. Everything else is
    *torn* (cut by a kill mid-write, or damaged) or *stale*.
    """
    seq = slots["seq"]
    index = np.arange(len(slots), dtype=np.uint64)
    intact = (seq != 0) & (slots["commit"] == seq) & (seq % np.uint64(capacity) == index)
    stale = np.zeros(len(slots), dtype=bool)
    if intact.any():
        head = seq[intact].max()
        low = head - np.uint64(min(int(head), capacity))
        stale = intact & (seq <= low)
    valid = intact & ~stale
    rest = np.flatnonzero(~intact)  # only these can be empty or torn: usually few in a full ring
    words = slots[rest].view("<u8").reshape(len(rest), RECORD_SIZE // 8)
    empty = int((~words.any(axis=1)).sum())
    return SlotCensus(valid, empty, len(rest) - empty, int(stale.sum()))
