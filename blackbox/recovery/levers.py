"""Why memory ran out and what to change: pure analysis of a dead ring's facts.

``analysis`` follows the process that grew (the job's own, or one of its
children: a DataLoader worker) and what the memory was made of at the end
(anonymous memory, page cache, shared memory), and gives the levers that fit
that process and that kind of memory, so a worker's leak gets worker levers.
A worker's levers follow how its memory behaved (``worker_memory``): memory
that grew with the batches it served is a leak in the Dataset (and persistent
workers would keep it growing), memory that did not is a copy each worker holds
(fewer workers, data shared rather than copied).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._fit import trend
from .._units import human_bytes
from ..collect.identity import SPAWNED_RANK
from .facts import Facts, Rows
from .helpers import LAUNCHED_BY, ROLE

# Processes whose OOM kill is no worker's (no Dataset, no copies per worker): their levers are a main process's
NOT_WORKERS = frozenset({None, ROLE["main"], ROLE["child"], ROLE["compile_worker"], ROLE["mp_service"], SPAWNED_RANK,
                         *LAUNCHED_BY})  # fmt: skip

COPY_ON_READ_LEVER = (
    "each worker holds its own copy of every Python object the dataset touches (reference counts turn "
    "copy-on-write into copy-on-read): keep samples in numpy arrays or Arrow tables, not lists or dicts of "
    "Python objects")  # fmt: skip
FEWER_WORKERS_LEVER = "fewer DataLoader workers (num_workers), or a smaller prefetch_factor"
DATASET_CACHE_LEVER = "look for a cache in the Dataset that grows in every worker"
WORKER_LEVERS = [DATASET_CACHE_LEVER, FEWER_WORKERS_LEVER, COPY_ON_READ_LEVER]  # how they grew is unknown
MIN_STEPS_SERVED = 3  # distinct steps of the job during a worker's samples, to tell its memory's trend
STEADY_SHARE = 0.1  # of a worker's growth, its rise with the steps it served, for a leak (not a few bytes)
LOAD_SPAN = 0.25  # of a worker's sampled life: the window of its largest burst (a load), set aside before the trend
MAIN_LEVERS = [
    "look for tensors kept across steps (e.g. `losses.append(loss)` instead of `loss.item()`) "
    "and caches that never evict",
]
SHMEM_LEVER = (
    "shared memory (/dev/shm: DataLoader workers pass batches through it) counts against the limit: smaller "
    "batches or prefetch_factor, fewer workers"
)
PAGE_CACHE_LEVER = (
    "page cache (files read or mmapped, checkpoints written) counts against the limit; dirty pages cannot be "
    "dropped until written: flush large writes, read datasets with O_DIRECT or in chunks"
)
LIMIT_LEVER = "raise the memory limit only once the growth is explained"
MAX_FIT_POINTS = 1 << 16


def _before_last_step(steps: np.ndarray) -> np.ndarray:
    """The samples of the steps before the last one (where they are 3 or more, of 2 steps or more), else all: the
    step a process died in is a part of one, whose memory says nothing of growth across steps (a spike filling
    there, sampled 20 times on a loaded machine, read as 5 MiB a step beyond the noise)."""
    ok = np.isfinite(steps)
    done = ok & (steps < (steps[ok].max() if ok.any() else 0.0))
    return done if done.sum() >= 3 and len(np.unique(steps[done])) >= 2 else np.ones(len(steps), bool)


def host_growth(f: Facts) -> dict[str, Any] | None:
    """Least-squares growth of RSS per step (over the steps before the last: ``_before_last_step``) and per
    second, each with its 95% interval (``_error``: the half-width) and whether it is beyond the noise
    (``_beyond_noise``: the interval excludes zero); the growth of the job's children, and who grew."""
    if len(f.samples) < 3:
        return None
    samples, sample_ns = f.samples, f.sample_ns
    if len(samples) > MAX_FIT_POINTS:  # evenly thinned, first and last kept: the fit barely moves
        keep = np.linspace(0, len(samples) - 1, MAX_FIT_POINTS).astype(np.int64)
        samples, sample_ns = Rows(samples.table, samples.rows[keep]), sample_ns[keep]
    rss, children, steps = (samples.floats(c) for c in ("host_rss", "children_rss", "step"))
    out: dict[str, Any] = {}
    done = _before_last_step(steps)
    for name, x, y in (("rss_per_second", sample_ns / 1e9, rss), ("rss_per_step", steps[done], rss[done])):
        fit = trend(x, y)
        if fit is not None:
            out[name], error = fit
            out[f"{name}_error"] = error if np.isfinite(error) else None  # None: too few points to tell
            out[f"{name}_beyond_noise"] = abs(fit[0]) > error
    okc = ~np.isnan(children)
    grew_job = float(rss[~np.isnan(rss)][-1] - rss[~np.isnan(rss)][0]) if (~np.isnan(rss)).any() else 0.0
    if okc.sum() >= 3:
        out["children_rss_growth"] = float(children[okc][-1] - children[okc][0])
    growers = sorted(f.children.values(), key=lambda s: -s.growth)
    if growers:
        out["children"] = [{"pid": s.pid, "name": s.name, "growth": s.growth, "peak_rss": int(s.rss.max())}
                           for s in growers[:5] if len(s.rss)]  # fmt: skip
        if any(len(s.rss) for s in growers):  # a child seen once with no figure has none
            out["max_child_rss"] = max(int(s.rss.max()) for s in growers if len(s.rss))
    child_grew = max([float(out.get("children_rss_growth", 0.0))] + [float(s.growth) for s in growers])
    if okc.sum() >= 3 or growers:
        out["grew"] = "children" if child_grew > grew_job else "job"
    return out or None


