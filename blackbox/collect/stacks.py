"""Python stacks of the job's threads, sampled at each sampler tick into the ring's stack table.

Each tick samples the main thread (the training loop) and the threads named with
``arm(stack_threads=...)``, and writes one ``stack_sample`` record per thread
through the ring's writer (either write path). Where the main thread's stack has
not changed for ``WIDEN_AFTER_S`` (stuck, or waiting: in a thread's ``join``, a
queue, a lock), every other thread of the job is sampled too, once every
``WIDEN_EVERY_S`` while it lasts: what a main thread waits for is often another
thread of its own (a checkpoint saver, a logger's uploader), and a hang is then
told by where that one is. A main thread that moves costs one comparison a tick.
The stack itself lives in the
stack table (FORMAT.md, "Stack table"): every distinct frame and every distinct
stack is interned once per generation, so a stack that repeats costs one record
and nothing else, and the string region is never touched.

Why the hot path is cheap: a frame is looked up by ``(code object, f_lasti)``,
which needs no line-number computation, and a stack by the tuple of its frame
ids; only a frame or a stack never seen in this generation formats text and
writes an entry. A thread blocked in C (a torch op that released the GIL) shows
the Python frame that made the call.

Crash consistency: an entry is written completely (one copy into the mapping)
before the record that names it, and a generation's half is zeroed before its
first entry, so a ring killed at any instant holds only complete entries that
records name, torn entries that none name (their CRC fails), and the entries of
older generations. A record never resolves to another stack than the one sampled.
"""

from __future__ import annotations

import gc
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from ..ring import format as fmt

KIND_STACK_SAMPLE = fmt.KIND_CODES["stack_sample"]
KIND_MARK = fmt.KIND_CODES["mark"]
MAX_DEPTH = fmt.MAX_STACK_DEPTH
MAX_THREADS = 16  # threads sampled per tick, the main thread included
WIDEN_AFTER_S = 2.0  # the main thread's stack the same this long: every thread of the job is sampled too...
WIDEN_EVERY_S = 1.0  # ...at most this often (its stack samples are at the sampler's interval)
OWN_THREADS = "blackbox-"  # the prefix of blackbox's own threads' names (the sampler, alerts): never sampled
_NO_IDS: dict[Any, int] = {}  # an empty frame-id table: a walk that returns every frame object
OWN_CODE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # blackbox's own frames


def frame_text(code: Any, lineno: int | None) -> bytes:
    """A frame's entry text, ``function (file:line)``, UTF-8, at most MAX_FRAME_BYTES bytes.

    ``;`` (the folded-stack separator) becomes ``,`` and line breaks become spaces.
    """
    name = getattr(code, "co_qualname", code.co_name)
    text = f"{name} ({code.co_filename}:{lineno or 0})"
    text = text.replace(";", ",").replace("\n", " ").replace("\r", " ")
    raw = text.encode("utf-8", "replace")
    if len(raw) > fmt.MAX_FRAME_BYTES:  # keep the line number: cut the middle of the path
        tail = f"…:{lineno or 0})".encode()
        raw = raw[: fmt.MAX_FRAME_BYTES - len(tail)].decode("utf-8", "ignore").encode() + tail
    return raw


def zero_down(region: Any) -> None:
    """Zero ``region`` (a writable buffer of the mapping) from its end to its start, one 8-byte word at a time.

    The half being zeroed holds generation g - 1, whose older records still name its stacks. Its entries are
    8-byte aligned and a stack's frames always lie below the stack (written before it), so zeroed top down a
    kill at any instant leaves each stack either whole, frames and all, or lost (its entry zeroed or torn:
    the CRC fails). Zeroed bottom up (one memset), a kill inside it left stacks whose frames were gone:
    ``<blackbox: frame lost>`` as the innermost frame (the flake of tests/test_stacks.py's kill at any
    instant). The word stores are Python's (about 16 ms for the default table's 512 KiB half, once per flip)."""
    size = len(region)
    tail = size % 8
    if tail:
        region[size - tail :] = bytes(tail)
    words = region[: size - tail].cast("Q")
    try:
        for i in range(len(words) - 1, -1, -1):
            words[i] = 0
    finally:
        words.release()


