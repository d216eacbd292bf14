"""Who filled the memory: allocations sampled by bytes, in every process, into the ring (on by default).

The sampling itself is the C extension ``_csample`` (its header comment says why
it patches the loaded libraries' relocation slots and wraps PyMem's MEM and OBJ
domains, and why that reaches torch CPU tensors under both ``arm()`` and
``blackbox run``). A block of s bytes is sampled with probability
``1 - exp(-s/R)`` (R: ``mean_bytes``, a per-thread exponential byte countdown, as
Go's heap profiler and tcmalloc), and stands for ``s / (1 - exp(-s/R))`` bytes,
so live bytes per site are an unbiased estimate whose error recovery computes
(recovery/allocs.py). Each sampled block takes a slot of the ring's heap table
until it is freed (so what was live at a kill is there however long ago it was
allocated), and each sample and each free is a record (the timeline).

On by default (``arm()``, every process ``blackbox run`` arms): off with
``arm(allocations=False)``, ``BLACKBOX_ALLOCATIONS=0`` or ``blackbox run
--no-allocations``. Where a job allocates so fast that sampling would cost more
than MAX_SAMPLES_PER_S blocks a second of the time it ran (about 0.1% of its
work; wall time less its main thread's wait for a core), the tick raises R
(doubling, with a note in the ring that says to what); a block keeps the
weight of the R its countdown was drawn with, so estimates stay unbiased across
the change. Without the C extension nothing is sampled, no heap table is made,
and the ring's note makes the bundle say "not recorded", never "0 B".

A malloc reached through ``dlsym`` (``ctypes.CDLL(None).malloc``, cffi) calls
glibc through a pointer, past every relocation slot: the hooks never see it.
How it is caught, safely: ``dlsym``'s own slot is patched, in ctypes' and cffi's
extension modules alone (the ways Python code looks a C function up by name);
the hook calls glibc's ``dlsym`` and, where the answer is one of the malloc
family's real definitions, returns the forwarding hook instead, so the blocks
are sampled with the Python stack that called them, served by the same
allocator. Every other answer is glibc's, unchanged, and no other object's
``dlsym`` is touched (an interposer's ``dlsym(RTLD_NEXT, ...)`` must resolve
after its own object). A function looked up before arming keeps glibc's
address: its memory is not seen, and recovery states it (the process's
anonymous memory grew after arming beyond what the samples hold: the
``coverage`` of recovery/alloc_levers.py, with its figures).

This module is the sampler tick's half (Python, the GIL held, on the recorder's
sampler thread): it writes the text of stacks the hooks saw for the first time
into the stack table (one kind-3 entry per stack fingerprint, with the
allocating thread's name and the source line of the innermost frame outside
libraries), writes them again into a new generation when the table turns over
(for the blocks still live), tells the hooks the step in force and the threads'
names, and patches libraries loaded since the last tick (torch imported after
arm). The hooks themselves write a new stack's text (frames, thread name) into
the tail of the stack table's current half at once (STACK_TAIL, ``_csample``'s
"the stack table's tail"), so a kill right after an allocation loses neither;
the tick's copy adds the source line. A thread's name reaches the hooks as the
thread starts (``Thread._set_ident`` wrapped while sampling) and at each tick.
"""

from __future__ import annotations

import linecache
import math
import os
import random
import threading
import time
from collections.abc import Callable
from typing import Any

try:  # hashlib's blake2b without hashlib, which loads OpenSSL (3.7 MiB of a process at arm)
    from _blake2 import blake2b
except ImportError:  # pragma: no cover (an interpreter built without it)
    from hashlib import blake2b

from ..ring import format as fmt
from ..ring.writer import NO_C_ENV, built_module
from .host import read_proc
from .limits import address_space
from .stacks import OWN_CODE, StackTable
from .thread_names import encoded, name_as_they_change

