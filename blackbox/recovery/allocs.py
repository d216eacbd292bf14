"""Who holds the memory: allocation sites from a ring's sampled allocations, as pure functions.

The heap table (``ring.heap``) holds every sampled block still live at the
ring's last write, however long ago it was allocated; the stack table names
each block's allocating stack by fingerprint (``ring.heap.alloc_stack``). A
block of s bytes was sampled with probability ``p = 1 - exp(-s/R)`` and weighs
``w = s / p``, independently of the others, so per site the live bytes are
estimated by ``sum(w)`` (unbiased) with variance ``sum((1 - p) w^2)``; the
error given is the 95% half-width, ``1.96 * sqrt(variance)``. Nothing here
reads files: the caller passes what the reader decoded.

A site is the innermost frame of the job's own code (outside site-packages,
the standard library and blackbox) in the allocating stack, with the thread
that allocated; where the stack has none, the innermost frame outside the
standard library and the import machinery (a library's own line). A site whose
memory was made by an import (importlib's frames between the site and the
allocation: ``import torch``) is marked ``imports`` and is ranked after every
other site, so import machinery never heads "who holds".

What was there is told apart from what grew. A block allocated before the
job's first step (imports, the model, the optimizer's state made before it) is
``resident_bytes``, never growth; one allocated in the step the ring ended in
is ``last_step_bytes`` (in flight: that step's temporaries, or a spike). Growth
counts only the blocks allocated in the steps between, and is given only where
they span ``MIN_GROWTH_STEPS`` distinct steps: per step for the thread that
counts steps, per second for the others (and for a ring without steps), then
only over a window of at least ``MIN_GROWTH_WINDOW_S`` (never extrapolated from
a step or a tick). A last step that ran ``LATE_STEPS`` times its steps' median
and that window (the loop had ended: an evaluation after training, a notebook's
later cells; or one heavy step ran) is no step in flight: what was allocated
after it began grows per second (``after_last_step``, which alloc_levers tells
both ways), not one allocation of all its blocks.
``grew`` ranks the sites by the bytes they grew, apart from ``sites``, which
ranks them by the bytes they hold.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from ..ring import format as fmt
from ..ring.heap import AllocStack, HeapScan, alloc_stacks
from ..ring.scan import StackScan
from .spill import derived

TOP_SITES = 20
TOP_GROWERS = 5  # sites in ``grew``
UNWRITTEN = AllocStack(fmt.STACK_UNWRITTEN_TEXT, "", "")  # a fingerprint the stack table does not hold
TOP_STACKS = 500  # live bytes per folded stack kept in metadata.json (the export's input from a bundle)
Z95 = 1.96
GPU_DOMAIN = next(code for code, name in fmt.ALLOC_DOMAINS.items() if name == "gpu")
MIN_GROWTH_STEPS = 3  # distinct steps a site's blocks must span before it is said to grow per step
MIN_GROWTH_WINDOW_S = 2.0  # and seconds, for growth per second (at least 5 sample intervals too)
LATE_STEPS = 5  # a last step that ran this many times its steps' median (and the window above) ran long
STEPS_TIMED = 20  # the last steps whose median step time that is measured against
# blackbox's own frames (arm's allocations), and the sitecustomize `blackbox run` writes into its run folder
_OWN = r"/blackbox/(ring/|collect/|run/|_\w+\.py:|__init__\.py:)|/\.boot/sitecustomize\.py:"
_LIBRARY = re.compile(r"site-packages|dist-packages|<frozen|/lib/python3\.\d+/|" + _OWN)
# an entry point a package installs (`<module> (/venv/bin/torchrun:6)`: a file without a dot in a bin folder, whose
# wrapper pip writes defines no function) is the library's; a job's own `bin/train` is the job's where its functions are
_ENTRY = re.compile(r"/s?bin/[^/.]+:\d+\)?$")
# the standard library (site-packages apart), frozen modules and blackbox: never a site where a library's is
_STDLIB = re.compile(r"<frozen |/lib/python3\.\d+/(?!site-packages/|dist-packages/)|" + _OWN)
_OWN_FRAME = re.compile(_OWN)
DYNAMIC_CODE = "<dynamic-code>:"  # cloudpickle's file name for code pickled by value
_IMPORT = re.compile(r"<frozen importlib\._bootstrap|/importlib/_bootstrap(_external)?\.py:")


def _where(frame: str) -> str:
    return frame.rpartition(" (")[2]


def is_library_frame(frame: str) -> bool:
    """A frame of a library (``fn (path:line)``): site-packages, the standard library, blackbox, an entry point."""
    where = _where(frame)
    return bool(_LIBRARY.search(where)) or (frame.startswith("<module> (") and bool(_ENTRY.search(where)))


def is_job_frame(frame: str) -> bool:
    """A frame of the job's own code: no library's, not blackbox's, no placeholder."""
    return not is_library_frame(frame) and not frame.startswith("<blackbox:")