class StackTable:
    """The writer's side of the stack table: interning into the current generation's half."""

    def __init__(self, region: Any) -> None:
        self.view: Any = region
        self.half = len(region) // 2
        self.limit = self.half  # where interning stops in a half (allocation sampling's hooks own the rest)
        self.on_flip: Callable[[int], None] | None = None  # told each new generation, its half zeroed
        self.generation = 1
        self.pos = 0
        self.frame_ids: dict[Any, int] = {}  # a frame's key (its code object and instruction) -> frame id
        self.codes: list[Any] = []  # the code objects keyed by id, kept alive so an id is never reused
        self.text_ids: dict[bytes, int] = {}  # frame text -> frame id (two call sites on one line)
        self.stack_ids: dict[tuple[int, ...], int] = {}  # frame ids, innermost first -> stack id
        self.next_frame = 1
        self.next_stack = 1
        self.flips = 0

    def _flip(self) -> None:
        """Start generation g + 1 in the other half, zeroed first; forget this generation's ids."""
        self.generation += 1
        self.flips += 1
        lo = ((self.generation - 1) % 2) * self.half
        region = memoryview(self.view)[lo : lo + self.half]
        try:
            zero_down(region)
        finally:
            region.release()
        self.pos = 0
        self.frame_ids.clear()
        self.codes.clear()
        self.text_ids.clear()
        self.stack_ids.clear()
        self.next_frame = self.next_stack = 1
        if self.on_flip is not None:
            self.on_flip(self.generation)

    def intern(self, frames: list[Any], keys: list[Any]) -> int:
        """The stack id of these frames (innermost first) in the current generation, writing what is
        new; 0 when the stack cannot fit even an empty half (it then reads as lost)."""
        for attempt in (0, 1):
            entries: list[bytes] = []
            ids: list[int] = []
            new_frames: dict[Any, int] = {}
            new_texts: dict[bytes, int] = {}
            next_frame = self.next_frame
            for f, key in zip(frames, keys, strict=True):
                fid = self.frame_ids.get(key) or new_frames.get(key)
                if fid is None:
                    text = frame_text(f.f_code, f.f_lineno)
                    fid = self.text_ids.get(text) or new_texts.get(text)
                    if fid is None:
                        fid = new_texts[text] = next_frame
                        next_frame += 1
                        entries.append(fmt.stack_entry(self.generation, fmt.STACK_FRAME, fid, text))
                    new_frames[key] = fid
                ids.append(fid)
            stack_key = tuple(ids)
            sid = self.stack_ids.get(stack_key)
            new_stack = sid is None
            if sid is None:
                sid = self.next_stack
                payload = struct.pack(f"<{len(ids)}I", *reversed(ids))  # outermost first
                entries.append(fmt.stack_entry(self.generation, fmt.STACK_STACK, sid, payload))
            size = sum(map(len, entries))
            if self.pos + size > self.limit:
                if attempt == 0 and (self.pos or self.frame_ids):
                    self._flip()
                    continue
                return 0
            base = ((self.generation - 1) % 2) * self.half  # generation g fills half (g - 1) % 2
            for entry in entries:  # each entry complete before the record that names it
                self.view[base + self.pos : base + self.pos + len(entry)] = entry
                self.pos += len(entry)
            self.frame_ids.update(new_frames)
            self.codes += [f.f_code for f, key in zip(frames, keys, strict=True) if key in new_frames]
            self.text_ids.update(new_texts)
            self.next_frame = next_frame
            if new_stack:
                self.stack_ids[stack_key] = sid
                self.next_stack += 1
            return sid
        return 0


