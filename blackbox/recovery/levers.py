"""Why memory ran out and what to change: pure analysis of a dead ring's facts.

``analysis`` follows the process that grew (the job's own, or one of its
children: a DataLoader worker) and what the memory was made of at the end
(anonymous memory, page cache, shared memory), and gives the levers that fit
that process and that kind of memory, so a worker's leak gets worker levers.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .._units import human_bytes
from .facts import Facts, Rows

WORKER_LEVERS = [
    "each worker holds its own copy of every Python object the dataset touches (reference counts turn "
    "copy-on-write into copy-on-read): keep samples in numpy arrays or Arrow tables, not lists or dicts of "
    "Python objects",
    "fewer DataLoader workers (num_workers), or a smaller prefetch_factor",
    "persistent_workers=True, so workers are not re-created (and their memory re-grown) every epoch",
    "look for a cache in the Dataset that grows in every worker",
]
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


# Student's t, two-sided 95%, for 1..10 degrees of freedom; beyond, 1.96 + 2.5 / df is within 0.01
_T95 = (12.71, 4.30, 3.18, 2.78, 2.57, 2.45, 2.36, 2.31, 2.26, 2.23)


def _t95(df: float) -> float:
    return _T95[max(int(df), 1) - 1] if df < 11 else 1.96 + 2.5 / df


def trend(x: np.ndarray, y: np.ndarray) -> tuple[float, float] | None:
    """(slope, half-width of its 95% interval) of ``y`` over ``x`` by least squares, the points in time
    order; None with fewer than 3 points or one value of ``x``.

    The interval comes from the residuals, widened for their serial correlation: memory samples are
    not independent draws (a warm-up, a plateau, a cache filled once leave long runs of residuals of
    one sign), so the effective number of points is n (1 - r) / (1 + r), r the residuals' lag-1
    autocorrelation. A slope inside its interval's reach of zero is not growth but noise."""
    ok = ~np.isnan(x) & ~np.isnan(y)
    x, y = x[ok], y[ok]
    n = len(x)
    if n < 3 or np.ptp(x) <= 0:
        return None
    dx, dy = x - x.mean(), y - y.mean()
    sxx = float(dx @ dx)
    slope = float(dx @ dy) / sxx
    resid = dy - slope * dx
    sse = float(resid @ resid)
    r = min(max(float(resid[1:] @ resid[:-1]) / sse, 0.0), 0.99) if sse > 0 else 0.0
    n_eff = n * (1 - r) / (1 + r)
    if n_eff <= 2.5:  # too few independent points to tell a trend from a drift
        return slope, float("inf")
    se = (sse / (n - 2) / sxx) ** 0.5 * ((1 + r) / (1 - r)) ** 0.5
    return slope, _t95(n_eff - 2) * se


def host_growth(f: Facts) -> dict[str, Any] | None:
    """Least-squares growth of RSS per step and per second, each with its 95% interval (``_error``:
    the half-width) and whether it is beyond the noise (``_beyond_noise``: the interval excludes zero);
    the growth of the job's children, and who grew."""
    if len(f.samples) < 3:
        return None
    samples, sample_ns = f.samples, f.sample_ns
    if len(samples) > MAX_FIT_POINTS:  # evenly thinned, first and last kept: the fit barely moves
        keep = np.linspace(0, len(samples) - 1, MAX_FIT_POINTS).astype(np.int64)
        samples, sample_ns = Rows(samples.table, samples.rows[keep]), sample_ns[keep]
    rss, children, steps = (samples.floats(c) for c in ("host_rss", "children_rss", "step"))
    out: dict[str, Any] = {}
    for name, x in (("rss_per_second", sample_ns / 1e9), ("rss_per_step", steps)):
        fit = trend(x, rss)
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
        out["max_child_rss"] = max(int(s.rss.max()) for s in growers if len(s.rss))
    child_grew = max([float(out.get("children_rss_growth", 0.0))] + [float(s.growth) for s in growers])
    if okc.sum() >= 3 or growers:
        out["grew"] = "children" if child_grew > grew_job else "job"
    return out or None


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


def analysis(f: Facts, cause: str, victim_role: str | None, stat: dict[str, Any] | None) -> dict[str, Any]:
    """host_growth, memory composition at the end, and levers for a host OOM (kill or exception)."""
    out: dict[str, Any] = {}
    levers: list[str] = []
    growth = host_growth(f)
    if growth:
        out["host_growth"] = growth
    memory = composition(stat)
    if memory:
        out["memory_at_end"] = memory
    if cause in ("host_oom_kill", "userspace_oom_kill"):
        worker = victim_role not in (None, "main process") or (growth or {}).get("grew") == "children"
        if worker:
            levers += WORKER_LEVERS
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