def is_import_frame(frame: str) -> bool:
    """A frame of the import machinery (importlib's bootstrap, frozen or not)."""
    return bool(_IMPORT.search(_where(frame)))


def is_stdlib_frame(frame: str) -> bool:
    """A frame of the standard library, a frozen module or blackbox (not site-packages), or a placeholder."""
    return frame.startswith("<blackbox:") or bool(_STDLIB.search(_where(frame)))


def _run_by_the_job(frames: list[str], i: int) -> bool:
    """Frame ``i`` (the job's by its file) is the job's: code compiled from a string (``<string>``) is the job's
    only where the nearest frame outside such code is (``python -c``), not where a library made it (a
    dataclass's ``__init__``, a namedtuple's ``__new__``). cloudpickle's ``<dynamic-code>`` is the job's: the
    function submitit, Ray or Dask shipped by value to a process of theirs (defined in ``__main__`` or a notebook)."""
    if _where(frames[i]).startswith(DYNAMIC_CODE):
        return True
    while i >= 0 and _where(frames[i]).startswith("<"):
        i -= 1
    return i < 0 or is_job_frame(frames[i])


def site_and_imports(folded: str) -> tuple[str, bool]:
    """(site, imports) of a folded stack: the innermost frame of the job's own code, else the innermost
    outside the standard library and the import machinery, else the innermost not blackbox's own (its
    start-up is never a site), else the innermost; ``imports``: the memory an import made (the import
    machinery ran between the job's frame and the allocation; for a library's line, anywhere in the stack)."""
    frames = folded.split(";")
    for i in range(len(frames) - 1, -1, -1):
        if is_job_frame(frames[i]) and _run_by_the_job(frames, i):
            return frames[i], any(map(is_import_frame, frames[i + 1 :]))
    imports = any(map(is_import_frame, frames))  # a library's own line: made while a module was imported
    site = next((f for f in reversed(frames) if not is_stdlib_frame(f) and not _where(f).startswith("<")), None)
    return site or next((f for f in reversed(frames) if not _OWN_FRAME.search(_where(f))), frames[-1]), imports


def site_of(folded: str) -> str:
    """The site of a folded stack (``site_and_imports``)."""
    return site_and_imports(folded)[0]


def _wall(ring_meta: dict[str, Any], mono: np.ndarray) -> np.ndarray:
    clock = ring_meta.get("clock") or {}
    wall0, mono0 = clock.get("wall_ns"), clock.get("monotonic_ns")
    if not isinstance(wall0, int) or not isinstance(mono0, int):
        return np.asarray(mono, np.int64)
    return np.asarray(mono, np.int64) + np.int64(wall0 - mono0)