def _walk(frame: Any, max_depth: int, skip: str | None, frame_ids: dict[Any, int]) -> Any:
    while frame is not None and skip is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    if frame is None:
        return None
    frames: list[Any] = []
    f = frame
    while f is not None and len(frames) < max_depth:
        frames.append(f)
        f = f.f_back
    depth = len(frames)
    while f is not None:
        depth += 1
        f = f.f_back
    keys = tuple([(id(f.f_code), f.f_lasti) for f in frames])
    ids = tuple(map(frame_ids.get, keys))
    if None in ids:
        return None, keys, frames, depth
    return ids, keys, None, depth


def _subinterpreters() -> bool:
    """Whether subinterpreters exist (3.12+: each may run its threads under a GIL of its own, while
    ``sys._current_frames()`` reads every interpreter's frames: the C walk reads this interpreter's only)."""
    module = sys.modules.get("_interpreters") or sys.modules.get("_xxsubinterpreters")
    try:
        return module is not None and len(module.list_all()) > 1
    except Exception:
        return True


def py_walks(
    idents: tuple[int, ...], max_depth: int, skip_ident: int, skip: str | None, frame_ids: dict[Any, int]
) -> Any:
    """The pure-Python twin of ``_cwriter.stack_walks``: per thread, None or (ids or None, keys,
    frames or None, depth); every thread None while subinterpreters exist. The collector is off while
    frames are walked (``frame.f_back`` allocates frame objects; a collection there can release the GIL
    mid-call and let the walked thread pop the frame being linked: see _cwriter.c); unlike the C walk,
    bytecode boundaries in between can let the job run meanwhile with its collector off, for
    microseconds."""
    if _subinterpreters():  # sys._current_frames() would read their threads' frames as they run: no sample
        return [None] * len(idents)
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        current = sys._current_frames()
        walked = [
            _walk(current[i], max_depth, skip if i == skip_ident else None, frame_ids) if i in current else None
            for i in idents
        ]
    finally:
        if collecting:
            gc.enable()
    return walked


def joined_thread(main_ident: int) -> threading.Thread | None:
    """The thread whose ``join`` the main thread is inside (its frame's ``self``), or None. Read once a
    second while the main thread stands still, never while subinterpreters exist (``py_walks``); the
    collector is off while the frames are walked, as there."""
    if _subinterpreters():
        return None
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        frame = sys._current_frames().get(main_ident)
        while frame is not None:
            code = frame.f_code
            if code.co_name == "join" and code.co_filename == threading.__file__:
                joined = frame.f_locals.get("self")
                return joined if isinstance(joined, threading.Thread) else None
            frame = frame.f_back
        return None
    finally:
        frame = None
        if collecting:
            gc.enable()


def thread_tuple(threads: Any) -> tuple[Any, ...]:
    """``stack_threads`` as a tuple: one name or thread on its own, or an iterable of them (what is
    not a name or a thread is refused by the stack sampler, with a warning, not here)."""
    if isinstance(threads, (str, threading.Thread)) or not hasattr(threads, "__iter__"):
        return (threads,)
    return tuple(threads)