DEFAULT_MEAN_BYTES = 1 << 20  # R: one sample per MiB allocated, on average
HEAP_SLOTS = 1 << 16  # the main process's heap table: 4 MiB, 64 GiB of live memory at R = 1 MiB
HELPER_HEAP_SLOTS = 1 << 12  # a helper's (a DataLoader worker): 256 KiB
# The sampler thread's own heap, where the address space is limited (_own_heap.h): what it held at most was 0.6
# MiB in a minute of a torch job; under PYTHONMALLOC=malloc every Python object it keeps comes from there (4.8).
OWN_HEAP_BYTES, OWN_HEAP_BYTES_MALLOC = 2 << 20, 16 << 20
STACK_TAIL = 128 << 10  # the end of each half of the stack table: the hooks write new stacks there at once
MAX_KNOWN = 16384  # stacks whose text is kept to write again after the table turns over
# A sampled block costs about 1.8 us inside a real training step (its stack read, its heap slot, two records,
# each a cache miss there; 0.3-0.5 us in a warm loop: docs/performance.md): past this many a second (0.1% of
# a core) the tick raises R, so a job that allocates faster than about 500 MB/s pays no more; the weights
# follow the R each block was sampled with, so estimates stay unbiased.
MAX_SAMPLES_PER_S = 500
MIN_SAMPLES_TO_RAISE = 50  # fewer in a window: a burst, whose rate says little
MAX_MEAN_BYTES = 1 << 30
RAISED = "allocations: sampling interval raised to {} bytes"  # a note; recovery reads the last R from it
ENV = "BLACKBOX_ALLOCATIONS"  # "0" off, "1" on (the default), or the mean interval in bytes
_LIBRARY_MARKS = ("site-packages", "dist-packages", "<frozen", "/.boot/sitecustomize.py")  # the last: blackbox run's
_STDLIB = (os.path.dirname(os.__file__) + os.sep, OWN_CODE)


def _queued_s() -> float:
    """Seconds this process's main thread has waited for a core since it began (the second figure of
    ``/proc/self/schedstat``); 0.0 where the kernel keeps no such count."""
    try:
        return int((read_proc("/proc/self/schedstat", 128) or b"").split()[1]) / 1e9
    except (ValueError, IndexError):
        return 0.0


def sample_module() -> Any:
    """The compiled sampler, or None where it is not built (or BLACKBOX_NO_C_EXTENSION=1 says to act as an
    install without a C compiler, which builds neither extension)."""
    if os.environ.get(NO_C_ENV, "") not in ("", "0"):
        return None
    try:
        from . import _csample  # type: ignore[attr-defined]
    except ImportError:
        return None
    return _csample


UNAVAILABLE = "the C extension (blackbox.collect._csample, blackbox.ring._cwriter) is not built"


def unavailable() -> str | None:
    """Why allocations cannot be sampled in this process (no C extension), or None."""
    return UNAVAILABLE if sample_module() is None or built_module() is None else None


def mean_bytes(setting: bool | int | None) -> int:
    """R in bytes for ``arm(allocations=...)``: False/0 off, True the default, an int the interval; None
    reads ``BLACKBOX_ALLOCATIONS`` (``0``/``false``/``no``/``off``: off; ``1``/``true``/``yes``/``on``: on; a
    number: the interval; unset: on, at the default interval)."""
    if setting is None:
        raw = os.environ.get(ENV, "").strip().lower()
        if raw in ("0", "false", "no", "off"):
            return 0
        setting = True if raw in ("", "1", "true", "yes", "on") else int(raw)
    if setting is True:
        return DEFAULT_MEAN_BYTES
    if setting is False or setting == 0:
        return 0
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1024:
        raise ValueError(f"allocations must be True, False or a mean interval of at least 1024 bytes, got {setting!r}")
    return setting


def heap_bytes(role: str, mean: int) -> int:
    """The heap table's size for a ring: none without sampling, a helper's smaller."""
    return ((HEAP_SLOTS if role == "main" else HELPER_HEAP_SLOTS) * fmt.HEAP_SLOT) if mean else 0


def tail_bytes(mean: int) -> int:
    """What allocation sampling adds to the stack table: a tail in each half (none without sampling)."""
    return 2 * STACK_TAIL if mean else 0


def is_library(path: str) -> bool:
    """A frame of a library (site-packages, the standard library, blackbox itself), not the job's code."""
    return path.startswith(_STDLIB) or any(mark in path for mark in _LIBRARY_MARKS)


def split_frame(text: str) -> tuple[str, str, int]:
    """``fn (file:line)`` -> (fn, file, line); line 0 where it does not parse."""
    name, _, where = text.rpartition(" (")
    file, _, line = where.rstrip(")").rpartition(":")
    return name, file, int(line) if line.isdigit() else 0