def worker_memory(f: Facts, pid: int | None) -> dict[str, Any] | None:
    """How a DataLoader worker's memory behaved while it served batches: the victim's (``pid``), else
    the child's that grew most. Its RSS at each sample is fitted against the job's step then:
    ``grew_inside`` where it rose with the steps beyond the noise, and that steady rise makes at least
    STEADY_SHARE of what it grew over its life (its start-up, imports and a forked parent's pages aside:
    what ``__getitem__`` makes is kept, a leak in the Dataset, in every worker),
    ``held_copies`` where it did not (it reached its size and held it: each worker holds its own
    copy, including a load that took a few samples while its siblings served steps: its one largest
    burst is set aside before the rise is judged), ``unknown`` where the job made fewer than
    MIN_STEPS_SERVED steps while it was sampled. Also the figures: ``pid``, ``first_rss``,
    ``peak_rss``, ``rss_per_step`` and ``rss_per_step_error``, ``steps_served``, ``workers`` (children
    alive at the last sample) and ``processes`` (children seen over the ring's life). None: no child
    was sampled three times."""
    sampled = [s for s in f.children.values() if len(s.rss) >= 3]
    series = next((s for s in sampled if s.pid == pid), None) or max(sampled, key=lambda s: s.growth, default=None)
    if series is None:
        return None
    rss, steps = series.rss.astype(np.float64), series.steps
    served = len(np.unique(steps[~np.isnan(steps)]))
    end = int(series.times[-1])
    tick = 2 * float(np.median(np.diff(series.times)))  # a sibling alive then was sampled within a tick or so
    alike = [s for s in sampled if 2 * s.rss.max() >= series.rss.max()]  # itself and its peers, not a helper
    alive = sum(1 for s in alike if s.times[0] <= end and s.times[-1] >= end - tick)
    out: dict[str, Any] = {"pid": series.pid, "first_rss": int(rss[0]), "peak_rss": int(rss.max()),
                           "steps_served": served, "workers": alive, "processes": len(alike)}  # fmt: skip
    fit = trend(steps, rss) if served >= MIN_STEPS_SERVED else None
    if fit is None:
        return out | {"pattern": "unknown"}
    out["rss_per_step"], error = fit
    out["rss_per_step_error"] = error if np.isfinite(error) else None
    steady = fit[0] * float(np.nanmax(steps) - np.nanmin(steps))  # what the per-step rise adds up to
    # The whole series' own interval is no gate: a burst (a prefetch arriving, a load) leaves a long run of
    # residuals of one sign, which widens the interval past a real leak's slope (a spawn worker leaking 4 MiB
    # an item, 12 samples over 20 steps: 10.3 MB a step, ± 16.9 MB). The readings below set the burst aside.
    grew = steady >= STEADY_SHARE * (out["peak_rss"] - out["first_rss"])
    if grew:  # what rose with the steps once its one largest burst (a load, its imports) is set aside
        known = ~np.isnan(steps)  # while it served: its start-up before the first step is no burst of its own
        k_steps, k_rss = steps[known], rss[known]
        i, j = _burst(series.times[known], k_rss)
        # read twice, and a leak in either reading: the burst cut out and the sides joined (the part after it
        # lowered by its rise: a spawn worker's few steps after its prefetch), or the side of it that served
        # more steps alone (a forked worker whose fastest rise was its leak while the prefetch filled, after
        # which the joined sides show a step of the job with no rise). A copy loaded once is flat both ways.
        joined = np.ones(len(k_rss), dtype=bool)
        joined[i + 1 : j + 1] = False
        lowered = k_rss.copy()
        lowered[j + 1 :] -= k_rss[j] - k_rss[i]
        side = max((slice(j + 1, None), slice(0, i + 1)), key=lambda part: len(np.unique(k_steps[part])))
        readings = [(k_steps[joined], lowered[joined]), (k_steps[side], k_rss[side])]
        need = (
            STEADY_SHARE * (out["peak_rss"] - out["first_rss"]) / max(float(np.nanmax(steps) - np.nanmin(steps)), 1.0)
        )
        rise = next(filter(None, (_rise(s, r, need) for s, r in readings)), None)  # the first reading that rises
        grew = rise is not None
        if rise is not None and not fit[0] > error:  # the whole series' rate is lost in its burst's noise: the
            out["rss_per_step"], out["rss_per_step_error"] = rise  # reading that shows the leak gives it instead
    return out | {"pattern": "grew_inside" if grew else "held_copies"}