class StackSampler:
    """Samples the main thread and the named threads into one ring; ``sample()`` once per tick.

    ``threads``: thread names (every live thread of that name) or ``threading.Thread`` objects.
    ``event``: the ring writer's ``event`` function (either write path). ``cmod``: the C extension
    whose ``stack_walks`` walks the frames (None: the pure-Python walk, same records).
    """

    def __init__(
        self,
        region: Any,
        event: Callable[..., int],
        threads: Iterable[str | threading.Thread] = (),
        cmod: Any = None,
    ) -> None:
        threads = tuple(threads)
        bad = [t for t in threads if not isinstance(t, (str, threading.Thread))]
        if bad:
            raise TypeError(f"stack_threads takes thread names or threading.Thread objects, got {bad[0]!r}")
        self._table = StackTable(region)
        self._event = event
        self._walks: Callable[..., Any] = getattr(cmod, "stack_walks", None) or py_walks
        self._names = frozenset(t for t in threads if isinstance(t, str))
        self._objects = tuple(t for t in threads if isinstance(t, threading.Thread))
        self._busy = threading.Lock()  # the sampler and a disarming thread never intern at once
        self.closed = False
        self._main: tuple[int, int] | None = None  # the main thread's last (generation, stack id)...
        self._main_since = self._widened = time.monotonic()  # ...since when, and when all were last sampled

    @property
    def generation(self) -> int:
        return self._table.generation

    def targets(self, every: bool = False, joined: threading.Thread | None = None) -> list[tuple[int, str]]:
        """(ident, name) of each thread to sample now: the main thread first, then the named ones (``every``:
        then the one the main thread joins, then every other thread but blackbox's own, the latest started
        first, up to ``MAX_THREADS`` in all)."""
        main = threading.main_thread()  # alive while the process runs: its end is the interpreter's end
        out: list[tuple[int, str]] = [(main.ident, main.name)] if main.ident is not None else []
        if not (self._names or self._objects or every):
            return out
        seen = {main.ident}
        live = threading.enumerate()
        candidates = [*self._objects, *(t for t in live if t.name in self._names)]
        if every:
            candidates += [*([joined] if joined is not None else []),
                           *(t for t in reversed(live) if not t.name.startswith(OWN_THREADS))]  # fmt: skip
        for t in candidates:
            if t.ident is not None and t.ident not in seen and t.is_alive() and len(out) < MAX_THREADS:
                seen.add(t.ident)
                out.append((t.ident, t.name))
        return out

    def sample(self) -> None:
        """One ``stack_sample`` per target thread. Raises on a broken table (the caller turns stacks off)."""
        if self.closed or not self._busy.acquire(blocking=False):
            return
        try:
            now = time.monotonic()
            every = now - self._main_since >= WIDEN_AFTER_S and now - self._widened >= WIDEN_EVERY_S
            joined = None
            table, walks, event = self._table, self._walks, self._event
            if every:
                self._widened = now
                main = threading.main_thread().ident
                joined = joined_thread(main) if main is not None else None
                if joined is not None and joined.ident is not None and 0 < joined.ident < 1 << 63:
                    event(KIND_MARK, fmt.JOINS_PREFIX + joined.name, joined.ident, -1, None)
            targets = self.targets(every, joined)
            me = threading.get_ident()
            idents = tuple(ident for ident, _ in targets)
            # a synchronous sample (at arm, at disarm) leaves out blackbox's own frames
            every = walks(idents, MAX_DEPTH, me, OWN_CODE, table.frame_ids)
            for (ident, name), walked in zip(targets, every, strict=True):
                if walked is None or self.closed:
                    continue
                ids, keys, frames, depth = walked
                sid = table.stack_ids.get(ids) if ids is not None else None
                if sid is None:
                    if frames is None:  # known frames, a new stack: walk again for the frame objects
                        (walked,) = walks((ident,), MAX_DEPTH, me, OWN_CODE, _NO_IDS)
                        if walked is None:
                            continue
                        _, keys, frames, depth = walked
                    sid = table.intern(list(frames), list(keys))
                    frames = walked = None  # the frame objects (and their locals) go at once
                if ident == targets[0][0] and self._main != (table.generation, sid):  # the main thread moved
                    self._main, self._main_since = (table.generation, sid), now
                event(KIND_STACK_SAMPLE, name, None, -1, (ident, sid, table.generation, depth))
        finally:
            self._busy.release()

    def close(self, *, wait: bool = True) -> None:
        """Stop writing and release the view of the mapping (before it is unmapped). ``wait=False`` in a
        forked child: a sampler thread that held the lock at the fork does not exist there."""
        self.closed = True
        held = self._busy.acquire(timeout=2.0 if wait else 0)
        try:
            view, self._table.view = self._table.view, None
            if view is not None:
                view.release()
        finally:
            if held:
                self._busy.release()