def mean_bytes(ring_meta: dict[str, Any]) -> int | None:
    """R, the mean sampling interval the writer used (None: not recorded)."""
    value = (ring_meta.get("options") or {}).get("allocations_mean_bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 1 << 62 else None


def error95(size: np.ndarray, weight: np.ndarray) -> float:
    """The 95% half-width of ``sum(weight)`` as an estimate of the bytes the samples stand for."""
    w = weight.astype(float)
    p = np.divide(size.astype(float), w, out=np.ones_like(w), where=w > 0)
    np.clip(p, 0.0, 1.0, out=p)
    q = np.subtract(1.0, p, out=p)  # in place: a million slots' temporaries add up
    q *= w
    q *= w
    return float(Z95 * math.sqrt(float(q.sum())))


def _slope(x: np.ndarray, w: np.ndarray, grid: np.ndarray) -> float | None:
    """Least-squares slope of the bytes accumulated up to each point of ``grid`` (allocated at ``x``)."""
    if len(grid) < 3 or np.ptp(grid) <= 0:
        return None
    order = np.argsort(x, kind="stable")
    cum = np.zeros(len(w) + 1)
    np.cumsum(w[order], out=cum[1:], dtype=float)
    y = cum[np.searchsorted(x[order], grid, side="right")]
    slope = float(np.polyfit(grid.astype(float), y, 1)[0])
    return slope if math.isfinite(slope) else None


MAX_GRID = 1 << 20  # steps the growth is fitted over, at most (a hostile ring's steps span 2**63)


def _step_grid(first: int, last: int) -> np.ndarray:
    """Every step from ``first`` to ``last``, or MAX_GRID of them evenly spread where there are more."""
    if last - first < MAX_GRID:
        return np.arange(first, last + 1, dtype=np.int64)
    return first + np.arange(MAX_GRID, dtype=np.int64) * ((last - first) // (MAX_GRID - 1))


def step_records(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """(UTC ns, step) of the ring's ``step`` records, in time order: when each step began."""
    kinds = table["kind"].combine_chunks()
    if not pa.types.is_dictionary(kinds.type) or "step" not in kinds.dictionary.to_pylist():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows = np.flatnonzero(kinds.indices.to_numpy(zero_copy_only=False) == kinds.dictionary.to_pylist().index("step"))
    taken = table.select(["time", "value"]).take(pa.array(rows))
    ok = taken["value"].is_valid().to_numpy(zero_copy_only=False)
    times = taken["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)[ok]
    return times, taken["value"].to_numpy(zero_copy_only=False)[ok].astype(np.int64)


def _steps(slots: np.ndarray, when: np.ndarray, steps: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """The step each block was allocated in: from the ring's step records where they cover its time (the
    slot's own step is the sampler's last tick's, up to a sample interval late), else the slot's. A GPU
    block's slot holds its allocation's time (PyTorch's history) but the step of the drain that found it,
    seconds later: before the first step record, it was allocated in the step before that record's (before
    the first step, where the ring kept every step record)."""
    out = slots["step"].astype(np.int64)
    if steps is None or not len(steps[0]):
        return out
    at = np.searchsorted(steps[0], when, side="right") - 1
    covered = at >= 0
    out[covered] = steps[1][at[covered]]
    earlier = ~covered & (slots["domain"] == GPU_DOMAIN)
    out[earlier] = np.minimum(out[earlier], steps[1][0] - 1)
    return out


def live_sites(
    heap: HeapScan | None,
    stacks: StackScan | None,
    ring_meta: dict[str, Any],
    last_step: int | None,
    end_ns: int | None,
    main_thread: int | None = None,
    steps: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, Any] | None:
    """``allocations`` of a ring's metadata: live bytes by site (``sites``: who holds, the job's own sites
    first by live bytes, import sites after them) with their error, what was resident since start-up and
    what grew (``grew``: who grew, by the bytes grown), the totals, and live bytes by folded stack; None
    where allocations were not sampled.

    ``last_step``, ``end_ns``: the ring's last step and last event (UTC ns), where growth is measured to;
    ``main_thread``: the thread that counted the steps (its sites' growth is per step, others' per second);
    ``steps``: ``step_records`` of the ring's timeline.
    """
    if heap is None:
        return None
    slots = heap.slots
    if main_thread is not None:  # a GPU block's slot names the thread that drained the history (PyTorch's history
        # names none): its growth is the step-counting thread's, per step. In place: the scan's own copy (a hostile
        # heap's million slots are 64 MiB; a second copy would pass recovery's memory bound)
        slots["thread"][slots["domain"] == GPU_DOMAIN] = main_thread
    fingerprints, where = _codes(slots["stack"])
    weights = np.bincount(where, slots["weight"].astype(float), len(fingerprints))
    # only fingerprints the table holds are looked up (the rest, a million in a hostile heap, are unwritten)
    known = np.unique(np.array([*(stacks.allocs if stacks is not None else ()), fmt.NO_PYTHON_STACK], np.uint64))
    at = np.searchsorted(known, fingerprints)  # (np.isin would sort the million fingerprints again)
    written = np.flatnonzero(known[np.minimum(at, len(known) - 1)] == fingerprints)
    del at
    resolved = alloc_stacks(stacks, fingerprints[written[np.argsort(-weights[written], kind="stable")]].tolist())
    found = {int(i): resolved[int(fingerprints[i])] for i in written.tolist()}
    by_stack: dict[str, float] = {}
    if len(written) < len(fingerprints):
        by_stack[UNWRITTEN.folded] = float(weights.sum() - weights[written].sum())
    for i, stack in found.items():
        by_stack[stack.folded] = by_stack.get(stack.folded, 0.0) + float(weights[i])
    count = len(fingerprints)
    del fingerprints, weights  # (each array a slot's worth is 8 MiB in a hostile heap: none kept past its use)
    groups, names = _groups(slots, where, count, found)
    del where
    keys, rows_of = _codes(groups)
    del groups
    group_weight = np.bincount(rows_of, slots["weight"].astype(float), len(keys))
    order = np.argsort(rows_of, kind="stable")
    starts = np.searchsorted(rows_of[order], np.arange(len(keys) + 1))
    site_keys = [names[0][int(k) // len(names[1])] for k in keys.tolist()]
    imports = np.array([imp for _, imp in site_keys], bool)
    rank = np.argsort(np.argsort(np.array([f for f, _ in site_keys], dtype=object), kind="stable"), kind="stable")
    when = _wall(ring_meta, slots["time"])
    step_of = np.clip(_steps(slots, when, steps), -1, np.iinfo(np.int32).max).astype(np.int32)
    end = end_ns if end_ns is not None else (int(when.max()) if len(when) else 0)
    step_s = _step_s(steps)
    window = Window(last_step, end, _interval(ring_meta), main_thread, _late_from(steps, step_s, end))
    slot_imports = imports[rows_of]
    grows = window.growing(slots, step_of, when, slot_imports)
    grown = np.bincount(rows_of, np.where(grows, slots["weight"].astype(float), 0.0), len(keys))
    del rows_of
    holders = np.lexsort((rank, -group_weight))[:TOP_SITES]  # by live bytes; the job's own first below
    growers = np.lexsort((rank, -grown))[:TOP_GROWERS]
    made = {g: _site(slots, step_of, grows, order[starts[g] : starts[g + 1]], site_keys[g],
                     names[1][int(keys[g]) % len(names[1])], resolved, when, window)
            for g in {*holders.tolist(), *growers[grown[growers] > 0].tolist()}}  # fmt: skip
    sites = sorted((made[g] for g in holders.tolist()), key=lambda s: (s["imports"], -s["live_bytes"], s["site"]))
    grew = [_grew(made[g]) for g in growers.tolist() if g in made and made[g]["grows"]]
    stacks_out = sorted(by_stack.items(), key=lambda kv: -kv[1])
    stepped = last_step is not None
    late = None if window.late_ns is None else (end - window.late_ns) / 1e9
    return {
        "recorded": True,
        "mean_bytes": mean_bytes(ring_meta),
        "live_bytes": total_bytes(slots["weight"]),
        "error_bytes": int(round(error95(slots["size"], slots["weight"]))),
        "host_live_bytes": total_bytes(slots["weight"][slots["domain"] != GPU_DOMAIN]),
        "resident_bytes": total_bytes(slots["weight"][window.resident(step_of, slot_imports)]),
        "last_step_bytes": total_bytes(slots["weight"][step_of == last_step]) if stepped else None,
        "last_step_ran_s": None if late is None else round(late, 3),
        "step_s": step_s,
        "sampled_blocks": len(slots),
        "torn_slots": heap.torn,
        "sites": sites,
        "grew": grew,
        "site_count": len(keys),
        "stacks": [{"stack": s, "live_bytes": int(round(b))} for s, b in stacks_out[:TOP_STACKS]],
    }


def _step_s(steps: tuple[np.ndarray, np.ndarray] | None) -> float | None:
    """The median of the last ``STEPS_TIMED`` steps' times (s), None with fewer than 2 step records."""
    if steps is None or len(steps[0]) < 2:
        return None
    return round(float(np.median(np.diff(steps[0][-STEPS_TIMED - 1 :]))) / 1e9, 6)


def _late_from(steps: tuple[np.ndarray, np.ndarray] | None, step_s: float | None, end_ns: int) -> int | None:
    """When the last step began (UTC ns), where it ran long against ``step_s`` (module docstring), else None."""
    if steps is None or step_s is None:
        return None
    began = int(steps[0][-1])
    return began if (end_ns - began) / 1e9 > max(LATE_STEPS * step_s, MIN_GROWTH_WINDOW_S) else None


def _interval(ring_meta: dict[str, Any]) -> float:
    value = ring_meta.get("sample_interval_s")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else 0.1


class Window:
    """When a block counts as grown: not resident (allocated before the first step, or by an import in a
    ring without steps), not in flight (allocated in the step the ring ended in, or within the last sample
    interval), and how its site's growth is measured (per step or per second; per second too after the
    start of a last step that ran long, ``late_ns``)."""

    def __init__(self, last_step: int | None, end_ns: int, interval_s: float, main_thread: int | None,
                 late_ns: int | None = None) -> None:  # fmt: skip
        self.last_step, self.end_ns, self.main_thread, self.late_ns = last_step, end_ns, main_thread, late_ns
        self.interval_ns = int(interval_s * 1e9)
        self.min_window_s = max(MIN_GROWTH_WINDOW_S, 5 * interval_s)

    def resident(self, step_of: np.ndarray, imports: np.ndarray) -> np.ndarray:
        """Blocks resident since start-up: allocated before the first step (all import-made blocks where the
        ring has no steps)."""
        return step_of < 0 if self.last_step is not None else imports.copy()

    def growing(self, slots: np.ndarray, step_of: np.ndarray, when: np.ndarray, imports: np.ndarray) -> np.ndarray:
        """Blocks that count as growth (resident and in-flight ones left out)."""
        out = ~self.resident(step_of, imports)
        late = self.late(when)
        if self.last_step is not None:
            out &= (step_of < self.last_step) | late
        by_second = slots["thread"] != self.main_thread if self.main_thread is not None else np.ones(len(out), bool)
        out &= ~(by_second | late) | (when < self.end_ns - self.interval_ns)
        return out

    def late(self, when: np.ndarray) -> np.ndarray:
        """Blocks allocated after the start of a last step that ran long."""
        return when >= self.late_ns if self.late_ns is not None else np.zeros(len(when), bool)


def _grew(site: dict[str, Any]) -> dict[str, Any]:
    keep = ("site", "thread", "line", "imports", "domains", "grown_bytes", "grown_error_bytes", "growth_per_step",
            "growth_per_s", "growth_by", "after_last_step", "first_step", "live_bytes")  # fmt: skip
    return {k: site[k] for k in keep}


def _distinct(values: np.ndarray) -> np.ndarray:
    """np.unique by a sort: numpy 2's hashing np.unique takes 7 times the values' memory."""
    ordered = np.sort(values)
    keep = np.ones(len(ordered), bool)
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    out: np.ndarray = ordered[keep]
    return out


def _codes(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(distinct values ascending, the index of each value among them), in a fraction of np.unique's memory
    (a million slots' worth, in a hostile heap)."""
    uniq = _distinct(values)
    return uniq, np.searchsorted(uniq, values)


def total_bytes(weights: np.ndarray) -> int:
    """The exact sum of u8 weights (numpy's wraps past 2**64, as a hostile ring's weights make it): the
    high and low 32 bits summed apart, each exact below 2**32 weights."""
    w = np.asarray(weights, np.uint64)
    return (int((w >> np.uint64(32)).sum()) << 32) + int((w & np.uint64(0xFFFFFFFF)).sum())


def _groups(slots: np.ndarray, where: np.ndarray, count: int, found: dict[int, AllocStack]
            ) -> tuple[np.ndarray, tuple[list[tuple[str, bool]], list[str]]]:  # fmt: skip
    """A (site, thread) key per slot, and the sites' and threads' names the keys index (key = site *
    len(threads) + thread): ``found``, the stacks of the fingerprints (by index) the table holds, the
    others unwritten; each site, (frame, made by an import), found once, a thread named by the stack where
    it was written there, else by the slot's thread id. A million slots of distinct stacks cost numpy, not
    Python."""
    unwritten = site_and_imports(UNWRITTEN.folded)
    site_index = {unwritten: 0}
    folded_site = {UNWRITTEN.folded: 0}
    thread_index: dict[str, int] = {}
    fp_site = np.zeros(count, np.int64)
    fp_thread = np.full(count, -1, np.int64)
    for i, stack in found.items():
        if stack.folded not in folded_site:
            folded_site[stack.folded] = site_index.setdefault(site_and_imports(stack.folded), len(site_index))
        fp_site[i] = folded_site[stack.folded]
        if stack.thread:
            fp_thread[i] = thread_index.setdefault(stack.thread, len(thread_index))
    thread = fp_thread[where]
    unnamed = thread < 0
    ids, inverse = _codes(slots["thread"][unnamed])
    for tid in ids.tolist():
        thread_index.setdefault(f"thread {int(tid):#x}", len(thread_index))
    thread[unnamed] = np.array([thread_index[f"thread {int(t):#x}"] for t in ids.tolist()], np.int64)[inverse.ravel()]
    threads = list(thread_index)
    return fp_site[where] * max(1, len(threads)) + thread, (list(site_index), threads or [""])


def _site(
    slots: np.ndarray,
    step_of: np.ndarray,
    grows: np.ndarray,
    idx: np.ndarray,
    key: tuple[str, bool],
    thread: str,
    resolved: dict[int, AllocStack],
    when: np.ndarray,
    window: Window,
) -> dict[str, Any]:
    w, t, steps = slots["weight"][idx], when[idx], step_of[idx].astype(np.int64)  # a field at a time
    fps, inverse = _codes(slots["stack"][idx])
    top = resolved.get(int(fps[int(np.argmax(np.bincount(inverse, w, len(fps))))]), UNWRITTEN)
    del fps, inverse
    stepped = steps >= 0
    first_step = int(steps[stepped].min()) if stepped.any() else None
    g = grows[idx]
    by_step = window.main_thread is not None and bool((slots["thread"][idx] == window.main_thread).any())
    by_step = by_step and window.last_step is not None
    late = g & window.late(t)  # (the main thread's blocks after a last step that ran long: by the second too)
    per_step = per_s = None
    if by_step and len(np.unique(steps[g & ~late])) >= MIN_GROWTH_STEPS:
        assert window.last_step is not None
        counted = g & ~late
        per_step = _slope(steps[counted], w[counted], _step_grid(int(steps[counted].min()), window.last_step - 1))
    timed = late if by_step else g
    if per_step is None and timed.any():
        first_ns = int(t[timed].min())
        span_s = (window.end_ns - first_ns) / 1e9
        ticks = len(np.unique((t[timed] - first_ns) // max(window.interval_ns, 1)))
        if span_s >= window.min_window_s and ticks >= MIN_GROWTH_STEPS:
            seconds = (t[timed] - first_ns).astype(float) / 1e9
            per_s = _slope(seconds, w[timed], np.linspace(0.0, span_s, 50))
    grown_bytes = total_bytes(w[g])
    grown_error = error95(slots["size"][idx][g], w[g])
    after_last_step = by_step and per_step is None and per_s is not None  # grown only after it began: per second
    by_step = by_step and not after_last_step
    rate = per_step if by_step else per_s
    resident = window.resident(steps, np.full(len(idx), key[1]))
    return {
        "site": key[0],
        "imports": key[1],
        "thread": thread,
        "line": top.line,
        "stack": top.folded,
        "domains": sorted(fmt.ALLOC_DOMAINS.get(d, f"code_{d}") for d in _distinct(slots["domain"][idx]).tolist()),
        "live_bytes": total_bytes(w),
        "error_bytes": int(round(error95(slots["size"][idx], w))),
        "blocks": len(idx),
        "largest_block": int(slots["size"][idx].max()) if len(idx) else 0,
        "resident_bytes": total_bytes(w[resident]),
        "last_step_bytes": total_bytes(w[steps == window.last_step]) if window.last_step is not None else None,
        "grown_bytes": grown_bytes,
        "grown_error_bytes": int(round(grown_error)),
        "grows": rate is not None and rate > 0 and grown_bytes > grown_error,
        "growth_per_step": None if per_step is None else int(round(per_step)),
        "growth_per_s": None if per_s is None else int(round(per_s)),
        "growth_by": "step" if by_step else "second",
        "after_last_step": after_last_step,
        "first_step": first_step,
        "first_seen_ns": int(t.min()),
    }


def main_thread_of(table: pa.Table) -> int | None:
    """The thread that wrote the ring's step records (the training loop), if any."""
    kinds = table["kind"].combine_chunks()
    if not pa.types.is_dictionary(kinds.type):
        return None
    words = kinds.dictionary.to_pylist()
    if "step" not in words:
        return None
    rows = np.flatnonzero(kinds.indices.to_numpy(zero_copy_only=False) == words.index("step"))
    if not len(rows):
        return None
    threads = table["thread"].take(pa.array(rows[-1:])).to_pylist()
    return int(threads[0]) if threads and threads[0] is not None else None


def ring_sites(rings: Iterable[dict[str, Any]], top: int = TOP_SITES) -> list[dict[str, Any]]:
    """The largest sites of every ring's ``allocations``, each with its process, largest first (rings spilled
    to disk are read once for every caller: the sites are shared, not to be changed)."""
    return derived(rings, f"ring_sites {top}", lambda: _sites(rings, top))


def _sites(rings: Iterable[dict[str, Any]], top: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in rings:
        report = m.get("allocations") or {}
        who = {"pid": m.get("pid"), "role": m.get("role"), "rank": m.get("rank"), "host": m.get("host")}
        out.extend({**site, **who} for site in report.get("sites") or [])
        out.sort(key=lambda s: (bool(s.get("imports")), -int(s.get("live_bytes") or 0)))  # imports never first
        del out[top:]
    return out
