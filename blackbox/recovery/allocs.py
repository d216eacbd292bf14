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
that allocated; its growth is the least-squares slope of its live bytes
accumulated by the step (or second) each block was allocated in, so memory
allocated once at the start and kept is not growth, and a leak is.
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
UNWRITTEN = AllocStack(fmt.STACK_UNWRITTEN_TEXT, "", "")  # a fingerprint the stack table does not hold
TOP_STACKS = 500  # live bytes per folded stack kept in metadata.json (the export's input from a bundle)
Z95 = 1.96
_LIBRARY = re.compile(r"site-packages|dist-packages|<frozen|/lib/python3\.\d+/|/blackbox/(ring|collect)/")


def is_library_frame(frame: str) -> bool:
    """A frame of a library (``fn (path:line)``): site-packages, the standard library, blackbox."""
    _, _, where = frame.rpartition(" (")
    return bool(_LIBRARY.search(where))


def site_of(folded: str) -> str:
    """The innermost frame outside libraries (else the innermost frame) of a folded stack."""
    frames = folded.split(";")
    for frame in reversed(frames):
        if not is_library_frame(frame) and not frame.startswith("<blackbox:"):
            return frame
    return frames[-1]


def _wall(ring_meta: dict[str, Any], mono: np.ndarray) -> np.ndarray:
    clock = ring_meta.get("clock") or {}
    wall0, mono0 = clock.get("wall_ns"), clock.get("monotonic_ns")
    if not isinstance(wall0, int) or not isinstance(mono0, int):
        return np.asarray(mono, np.int64)
    return np.asarray(mono, np.int64) + np.int64(wall0 - mono0)


