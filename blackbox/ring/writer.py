"""The hot path: closures that write records into a mapped ring.

Why closures: a call like ``mark("x", 3)`` must cost well under a microsecond.
Closure cells are the cheapest state CPython can read, so every write function
below reads its buffer, capacity and current step from cells and does exactly
one ``struct.pack_into`` into the mapping.

Thread safety without a lock: a record is written by one C-level call (see
``_pipeline``) that takes the seq, reads the clock and packs the slot without
running a bytecode, so under the GIL no other thread runs in between: seq order
and time order agree, no two writers get the same seq, and no writer can be
held back between its seq and its write while others lap the ring. ``pack_into``
zeroes the slot and writes the fields in order, ``commit`` last, so a writer
killed mid-record leaves ``commit != seq`` and the reader drops it. Every value
is converted to an int first, so ``pack_into`` runs no Python code (a tensor's
``__index__`` could otherwise let another thread disarm mid-write).

When the C extension ``blackbox.ring._cwriter`` is built (it is optional), the
seq counter is its ``Sequence``, an atomic fetch-add shared with the signal
handler, and the write functions come from it too: same bytes, a third of the
cost. ``BLACKBOX_WRITER=python`` forces this module's write functions (the
counter stays the C one where it is built, so signals are still recorded).
``BLACKBOX_NO_C_EXTENSION=1`` acts as if the extension were not built at all
(what an install without a C compiler gets: see ``collect.death_signals``).
That counter also moves the write window (``_cwriter.c``, 4.): taking the seq of
a chunk's first slot unmaps the previous chunk from the process, so that the
ring's pages stay out of its RSS; without the extension the sampler's tick
unmaps them (``Recorder._drop_ring_pages``).

Interning a new label string is the slow path: it takes a lock, appends a
CRC-checked entry to the string region, and only then publishes the id, so a
record never refers to a string that is not yet on disk. It never waits on
itself: a signal handler of the job's that interrupts this thread while it
interns, and marks a label never seen before, gets the "label lost" id instead
of a deadlock (the event is kept).
"""

from __future__ import annotations

import operator
import os
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from itertools import count, repeat, starmap, tee
from typing import Any

