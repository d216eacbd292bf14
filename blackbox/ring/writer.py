"""The hot path: closures that write records into a mapped ring.

Why closures: a call like ``mark("x", 3)`` must cost well under a microsecond.
Closure cells are the cheapest state CPython can read, so every write function
below reads its buffer, capacity and current step from cells and does exactly
one ``struct.pack_into`` into the mapping.

Thread safety without a lock: ``tick()`` is one C-level call (``zip`` over
``itertools.count``, ``time.monotonic_ns`` and ``threading.get_ident``) that
returns the sequence number, the timestamp and the thread together. Under the
GIL no other thread runs inside it, so seq order and time order agree, and no
two writers ever get the same seq (hence the same slot, within one lap).
``pack_into`` zeroes the slot and writes the fields in order, ``commit`` last,
so a writer killed mid-record leaves ``commit != seq`` and the reader drops it.

When the C extension ``blackbox.ring._cwriter`` is built (it is optional), the same
functions come from it instead: same bytes, a third of the cost, and the whole
record is written under the GIL. ``BLACKBOX_WRITER=python`` forces this module's
path.

Interning a new label string is the slow path: it takes a lock, appends a
CRC-checked entry to the string region, and only then publishes the id, so a
record never refers to a string that is not yet on disk.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from itertools import count, repeat, starmap
from typing import Any

from .format import (
    FLAG_VALUE,
    KIND_CODES,
    NULL,
    PAYLOAD_WORDS,
    RECORD_SIZE,
    STRING_FULL_ID,
    STRING_FULL_TEXT,
    TAGGED_EVENT_STRUCT,
    TAGGED_SAMPLE_STRUCT,
    string_entry,
    tag,
)

# Precomputed tag words (label 0): the hot path adds the label id to them.
MARK_TAG = tag(0, KIND_CODES["mark"], 0, -1)
MARK_VALUE_TAG = tag(0, KIND_CODES["mark"], FLAG_VALUE, -1)
STEP_TAG = tag(0, KIND_CODES["step"], FLAG_VALUE, -1)
NULL_WORDS = (NULL,) * PAYLOAD_WORDS
SAMPLE_TAG = tag(0, KIND_CODES["sample"], 0, 0)  # the device bits are added per sample
assert RECORD_SIZE == 1 << 7


def c_writer_module() -> Any:
    """The compiled write path, or None when it is not built or BLACKBOX_WRITER=python."""
    if os.environ.get("BLACKBOX_WRITER", "").lower() == "python":
        return None
    try:
        from . import _cwriter  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _cwriter


class RingWriter:
    """Write functions bound to one mapped ring. ``kill()`` turns them all into no-ops.

    ``mark``, ``step``, ``event`` and ``sample`` are plain callables stored on
    the instance (no method binding on the hot path). Errors inside them are
    passed to ``on_error`` and never raised. ``backend`` is ``"c"`` or ``"python"``.
    """

    mark: Callable[..., None]
    step: Callable[..., None]
    event: Callable[..., int]
    sample: Callable[..., None]
    current_step: Callable[[], int]
    intern: Callable[[Any], int]
    kill: Callable[[], None]
    backend: str

    def __init__(
        self,
        buffer: Any,
        records_offset: int,
        capacity: int,
        strings_offset: int,
        strings_size: int,
        on_error: Callable[[BaseException], None],
        *,
        backend: str | None = None,
    ) -> None:
        if backend not in (None, "c", "python"):
            raise ValueError(f"backend must be 'c', 'python' or None, got {backend!r}")
        cmod = None if backend == "python" else c_writer_module()
        if backend == "c" and cmod is None:
            raise ImportError("the C write path blackbox.ring._cwriter is not built (or BLACKBOX_WRITER=python)")
        whole = memoryview(buffer)
        strings: Any = whole[strings_offset : strings_offset + strings_size]
        records: Any = None if cmod else whole[records_offset : records_offset + capacity * RECORD_SIZE]
        whole.release()
        ids: dict[Any, int] = {}
        lookup = ids.get
        lock = threading.Lock()
        next_id = STRING_FULL_ID
        string_pos = 0
        full = False
        dead = False

        def intern(label: Any) -> int:
            nonlocal next_id, string_pos, full
            if label is None:
                return 0
            if full:
                return STRING_FULL_ID
            with lock:
                sid = lookup(label)
                if sid:
                    return sid
                text = label if isinstance(label, str) else str(label)
                entry = string_entry(next_id, text)
                end = string_pos + len(entry)
                if end > len(strings):
                    full = True
                    return STRING_FULL_ID
                strings[string_pos:end] = entry
                string_pos = end
                sid = next_id
                next_id += 1
                ids[label] = sid
                return sid

        # The reserved "region full" entry goes first, so id 1 always resolves.
        if intern(STRING_FULL_TEXT) != STRING_FULL_ID:
            raise ValueError(f"string region of {strings_size} bytes cannot hold its first entry")

        def safe_intern(label: Any) -> int:
            """A string id for a payload word (0 if the writer is dead)."""
            try:
                return lookup(label) or intern(label)
            except Exception:
                return 0

        self.intern = safe_intern
        if cmod is not None:
            w = cmod.Writer(
                buffer, records_offset, capacity, ids, intern, on_error, MARK_TAG, MARK_VALUE_TAG, STEP_TAG, SAMPLE_TAG
            )

            def kill_c() -> None:
                nonlocal strings, dead
                dead = True
                w.kill()
                if strings is not None:
                    view, strings = strings, None
                    view.release()

            self.mark, self.step, self.event, self.sample = w.mark, w.step, w.event, w.sample
            self.current_step, self.kill, self.backend = w.current_step, kill_c, "c"
            return

        cap = capacity
        pack_event = TAGGED_EVENT_STRUCT.pack_into
        pack_sample = TAGGED_SAMPLE_STRUCT.pack_into
        tick = zip(count(1), starmap(time.monotonic_ns, repeat(())), starmap(threading.get_ident, repeat(()))).__next__
        step_now = -1

        def mark(label: str, value: int | None = None) -> None:
            """Record a ``mark`` event with a label and an optional int64 value."""
            try:
                seq, t, th = tick()
                lid = lookup(label) or intern(label)
                if value is None:
                    pack_event(records, (seq % cap) << 7, seq, t, th, step_now, 0, lid | MARK_TAG, seq)
                else:
                    pack_event(records, (seq % cap) << 7, seq, t, th, step_now, value, lid | MARK_VALUE_TAG, seq)
            except Exception as exc:
                if not dead:
                    on_error(exc)

        def step(n: int | None = None) -> None:
            """Start step ``n`` (the next step when None); later events carry it."""
            nonlocal step_now
            try:
                new = step_now + 1 if n is None else n.__index__()
                if new < 0:
                    raise ValueError(f"step must be >= 0, got {new}")
                step_now = new
                seq, t, th = tick()
                pack_event(records, (seq % cap) << 7, seq, t, th, new, new, STEP_TAG, seq)
            except Exception as exc:
                if not dead:
                    on_error(exc)

        def event(kind: int, label: Any = None, value: int | None = None, device: int = -1, payload: Any = None) -> int:
            """Write any event; returns its monotonic timestamp (0 if it was dropped).

            ``payload``: up to 9 ints for p0..p8, the missing ones -1 (not measured).
            """
            try:
                if not (0 <= kind <= 255 and -32768 <= device <= 32767):
                    raise ValueError(f"kind {kind} or device {device} out of range")
                if payload is not None:
                    words = tuple(payload)
                    if len(words) > PAYLOAD_WORDS:
                        raise ValueError(f"payload must hold at most {PAYLOAD_WORDS} ints, got {len(words)}")
                    words += NULL_WORDS[len(words) :]
                seq, t, th = tick()
                lid = (lookup(label) or intern(label)) if label is not None else 0
                flags, v = (0, 0) if value is None else (FLAG_VALUE, value)
                word = tag(lid, kind, flags, device)
                if payload is None:
                    pack_event(records, (seq % cap) << 7, seq, t, th, step_now, v, word, seq)
                else:
                    pack_sample(records, (seq % cap) << 7, seq, t, th, step_now, v, word, *words, seq)
                return t
            except Exception as exc:
                if not dead:
                    on_error(exc)
                return 0

        def sample(payload: tuple[int, ...], device: int = -1) -> None:
            """Write a ``sample`` record; ``payload`` is the 9 gauge words (-1 = null)."""
            try:
                seq, t, th = tick()
                pack_sample(
                    records,
                    (seq % cap) << 7,
                    seq,
                    t,
                    th,
                    step_now,
                    0,
                    SAMPLE_TAG | (device & 0xFFFF) << 48,
                    *payload,
                    seq,
                )
            except Exception as exc:
                if not dead:
                    on_error(exc)

        def current_step() -> int:
            return step_now

        def kill() -> None:
            nonlocal records, strings, dead
            dead = True
            r, s = records, strings
            records = strings = None
            for view in (r, s):
                if view is not None:
                    view.release()

        self.mark, self.step, self.event, self.sample = mark, step, event, sample
        self.current_step, self.kill, self.backend = current_step, kill, "python"