def _rise(steps: np.ndarray, rss: np.ndarray, need: float) -> tuple[float, float] | None:
    """(bytes a step, the half-width of its 95% interval) where RSS rises with the steps beyond the fit's
    error, by at least ``need`` bytes a step, over at least MIN_STEPS_SERVED distinct steps; else None."""
    if len(np.unique(steps)) < MIN_STEPS_SERVED:
        return None
    fit = trend(steps, rss)
    return fit if fit is not None and fit[0] > fit[1] and fit[0] >= need else None


def _burst(t: np.ndarray, rss: np.ndarray) -> tuple[int, int]:
    """(i, j): the worker's largest rise within LOAD_SPAN of the time sampled, from sample i to sample j:
    set aside before the trend is judged. A load that spans a few samples on a loaded machine, while
    siblings serve steps, would otherwise fit as a rise per step."""
    if len(t) < 2:
        return 0, 0
    ends = np.searchsorted(t, t + LOAD_SPAN * float(t[-1] - t[0]), side="right") - 1
    i = int(np.argmax(rss[ends] - rss))
    return i, int(ends[i])


def worker_levers(w: dict[str, Any] | None) -> list[str]:
    """The worker levers, the one the evidence points to first, each with its evidence."""
    pattern = (w or {}).get("pattern")
    if w is None or pattern == "unknown":
        return list(WORKER_LEVERS)
    who = f"worker pid {w['pid']}"
    if pattern == "grew_inside":
        err = f" ± {human_bytes(int(w['rss_per_step_error']))}" if w.get("rss_per_step_error") is not None else ""
        return [
            f"{who} grew with the batches it served ({human_bytes(w['first_rss'])} to {human_bytes(w['peak_rss'])}, "
            f"{human_bytes(int(w['rss_per_step']))}{err} per step): the Dataset keeps what __getitem__ makes "
            "(a cache, a list, a reference to each sample) in every worker; bound or drop it",
            "keep persistent_workers=False (the default): workers re-created every epoch free what they kept, "
            "persistent ones keep growing",
            f"{FEWER_WORKERS_LEVER}: fewer copies of the leak, which still grows",
        ]  # fmt: skip
    recreated = w["processes"] > w["workers"]
    return [
        f"{who} grew from {human_bytes(w['first_rss'])} to {human_bytes(w['peak_rss'])}, not with the "
        f"{w['steps_served']} steps it served: each of the {w['workers']} workers holds its own copy; "
        f"{FEWER_WORKERS_LEVER}",
        COPY_ON_READ_LEVER,
        "load the data once, shared (a numpy memmap, torch tensors with share_memory_(), an Arrow file), "
        "not in each worker",
        *(["persistent_workers=True: workers were re-created (each loading its copy again), "
           f"{w['processes']} processes over the run for {w['workers']} at a time"] if recreated else []),
    ]  # fmt: skip