def mean_bytes(ring_meta: dict[str, Any]) -> int | None:
    """R, the mean sampling interval the writer used (None: not recorded)."""
    value = (ring_meta.get("options") or {}).get("allocations_mean_bytes")
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


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
    slot's own step is the sampler's last tick's, up to a sample interval late), else the slot's."""
    out = slots["step"].astype(np.int64)
    if steps is None or not len(steps[0]):
        return out
    at = np.searchsorted(steps[0], when, side="right") - 1
    covered = at >= 0
    out[covered] = steps[1][at[covered]]
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
    """``allocations`` of a ring's metadata: live bytes by site (largest first) with their error and
    growth, the totals, and live bytes by folded stack; None where allocations were not sampled.

    ``last_step``, ``end_ns``: the ring's last step and last event (UTC ns), where growth is measured to;
    ``main_thread``: the thread that counted the steps (its sites' growth is per step, others' per second);
    ``steps``: ``step_records`` of the ring's timeline.
    """
    if heap is None:
        return None
    slots = heap.slots
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
    del rows_of
    site_names = [names[0][int(k) // len(names[1])] for k in keys.tolist()]
    rank = np.argsort(np.argsort(np.array(site_names, dtype=object), kind="stable"), kind="stable")
    top = np.lexsort((rank, -group_weight))[:TOP_SITES]  # by live bytes, then by site
    when = _wall(ring_meta, slots["time"])
    step_of = np.clip(_steps(slots, when, steps), -1, np.iinfo(np.int32).max).astype(np.int32)
    end = end_ns if end_ns is not None else (int(when.max()) if len(when) else 0)
    sites = [_site(slots, step_of, order[starts[g] : starts[g + 1]], site_names[g],
                   names[1][int(keys[g]) % len(names[1])], resolved, when, end, last_step, main_thread)
             for g in top.tolist()]  # fmt: skip
    sites.sort(key=lambda s: (-s["live_bytes"], s["site"]))
    stacks_out = sorted(by_stack.items(), key=lambda kv: -kv[1])
    return {
        "mean_bytes": mean_bytes(ring_meta),
        "live_bytes": total_bytes(slots["weight"]),
        "error_bytes": int(round(error95(slots["size"], slots["weight"]))),
        "sampled_blocks": len(slots),
        "torn_slots": heap.torn,
        "sites": sites,
        "site_count": len(keys),
        "stacks": [{"stack": s, "live_bytes": int(round(b))} for s, b in stacks_out[:TOP_STACKS]],
    }


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
            ) -> tuple[np.ndarray, tuple[list[str], list[str]]]:  # fmt: skip
    """A (site, thread) key per slot, and the sites' and threads' names the keys index (key = site *
    len(threads) + thread): ``found``, the stacks of the fingerprints (by index) the table holds, the
    others unwritten; each site found once, a thread named by the stack where it was written there, else by
    the slot's thread id. A million slots of distinct stacks cost numpy, not Python."""
    site_index = {site_of(UNWRITTEN.folded): 0}
    folded_site = {UNWRITTEN.folded: 0}
    thread_index: dict[str, int] = {}
    fp_site = np.zeros(count, np.int64)
    fp_thread = np.full(count, -1, np.int64)
    for i, stack in found.items():
        if stack.folded not in folded_site:
            folded_site[stack.folded] = site_index.setdefault(site_of(stack.folded), len(site_index))
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
    idx: np.ndarray,
    frame: str,
    thread: str,
    resolved: dict[int, AllocStack],
    when: np.ndarray,
    end_ns: int,
    last_step: int | None,
    main_thread: int | None,
) -> dict[str, Any]:
    w, t, steps = slots["weight"][idx], when[idx], step_of[idx].astype(np.int64)  # a field at a time
    fps, inverse = _codes(slots["stack"][idx])
    top = resolved.get(int(fps[int(np.argmax(np.bincount(inverse, w, len(fps))))]), UNWRITTEN)
    del fps, inverse
    stepped = steps >= 0
    first_step = int(steps[stepped].min()) if stepped.any() else None
    per_step = None
    if first_step is not None and last_step is not None and last_step > first_step:
        per_step = _slope(steps[stepped], w[stepped], _step_grid(first_step, last_step))
    first_ns = int(t.min())
    seconds = t.astype(float)
    seconds -= first_ns
    seconds /= 1e9
    del t
    per_s = _slope(seconds, w, np.linspace(0.0, max(0.0, (end_ns - first_ns) / 1e9), 50))
    by_step = main_thread is not None and bool((slots["thread"][idx] == main_thread).any()) and per_step is not None
    return {
        "site": frame,
        "thread": thread,
        "line": top.line,
        "stack": top.folded,
        "domains": sorted(fmt.ALLOC_DOMAINS.get(d, f"code_{d}") for d in _distinct(slots["domain"][idx]).tolist()),
        "live_bytes": total_bytes(w),
        "error_bytes": int(round(error95(slots["size"][idx], w))),
        "blocks": len(idx),
        "growth_per_step": None if per_step is None else int(round(per_step)),
        "growth_per_s": None if per_s is None else int(round(per_s)),
        "growth_by": "step" if by_step else "second",
        "first_step": first_step,
        "first_seen_ns": first_ns,
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


def site_lever(site: dict[str, Any], role: str | None) -> str:
    """What to change, from where the memory is held (the site's function, line and thread)."""
    name, _, where = site["site"].rpartition(" (")
    at = f"`{where.rstrip(')')}` (`{name}`)"
    line = site.get("line") or ""
    if name.endswith("__getitem__") or role == "worker":
        why = "the Dataset keeps what __getitem__ makes (a cache in every worker): return it without keeping it"
    elif ".append(" in line or ".extend(" in line or "+=" in line:
        why = "a list appended in the loop keeps every step's objects: keep `x.item()` or a bounded deque"
    elif "cache" in line.lower() or "cache" in name.lower() or re.search(r"\]\s*=", line):
        why = "a cache that never evicts: bound it (functools.lru_cache(maxsize=...), or evict by size)"
    elif "gpu" in site.get("domains", []):
        why = "tensors kept on the GPU across steps: keep `.item()` or `.detach().cpu()` of what you log"
    else:
        why = "memory allocated there is kept: find what holds on to it"
    where_thread = "" if site.get("thread") in (None, "MainThread") else f" in thread `{site['thread']}`"
    return f"{at}{where_thread} holds most of the sampled memory: {why}"


MEMORY_CAUSES = frozenset({"host_oom_kill", "userspace_oom_kill", "oom_exception"})


def with_site_lever(death: dict[str, Any], allocations: dict[str, Any] | None, role: str | None) -> dict[str, Any]:
    """The death with the lever of its largest allocation site first, where it ran out of memory."""
    sites = (allocations or {}).get("sites") or []
    if not death or death.get("cause") not in MEMORY_CAUSES or not sites:
        return death
    return {**death, "levers": [site_lever(sites[0], role), *(death.get("levers") or [])]}


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
        out.sort(key=lambda s: -int(s.get("live_bytes") or 0))
        del out[top:]
    return out