def user_line(texts_inner_first: list[str]) -> str:
    """The source line of the innermost frame outside libraries (the job's own line), stripped."""
    for text in texts_inner_first:
        _, file, line = split_frame(text)
        if file and not is_library(file):
            try:
                return linecache.getline(file, line).strip()[:200]
            except Exception:
                return ""
    return ""


def gpu_frame_text(frame: dict[str, Any]) -> str:
    """A frame of PyTorch's allocator history (``name``, ``filename``, ``line``) as ``fn (file:line)``."""
    line = frame.get("line")
    text = f"{frame.get('name', '?')} ({frame.get('filename', '?')}:{line if isinstance(line, int) else 0})"
    return text.replace(";", ",").replace("\n", " ").replace("\r", " ")[: fmt.MAX_FRAME_BYTES]


def intern_alloc(table: StackTable, fingerprint: int, texts: list[bytes], depth: int, thread: str,
                 line: str, entry_id: int) -> bool:  # fmt: skip
    """Write one allocation stack (frames innermost first) into the table's current generation, frames
    shared with the sampled stacks by text; False when it cannot fit even an empty half."""
    for attempt in (0, 1):
        entries: list[bytes] = []
        ids: list[int] = []
        new_texts: dict[bytes, int] = {}
        next_frame = table.next_frame
        for text in reversed(texts):
            fid = table.text_ids.get(text) or new_texts.get(text)
            if fid is None:
                fid = new_texts[text] = next_frame
                next_frame += 1
                entries.append(fmt.stack_entry(table.generation, fmt.STACK_FRAME, fid, text))
            ids.append(fid)
        payload = fmt.alloc_stack_payload(fingerprint, depth, ids, thread, line)
        entries.append(fmt.stack_entry(table.generation, fmt.STACK_ALLOC, entry_id, payload))
        size = sum(map(len, entries))
        if table.pos + size > table.limit:
            if attempt == 0 and (table.pos or table.frame_ids or table.text_ids):
                table._flip()
                continue
            return False
        base = ((table.generation - 1) % 2) * table.half
        for entry in entries:  # each entry complete before the next; the stack's after its frames
            table.view[base + table.pos : base + table.pos + len(entry)] = entry
            table.pos += len(entry)
        table.text_ids.update(new_texts)
        table.next_frame = next_frame
        return True
    return False