def composition(stat: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the cgroup's memory was at the end: anonymous, page cache, shared memory (bytes and shares)."""
    if not stat:
        return None
    parts = {k: stat.get(f"cgroup_{k}") for k in ("anon", "file", "shmem", "file_dirty", "file_writeback")}
    total = sum(v for k, v in parts.items() if k in ("anon", "file") and v)
    if not total:
        return None
    out: dict[str, Any] = {k: v for k, v in parts.items() if v is not None}
    out["anon_share"] = round((parts["anon"] or 0) / total, 3)
    out["file_share"] = round((parts["file"] or 0) / total, 3)
    out["shmem_share"] = round((parts["shmem"] or 0) / total, 3)  # shmem is counted inside file
    return out


def analysis(f: Facts, cause: str, victim: dict[str, Any], stat: dict[str, Any] | None) -> dict[str, Any]:
    """host_growth, memory composition at the end, and levers for a host OOM (kill or exception); for a
    worker's, how its memory behaved (``worker_memory``)."""
    out: dict[str, Any] = {}
    levers: list[str] = []
    growth = host_growth(f)
    if growth:
        out["host_growth"] = growth
    memory = composition(stat)
    if memory:
        out["memory_at_end"] = memory
    if cause in ("host_oom_kill", "userspace_oom_kill"):
        role = victim.get("role")  # (the growth of children: workers with no ring, but not for a child's own kill)
        worker = role not in NOT_WORKERS or ((growth or {}).get("grew") == "children" and role != ROLE["child"])
        if worker:
            behaved = worker_memory(f, victim.get("pid"))
            if behaved:
                out["worker_memory"] = behaved
            levers += worker_levers(behaved)
            if growth and growth.get("rss_per_step_beyond_noise") and growth["rss_per_step"] > 0:
                levers.append(f"the job's own process grew too, {human_bytes(int(growth['rss_per_step']))} per "
                              f"step: {MAIN_LEVERS[0]}")  # fmt: skip
        elif growth and growth.get("rss_per_step_beyond_noise") and growth["rss_per_step"] > 0:
            levers.append(f"memory grew {human_bytes(int(growth['rss_per_step']))} per step in the job's own "
                          f"process: {MAIN_LEVERS[0]}")  # fmt: skip
        else:
            levers += MAIN_LEVERS
        if memory and memory["shmem_share"] >= 0.25:
            levers.append(SHMEM_LEVER)
        if memory and memory["file_share"] - memory["shmem_share"] >= 0.5:
            levers.append(PAGE_CACHE_LEVER)
        levers.append(LIMIT_LEVER)
    if levers:
        out["levers"] = levers
    return out