from .._jobsignal import raised_by_signal_handler
from .format import (
    FLAG_VALUE,
    KIND_CODES,
    NULL,
    PAYLOAD_WORDS,
    RECORD_SIZE,
    STRING_BUSY_ID,
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
WINDOW_SLOTS = 2048  # the write window's chunk: 256 KiB of records mapped at a time (_cwriter.c, 4.)
assert RECORD_SIZE == 1 << 7


NO_C_ENV = "BLACKBOX_NO_C_EXTENSION"  # "1": behave as an install without a C compiler (tests, comparisons)
NO_C_SAID_ENV = "BLACKBOX_NO_C_EXTENSION_SAID"  # set by `blackbox run` once it has said NO_C_EXTENSION for its job
NO_C_EXTENSION = (
    "blackbox's C extension (blackbox.ring._cwriter) is not built, as after an install without a C compiler: "
    "allocations are not sampled (they need blackbox.collect._csample, built with it; summary.md's \"Who holds "
    "the memory\" says not recorded); a signal is recorded only where its default action ends the process, and "
    "without its sender; a signal the job's own handler takes, and the status of an exit that calls neither "
    "sys.exit nor os._exit (a top-level `raise SystemExit(n)`), are not recorded. Reinstall blackbox where a C "
    "compiler and Python's headers are present to record them"
)


def c_writer_module() -> Any:
    """The compiled write path, or None when it is not built or BLACKBOX_WRITER=python."""
    if os.environ.get("BLACKBOX_WRITER", "").lower() == "python":
        return None
    return built_module()


def built_module() -> Any:
    """The C extension where it is built, whatever BLACKBOX_WRITER says (its seq counter serves both paths);
    None where it is not, or where BLACKBOX_NO_C_EXTENSION=1 says to act as if it were not."""
    if os.environ.get(NO_C_ENV, "") not in ("", "0"):
        return None
    try:
        from . import _cwriter  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _cwriter


_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def int64(value: Any) -> int:
    """``operator.index(value)``, checked to fit the int64 field (as the C path checks it)."""
    v = operator.index(value)
    if not _I64_MIN <= v <= _I64_MAX:
        raise OverflowError("value does not fit in int64")
    return v


def _pipeline(
    record: struct.Struct, records: Any, capacity: int, sequence: Iterator[int]
) -> tuple[Callable[[tuple[int, ...]], None], Callable[[], None]]:
    """(push, write) for the Python write path, one pair per thread (``_Pipelines``): ``push`` queues a
    record's own fields (thread, step, value, tag word, payload); ``write`` writes the newest queued one
    into its slot in one C-level call: the iterators below take the seq (``tee``: the same one for the
    offset, the seq word and the commit word), read the clock, pop the fields and end in
    ``struct.pack_into``, so no other thread can run between taking a seq and writing its slot (else a
    thread held back for a whole lap of the ring would overwrite a newer record with its stale one), but
    for a garbage collection's finalizers on 3.10 and 3.11, which may run inside that call. So each
    thread writes only what it pushed: a call returns with its own record written, whoever ran meanwhile
    (one queue for all threads once let a thread return while its record waited for another's write,
    and a SIGKILL lost that acknowledged event: tests/test_writer_acknowledges.py). The newest first: a
    signal handler's write that runs between its thread's push and write writes its own record."""
    queue: deque[tuple[int, ...]] = deque()
    for_offset, for_seq, for_commit = tee(sequence, 3)
    offsets = map(operator.lshift, map(operator.mod, for_offset, repeat(capacity)), repeat(7))
    clock = starmap(time.monotonic_ns, repeat(()))
    head = zip(repeat(records), offsets, for_seq, clock)  # noqa: B905 (endless iterators)
    tail = map(operator.add, iter(queue.pop, None), zip(for_commit))
    writes = starmap(record.pack_into, map(operator.add, head, tail))
    return queue.append, writes.__next__


class _Pipelines(threading.local):
    """The calling thread's (push, write) pairs for events and samples (made on its first write)."""

    def __init__(self, records: Any, capacity: int, sequence: Iterator[int]) -> None:
        self.push_event, self.write_event = _pipeline(TAGGED_EVENT_STRUCT, records, capacity, sequence)
        self.push_sample, self.write_sample = _pipeline(TAGGED_SAMPLE_STRUCT, records, capacity, sequence)


def new_sequence(cmod: Any) -> Iterator[int]:
    """The ring's seq counter: the C extension's atomic one where it is built, else ``count(1)``."""
    return cmod.Sequence() if cmod is not None else count(1)


class RingWriter:
    """Write functions bound to one mapped ring. ``kill()`` turns them all into no-ops.

    ``mark``, ``step``, ``event`` and ``sample`` are plain callables stored on
    the instance (no method binding on the hot path). Errors inside them are
    passed to ``on_error`` and never raised. ``backend`` is ``"c"`` or ``"python"``;
    ``sequence`` is the seq counter (the C ``Sequence`` that the signal handler
    shares, or None where the extension is not built). ``file_mapped``: the buffer
    is a ``MAP_SHARED`` file mapping (mapping.py), so the seq counter may keep
    only the write window of it mapped (never say so of other memory: unmapping
    anonymous pages zeroes them).
    """

    mark: Callable[..., None]
    step: Callable[..., None]
    event: Callable[..., int]
    sample: Callable[..., None]
    current_step: Callable[[], int]
    intern: Callable[[Any], int]
    kill: Callable[[], None]
    backend: str
    sequence: Any

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
        file_mapped: bool = False,
    ) -> None:
        if backend not in (None, "c", "python"):
            raise ValueError(f"backend must be 'c', 'python' or None, got {backend!r}")
        built = built_module()
        cmod = None if backend == "python" else c_writer_module()
        if backend == "c" and cmod is None:
            raise ImportError("the C write path blackbox.ring._cwriter is not built (or BLACKBOX_WRITER=python)")
        sequence = new_sequence(built)
        self.sequence = sequence if built is not None else None
        windowed: Any = self.sequence if file_mapped else None
        whole = memoryview(buffer)
        strings: Any = whole[strings_offset : strings_offset + strings_size]
        records: Any = None if cmod else whole[records_offset : records_offset + capacity * RECORD_SIZE]
        whole.release()
        ids: dict[Any, int] = {}
        lookup = ids.get
        lock = threading.Lock()
        interning: dict[int, bool] = {}  # threads inside intern(), set before the lock is taken
        get_ident = threading.get_ident
        next_id = STRING_FULL_ID
        string_pos = 0
        full = False
        dead = False

        def intern(label: Any) -> int:
            nonlocal next_id, string_pos, full
            if label is None:
                return 0
            sid = lookup(label)
            if sid:
                return sid
            if full:
                return STRING_FULL_ID
            text = label if isinstance(label, str) else str(label)  # may run the job's code: not under the lock
            me = get_ident()
            if me in interning:
                return STRING_BUSY_ID  # re-entered from a signal handler while this thread interns: never wait
            interning[me] = True
            try:
                with lock:
                    sid = lookup(label)
                    if sid:
                        return sid
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
            finally:
                interning.pop(me, None)

        # The reserved "region full" entry goes first, so id 1 always resolves.
        if intern(STRING_FULL_TEXT) != STRING_FULL_ID:
            raise ValueError(f"string region of {strings_size} bytes cannot hold its first entry")

        def safe_intern(label: Any) -> int:
            """A string id for a payload word (0 if the writer is dead)."""
            try:
                return lookup(label) or intern(label)
            except Exception as exc:
                if raised_by_signal_handler(exc):
                    raise
                return 0

        self.intern = safe_intern
        if cmod is not None:
            if hasattr(cmod, "job_exception_test"):  # what the C writer must never swallow (_jobsignal.py)
                cmod.job_exception_test(raised_by_signal_handler)
            w = cmod.Writer(
                buffer,
                records_offset,
                capacity,
                sequence,
                ids,
                intern,
                on_error,
                MARK_TAG,
                MARK_VALUE_TAG,
                STEP_TAG,
                SAMPLE_TAG,
            )

            def kill_c() -> None:
                nonlocal strings, dead
                dead = True
                w.kill()
                if windowed is not None:
                    windowed.close_window()
                if strings is not None:
                    view, strings = strings, None
                    view.release()

            if windowed is not None:  # last: nothing after it fails
                windowed.window(buffer, records_offset, capacity, WINDOW_SLOTS)
            self.mark, self.step, self.event, self.sample = w.mark, w.step, w.event, w.sample
            self.current_step, self.kill, self.backend = w.current_step, kill_c, "c"
            return

        pipes = _Pipelines(records, capacity, sequence)
        monotonic_ns = time.monotonic_ns
        index = operator.index
        step_now = -1

        def mark(label: str, value: int | None = None) -> None:
            """Record a ``mark`` event with a label and an optional int64 value."""
            try:
                if value is None:
                    lid = lookup(label) or intern(label)
                    pipes.push_event((get_ident(), step_now, 0, lid | MARK_TAG))
                else:
                    v = int64(value)
                    lid = lookup(label) or intern(label)
                    pipes.push_event((get_ident(), step_now, v, lid | MARK_VALUE_TAG))
                pipes.write_event()
            except Exception as exc:
                if raised_by_signal_handler(exc):  # the job's signal handler ran meanwhile: the job's
                    raise
                if not dead:
                    on_error(exc)

        def step(n: int | None = None) -> None:
            """Start step ``n`` (the next step when None); later events carry it."""
            nonlocal step_now
            try:
                new = step_now + 1 if n is None else int64(n)
                if new < 0:
                    raise ValueError(f"step must be >= 0, got {new}")
                step_now = new
                pipes.push_event((get_ident(), new, new, STEP_TAG))
                pipes.write_event()
            except Exception as exc:
                if raised_by_signal_handler(exc):  # the job's signal handler ran meanwhile: the job's
                    raise
                if not dead:
                    on_error(exc)

        def event(kind: int, label: Any = None, value: int | None = None, device: int = -1, payload: Any = None) -> int:
            """Write any event; returns a monotonic timestamp read just after it (0 if it was dropped).

            ``payload``: up to 9 ints for p0..p8, the missing ones -1 (not measured).
            """
            try:
                kind, device = index(kind), index(device)
                if not (0 <= kind <= 255 and -32768 <= device <= 32767):
                    raise ValueError(f"kind {kind} or device {device} out of range")
                if payload is not None:
                    words = tuple(map(int64, payload))
                    if len(words) > PAYLOAD_WORDS:
                        raise ValueError(f"payload must hold at most {PAYLOAD_WORDS} ints, got {len(words)}")
                    words += NULL_WORDS[len(words) :]
                flags, v = (0, 0) if value is None else (FLAG_VALUE, int64(value))
                lid = (lookup(label) or intern(label)) if label is not None else 0
                word = tag(lid, kind, flags, device)
                if payload is None:
                    pipes.push_event((get_ident(), step_now, v, word))
                    pipes.write_event()
                else:
                    pipes.push_sample((get_ident(), step_now, v, word, *words))
                    pipes.write_sample()
                return monotonic_ns()  # at or after the record's own stamp: durations from it never exceed the gap
            except Exception as exc:
                if raised_by_signal_handler(exc):  # the job's signal handler ran meanwhile: the job's
                    raise
                if not dead:
                    on_error(exc)
                return 0

        def sample(payload: tuple[int, ...], device: int = -1) -> None:
            """Write a ``sample`` record; ``payload`` is the 9 gauge words (-1 = null)."""
            try:
                if len(payload) != PAYLOAD_WORDS:
                    raise ValueError(f"payload must hold {PAYLOAD_WORDS} ints, got {len(payload)}")
                device = index(device)
                payload = tuple(map(int64, payload))
                pipes.push_sample((get_ident(), step_now, 0, SAMPLE_TAG | (device & 0xFFFF) << 48, *payload))
                pipes.write_sample()
            except Exception as exc:
                if raised_by_signal_handler(exc):  # the job's signal handler ran meanwhile: the job's
                    raise
                if not dead:
                    on_error(exc)

        def current_step() -> int:
            return step_now

        def kill() -> None:
            nonlocal records, strings, dead
            dead = True
            if windowed is not None:
                windowed.close_window()
            r, s = records, strings
            records = strings = None
            for view in (r, s):
                if view is not None:
                    view.release()

        if windowed is not None:  # the C seq counter, where it is built, moves the write window
            windowed.window(buffer, records_offset, capacity, WINDOW_SLOTS)
        self.mark, self.step, self.event, self.sample = mark, step, event, sample
        self.current_step, self.kill, self.backend = current_step, kill, "python"