class AllocSampler:
    """The sampler tick's side of allocation sampling for one armed ring."""

    def __init__(self, cmod: Any, table: Callable[[], Any], note: Callable[[str], None]) -> None:
        self._c = cmod
        self._table = table  # the StackSampler whose table we share, or a StackTable of our own, or None
        self._note = note
        self._own_lock = threading.Lock()
        self._known: dict[int, tuple[list[bytes], int, str, str]] = {}
        self._generation = 0
        self._ids = self._ids_generation = 0  # kind-3 entry ids, per generation
        self._ignored = False  # the sampler thread told the hooks to leave it out
        self._mean = self._gpu_mean = 1.0
        self._rng = random.Random()
        self._gpu_countdown = 0.0  # bytes of GPU allocations before the next sample
        self._gpu_pending: list[tuple[int, list[bytes], int, str]] = []
        self._named: dict[int | None, str] = {}  # the thread names the hooks were given last
        self._due = 0.0  # (monotonic s) the tick's next once-a-second work
        self._unname: Callable[[], None] | None = None  # puts threading.Thread's _set_ident and name back
        self._window: tuple[float, float, int] | None = None  # (monotonic s, queued s, samples): the rate's start
        self.started = False
        self.own_heap = False  # the sampler thread allocates from a heap of its own (under ulimit -v)
        self.unwritten = 0  # stacks that did not fit the table
        self._heap: tuple[Any, int, int] | None = None  # (the mapping, the heap table's offset and size)

    @classmethod
    def start(cls, cmod: Any, mapping: Any, header: fmt.Header, sequence: Any, mean: int,
              table: Callable[[], Any], note: Callable[[str], None]) -> AllocSampler:  # fmt: skip
        """Hooks in: raises where they cannot be (the caller notes it and goes on without)."""
        if sequence is None or type(sequence).__name__ != "Sequence":
            raise RuntimeError("the C write path's seq counter is not built")
        self = cls(cmod, table, note)
        self._heap = (mapping, header.heap_offset, header.heap_size)
        self._mean = self._gpu_mean = float(mean)
        self._gpu_countdown = self._rng.expovariate(1.0 / mean)
        got = cmod.start(mapping, header.records_offset, header.capacity, sequence, header.heap_offset,
                         header.heap_size // fmt.HEAP_SLOT, float(mean), True, True)  # fmt: skip
        self.started = True
        # under `ulimit -v`, the sampler thread allocates from a small heap of its own, not from a glibc arena
        size = OWN_HEAP_BYTES_MALLOC if os.environ.get("PYTHONMALLOC", "").startswith("malloc") else OWN_HEAP_BYTES
        self.own_heap = bool(address_space() is not None and got.get("native") and cmod.own_heap(size))
        self._name_new_threads()
        self._tail_at(header)
        if not got.get("native"):
            note("allocations: native allocations (torch CPU tensors, numpy) not sampled: malloc not found")
        return self

    def adopt(self, thread: threading.Thread) -> None:
        """Where the own heap is on, ``thread`` (the sampler, not started yet) allocates from it from the first
        Python it runs (``Thread._bootstrap``, wrapped on this thread alone), before threading's own start-up
        allocates: a single malloc or free of glibc's there would make its arena. Until it claims the heap, a
        free it makes (of what its starter allocated for it) waits for another thread; it lets go as it ends."""
        boot, start = getattr(thread, "_bootstrap", None), thread.start
        if not self.own_heap or boot is None:
            return
        c = self._c

        def _bootstrap() -> None:
            c.own_heap_claim()
            try:
                boot()
            finally:
                c.own_heap_release()

        def _start() -> None:
            c.own_heap_expect(True)
            try:
                start()
            finally:
                c.own_heap_expect(False)

        thread._bootstrap = _bootstrap  # type: ignore[attr-defined]
        thread.start = _start  # type: ignore[method-assign]

    def _name_new_threads(self) -> None:
        """Every thread's name for the hooks as it starts and as it is renamed (thread_names), so a thread that
        allocates and dies before the next tick is still named, by the name it had then."""
        self._unname = name_as_they_change(self._c.name_threads, self._named)

    def _stack_table(self) -> StackTable | None:
        """The stack table the hooks write into: the stack sampler's, or our own."""
        owner = self._table()
        table = owner if isinstance(owner, StackTable) else getattr(owner, "_table", None)
        return table if isinstance(table, StackTable) else None

    def _tail_at(self, header: fmt.Header) -> None:
        """Give the hooks the end of each half of the stack table (where the table's stack sampler or our own
        table stops interning), moved to the new half each time the table turns over."""
        table = self._stack_table()
        if table is None or table.half - STACK_TAIL < max(4096, table.pos):
            return
        table.limit = table.half - STACK_TAIL

        def moved(generation: int) -> None:
            base = header.stacks_offset + ((generation - 1) % 2) * table.half + table.limit
            self._c.set_tail(base, STACK_TAIL, generation)

        table.on_flip = moved
        moved(table.generation)

    def tick(self, step: int) -> None:
        """Once a sample interval: the step in force, newly loaded libraries, and new stacks' text. A
        failure stops sampling (the job's allocators put back) with one note, never the recorder. On the
        recorder's own sampler thread (named ``blackbox-sampler``), its allocations are never samples."""
        if not self.started:
            return
        if not self._ignored and threading.current_thread().name == "blackbox-sampler":
            self._ignored = True
            self._c.ignore_thread()
        try:
            c = self._c
            c.set_step(step)
            c.rescan()
            now = time.monotonic()
            second = now >= self._due
            if second:  # once a second: renamed threads, the stack table's turn-over, the rate
                self._due = now + 1.0
            if second or self._gpu_pending or c.queued():  # (else nothing to write: a steady tick ends here)
                self.drain(names=second)
            if second:
                self._adapt()
        except Exception as exc:
            self.stop()
            self._note(f"allocations no longer sampled: {type(exc).__name__}: {exc}")

    def _adapt(self) -> None:
        """Raise R (doubling, to at most MAX_MEAN_BYTES) where the samples of the last second or more passed
        MAX_SAMPLES_PER_S, with a note that says to what and why. The rate is per second the job could run:
        wall time less what its main thread spent waiting for a core (``/proc/self/schedstat``). A job
        starved of its core (more processes than cores, DataLoader workers among them) does its work and its
        samples in what it gets, so a second of wall time would understate what a sample costs it; a job
        waiting for input or a device does not run then, and a sample costs it no more than usual."""
        now = time.monotonic()  # (the tick calls this once a second: its clock is the window's)
        queued, samples = _queued_s(), int(self._c.stats()["samples"])
        if self._window is None:
            self._window = (now, queued, samples)
            return
        t0, q0, s0 = self._window
        self._window = (now, queued, samples)
        n, wall = samples - s0, now - t0
        if n < MIN_SAMPLES_TO_RAISE or self._mean >= MAX_MEAN_BYTES:
            return
        ran = max(wall - (queued - q0), 0.05 * wall)  # (a stale or odd counter never inflates the rate 20-fold)
        rate = n / ran
        if rate <= MAX_SAMPLES_PER_S:
            return
        old = self._mean
        self._mean = min(float(MAX_MEAN_BYTES), old * 2.0 ** math.ceil(math.log2(rate / MAX_SAMPLES_PER_S)))
        self._c.set_mean(self._mean)
        starved = f", {n / wall:.0f} a second of wall time: the job waited {1 - ran / wall:.0%} of it for a core" \
            if ran < 0.9 * wall else ""  # fmt: skip
        self._note(RAISED.format(int(self._mean)) + f" ({rate:.0f} samples a second of running at {int(old)}"
                   f"{starved}; estimates stay unbiased)")  # fmt: skip

    def drain(self, names: bool = True) -> None:
        """Write the stacks seen for the first time, and rewrite live ones after the table turned over (names:
        give the hooks every thread's name first). Never at once with the stack sampler's interning (a disarm
        whose sampler thread is late)."""
        owner = self._table()
        table, lock = (owner, self._own_lock) if isinstance(owner, StackTable) else (None, None)
        if owner is not None and table is None:
            table, lock = getattr(owner, "_table", None), getattr(owner, "_busy", None)
        if table is None or table.view is None or lock is None or not lock.acquire(blocking=False):
            return
        try:
            self._drain(table, names)
        finally:
            lock.release()

    def _drain(self, table: StackTable, names: bool) -> None:
        pending = self._c.pending()
        if names or any(p[1] not in self._named for p in pending):
            self._name_threads(keep={p[1] for p in pending})
        named = self._named
        gpu, self._gpu_pending = self._gpu_pending, []
        for fingerprint, frames, depth, line in gpu:  # GPU blocks' stacks, from the allocator's history
            info = (frames, depth, "", line)
            self._remember(fingerprint, info)
            self._write(table, fingerprint, info)
        for fingerprint, thread, depth, frames in pending:
            texts = [f.decode("utf-8", "replace") for f in frames]
            info = (frames, int(depth), named.get(thread) or "", user_line(texts))
            self._remember(fingerprint, info)
            self._write(table, fingerprint, info)
        if table.generation != self._generation and self._generation:
            live = self._c.live_stacks()
            for fingerprint in sorted(live, key=live.__getitem__, reverse=True):
                known = self._known.get(fingerprint)
                if known is not None and not self._write(table, fingerprint, known):
                    break
        self._generation = table.generation

    def _name_threads(self, keep: set[int]) -> None:
        """Give the hooks every thread's name (they write a thread's name with a new stack's text at once): once
        a second, for a rename around Thread.name (a start or a rename is told at once: thread_names), and when
        a new stack came from a thread not named yet. Threads that ended are forgotten, but those in ``keep``
        (their stacks wait to be written: a thread that allocated and ended since the last tick keeps its name)."""
        named = self._named  # (updated in place: thread_names keeps it as threads start and are renamed)
        known = list(named)  # (a copy at once, before the list of threads: a thread that starts now stays)
        names = {t.ident: t.name for t in threading.enumerate()}
        if any(named.get(ident) != name for ident, name in names.items()):
            self._c.name_threads(encoded(names))  # (all of them: also mends a slot another thread's name took)
        for ident in known:
            if ident not in names and ident not in keep:
                named.pop(ident, None)
        named.update(names)

    def _write(self, table: StackTable, fingerprint: int, info: tuple[list[bytes], int, str, str]) -> bool:
        if table.generation != self._ids_generation:
            self._ids, self._ids_generation = 0, table.generation
        self._ids += 1
        ok = intern_alloc(table, fingerprint, info[0], info[1], info[2], info[3], self._ids)
        self.unwritten += not ok
        return ok

    def _remember(self, fingerprint: int, info: tuple[list[bytes], int, str, str]) -> None:
        if len(self._known) >= MAX_KNOWN:
            live = self._c.live_stacks()
            self._known = {k: v for k, v in self._known.items() if k in live}
        if len(self._known) < MAX_KNOWN:
            self._known[fingerprint] = info

    def gpu_block(self, device: int, entry: dict[str, Any]) -> None:
        """One entry of PyTorch's CUDA allocator history (drained by torch_hooks): an ``alloc`` is sampled
        by bytes like a host block (a countdown of the same mean), with the Python stack PyTorch recorded
        for it (``frames``, innermost first) and the time PyTorch recorded (its step is the step then, not
        the drain's: drains come seconds apart); a completed free of a sampled block empties its slot."""
        if not self.started:
            return
        action, addr, size = entry.get("action"), entry.get("addr"), entry.get("size")
        if not isinstance(addr, int) or not isinstance(size, int) or size < 0:
            return
        if action == "free_completed":
            self._c.untrack(addr, device)
            return
        if action != "alloc":
            return
        self._gpu_countdown -= size
        if self._gpu_countdown >= 0:
            return
        p = -math.expm1(-size / self._gpu_mean)  # the mean its countdown was drawn with (R may be raised since)
        self._gpu_mean = self._mean
        self._gpu_countdown = self._rng.expovariate(1.0 / self._mean)
        texts = [gpu_frame_text(f) for f in entry.get("frames") or [] if isinstance(f, dict)][: fmt.MAX_STACK_DEPTH]
        digest = blake2b(b"\n".join(t.encode("utf-8", "replace") for t in texts), digest_size=8).digest()
        fingerprint = max(int.from_bytes(digest, "little"), 2) if texts else fmt.NO_PYTHON_STACK
        if texts and fingerprint not in self._known:
            frames = [t.encode("utf-8", "replace") for t in texts]
            self._gpu_pending.append((fingerprint, frames, len(entry.get("frames") or []), user_line(texts)))
        self._c.track(addr, size, int(size / p + 0.5) if p > 0 else size, fingerprint, device, _monotonic(entry))

    def top_site(self) -> dict[str, Any] | None:
        """Where the most sampled live bytes were allocated: ``{"site", "line", "live_bytes"}`` (for an
        alert's callbacks, off the sampler thread); None where nothing sampled is live. The heap table is
        read in 64 KiB copies (a job at its memory limit is not asked for its 4 MiB at once)."""
        import numpy as np

        if not self.started or self._heap is None:
            return None
        mapping, offset, size = self._heap
        weights: dict[int, int] = {}
        chunk = (64 << 10) // fmt.HEAP_SLOT * fmt.HEAP_SLOT
        for at in range(offset, offset + size, chunk):
            slots = np.frombuffer(bytes(mapping[at : min(at + chunk, offset + size)]), fmt.HEAP_DTYPE)
            live = slots[slots["address"] != 0]
            for stack, weight in zip(live["stack"].tolist(), live["weight"].tolist(), strict=True):
                weights[stack] = weights.get(stack, 0) + weight
        if not weights:
            return None
        top = max(weights, key=weights.__getitem__)
        known = self._known.get(top)
        texts = [f.decode("utf-8", "replace") for f in known[0]] if known else []
        site = next((t for t in texts if not is_library(split_frame(t)[1])), texts[0] if texts else None)
        return {"site": site or fmt.STACK_UNWRITTEN_TEXT, "line": known[3] if known else "", "live_bytes": weights[top]}

    def top_sites(self, heap: Any, top: int = 3) -> list[dict[str, Any]]:
        """The largest allocation sites of the blocks live in ``heap`` (this ring's heap table) now: ``site``
        (the innermost frame outside libraries), ``thread``, ``line``, ``live_bytes`` and ``error_bytes``
        (95%), ``blocks``. What a helper folded away at its end keeps of who held its memory."""
        import numpy as np

        slots = np.frombuffer(heap, fmt.HEAP_DTYPE)
        slots = slots[slots["address"] != 0]
        if not len(slots):
            return []
        stacks, where = np.unique(slots["stack"], return_inverse=True)
        w = slots["weight"].astype(float)
        p = np.clip(np.divide(slots["size"].astype(float), w, out=np.ones_like(w), where=w > 0), 0.0, 1.0)
        weights = np.bincount(where, w, len(stacks))
        variance = np.bincount(where, (1.0 - p) * w * w, len(stacks))
        blocks = np.bincount(where, minlength=len(stacks))
        threads = slots["thread"][np.unique(where, return_index=True)[1]]
        sites: dict[tuple[str, str], list[Any]] = {}
        for fp, weight, var, n, tid in zip(stacks.tolist(), weights, variance, blocks, threads.tolist(),
                                           strict=True):  # fmt: skip
            frames, _, thread, line = self._known.get(fp, ([], 0, "", ""))
            texts = [f.decode("utf-8", "replace") for f in frames]
            site = next((t for t in texts if not is_library(split_frame(t)[1])), texts[0] if texts else (
                fmt.STACK_UNWRITTEN_TEXT if fp != fmt.NO_PYTHON_STACK else fmt.NO_PYTHON_TEXT))  # fmt: skip
            entry = sites.setdefault((site, thread or f"thread {int(tid):#x}"), [0.0, 0.0, 0, line])
            entry[0], entry[1], entry[2] = entry[0] + weight, entry[1] + var, entry[2] + int(n)
        ranked = sorted(sites.items(), key=lambda kv: -kv[1][0])[:top]
        return [{"site": site[:300], "thread": thread[:64], "line": (line or "")[:120], "live_bytes": int(round(b)),
                 "error_bytes": int(round(1.96 * math.sqrt(v))), "blocks": n}
                for (site, thread), (b, v, n, line) in ranked]  # fmt: skip

    def stats(self) -> dict[str, int]:
        out: dict[str, int] = dict(self._c.stats()) if self.started else {}
        out["stacks_unwritten"] = self.unwritten
        return out

    def stop(self, *, in_child: bool = False) -> None:
        """Hooks out (the job's allocators as they were); not in a forked child: the last stacks first."""
        if not self.started:
            return
        if not in_child:
            try:
                self.drain()
            except Exception:
                pass
        self.started = False
        self._c.stop(in_child)
        table = self._stack_table()
        if table is not None:  # the stack sampler's last tick may turn the table over: no hooks to tell
            table.on_flip = None
        unname, self._unname = self._unname, None
        if unname is not None:
            unname()
        owner = self._table()
        if isinstance(owner, StackTable) and owner.view is not None:
            view, owner.view = owner.view, None
            view.release()


def start_allocs(mapping: Any, header: fmt.Header, sequence: Any, mean: int, own: bool,
                 stacks: Callable[[], Any], note: Callable[[str], None]) -> AllocSampler | None:  # fmt: skip
    """Allocation sampling for a ring just armed, or None with a note saying why not. ``own``: stacks are
    not sampled, so the stack table is ours alone; else ``stacks()`` is the stack sampler (its table)."""
    if not mean:
        return None
    try:
        cmod = sample_module()
        if cmod is None:
            raise RuntimeError("the C extension blackbox.collect._csample is not built")
        table: Any = (
            StackTable(mapping[header.stacks_offset : header.stacks_offset + header.stacks_size]) if own else None
        )
        return AllocSampler.start(cmod, mapping, header, sequence, mean, (lambda: table) if own else stacks, note)
    except Exception as exc:
        note(f"allocations not sampled: {type(exc).__name__}: {exc}")
        return None


def _monotonic(entry: dict[str, Any]) -> int:
    """A history entry's ``time_us`` (PyTorch's: microseconds since the epoch) on CLOCK_MONOTONIC, the heap
    table's clock; 0 where it has none or it reads before the boot."""
    time_us = entry.get("time_us")
    if not isinstance(time_us, int) or isinstance(time_us, bool) or time_us <= 0:
        return 0
    when = time.monotonic_ns() - (time.time_ns() - time_us * 1000)
    return when if when > 0 else 0
