"""The memory picture: host and GPU memory over time, limits, steps and the death marked.

``memory_figure`` is a pure function of a timeline table and its metadata that
returns a matplotlib Figure (matplotlib is an optional extra: ``pip install
blackbox-recorder[plot]``); saving it is the caller's job.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._errors import BlackboxError, one_line
from ..recovery.timeline import of_kind, rows_of_kind

MAX_POINTS = 5000
MAX_MARKS = 200
MAX_SAMPLE_ROWS = 20 * MAX_POINTS
SAMPLE_COLUMNS = ["time", "kind", "pid", "rank", "device", "host_rss", "children_rss", "cgroup_usage",
                  "cgroup_limit", "gpu_allocated", "gpu_reserved", "device_total"]  # fmt: skip
GiB = float(1 << 30)
# What memory_figure reads of a timeline: a bundle writer reads back only these rows and columns.
PLOT_KINDS = ["sample", "gpu_sample", "step", "oom"]
PLOT_COLUMNS = [*SAMPLE_COLUMNS, "value", "step", "host"]


class PlotUnavailableError(BlackboxError):
    """matplotlib is not installed."""


def _figure_class() -> Any:
    """matplotlib's Figure, used without pyplot: no global figure registry, no GUI backend."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailableError(
            "expected matplotlib for plots (pip install 'blackbox-recorder[plot]'), found it is not installed"
        ) from None
    return Figure


def _series(rows: pa.Table, column: str, t0: float) -> tuple[np.ndarray, np.ndarray]:
    """(seconds since t0, GiB) of the non-null values, thinned to at most MAX_POINTS."""
    values = rows[column]
    keep = pc.is_valid(values)
    t = rows["time"].filter(keep).cast(pa.int64()).to_numpy(zero_copy_only=False) / 1e9 - t0
    v = values.filter(keep).to_numpy(zero_copy_only=False) / GiB
    if len(t) > MAX_POINTS:
        idx = np.linspace(0, len(t) - 1, MAX_POINTS).astype(int)
        t, v = t[idx], v[idx]
    return t, v


def memory_figure(table: pa.Table, meta: dict[str, Any]) -> Any:
    """Two panels (host, GPU) of memory against time, for every process in the timeline."""
    fig = _figure_class()(figsize=(11, 7))
    host_ax, gpu_ax = fig.subplots(2, 1, sharex=True)
    times = table["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    t0 = float(times.min()) / 1e9 if len(times) else 0.0
    pids = pc.unique(table["pid"]).to_pylist()
    many = len(pids) > 1
    cgroup_drawn = False
    rows = rows_of_kind(table, "sample", "gpu_sample")
    if len(rows) > MAX_SAMPLE_ROWS:  # a ring of samples: thin them before taking (a few per pixel are left)
        rows = rows[np.linspace(0, len(rows) - 1, MAX_SAMPLE_ROWS).astype(np.int64)]
    samples = table.select(SAMPLE_COLUMNS).take(rows)
    for pid in pids:
        rows = samples.filter(pc.equal(samples["pid"], pid)) if pid is not None and many else samples
        rank = rows["rank"][0].as_py() if rows.num_rows else None
        who = f" rank {rank}" if many and rank is not None else (f" pid {pid}" if many else "")
        host = of_kind(rows, "sample")
        for column, style in (("host_rss", "-"), ("children_rss", ":"), ("cgroup_usage", "--")):
            t, v = _series(host, column, t0)
            if column == "cgroup_usage" and (cgroup_drawn or len(t) == 0):
                continue  # processes of one job share a cgroup: draw its usage once
            if len(t) and (column != "children_rss" or v.max() > 0):
                host_ax.plot(t, v, style, label="cgroup_usage" if column == "cgroup_usage" else f"{column}{who}")
                cgroup_drawn |= column == "cgroup_usage"
        gpu = of_kind(rows, "gpu_sample")
        for device in pc.unique(gpu["device"]).to_pylist() if gpu.num_rows else []:
            d = gpu.filter(pc.equal(gpu["device"], device))
            for column, style in (("gpu_allocated", "-"), ("gpu_reserved", "--")):
                t, v = _series(d, column, t0)
                if len(t):
                    gpu_ax.plot(t, v, style, label=f"{column} cuda:{device}{who}")
    _limits(host_ax, table, "sample", "cgroup_limit", "cgroup limit")
    _limits(gpu_ax, table, "gpu_sample", "device_total", "device total")
    _steps(host_ax, table, t0)
    _deaths(fig, (host_ax, gpu_ax), table, meta, t0)
    host_ax.set_ylabel("host memory (GiB)")
    gpu_ax.set_ylabel("GPU memory (GiB)")
    gpu_ax.set_xlabel("seconds since the first event")
    if not gpu_ax.get_legend_handles_labels()[1]:
        gpu_ax.text(0.5, 0.5, "no GPU samples", ha="center", va="center", transform=gpu_ax.transAxes, color="grey")
    for ax in (host_ax, gpu_ax):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[1]:
            ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(_clip(one_line(_title(meta)), 120))  # a ring names its host: matplotlib lays out every character
    fig.tight_layout()
    return fig


def _limits(ax: Any, table: pa.Table, kind: str, column: str, label: str) -> None:
    """The highest ``column`` of the ``kind`` rows (all of them, not the thinned ones), as a line."""
    values = table[column].take(rows_of_kind(table, kind))
    if len(values) == 0 or values.null_count == len(values):
        return
    limit = pc.max(values).as_py() / GiB
    ax.axhline(limit, color="red", linewidth=1, alpha=0.6, label=f"{label} {limit:.2f} GiB")
    ax.set_ylim(0, max(ax.get_ylim()[1], limit * 1.08))


def _steps(ax: Any, table: pa.Table, t0: float) -> None:
    """Step numbers along the top of the host panel: one process's steps, labels at least 8% apart."""
    steps = of_kind(table, "step", columns=["time", "value", "pid"])
    if steps.num_rows == 0:
        return
    steps = steps.filter(pc.equal(steps["pid"], steps["pid"][0]))
    t = steps["time"].cast(pa.int64()).to_numpy(zero_copy_only=False) / 1e9 - t0
    n = steps["value"].to_numpy(zero_copy_only=False)
    lo, hi = ax.get_xlim()
    gap = 0.08 * (hi - lo)
    ticks: list[float] = []
    labels: list[str] = []
    for ti, k in zip(t, n, strict=True):
        if not ticks or ti - ticks[-1] >= gap:
            ticks.append(float(ti))
            labels.append(str(int(k)))
    top = ax.secondary_xaxis("top")
    top.set_xticks(ticks, labels)
    top.set_xlabel("step")


def _deaths(fig: Any, axes: tuple[Any, ...], table: pa.Table, meta: dict[str, Any], t0: float) -> None:
    """A line at every death: the first death's marked and named, the others' faint, all of them in one
    collection per panel (a job of thousands of ranks is thousands of lines, not thousands of artists)."""
    rings = meta.get("rings", [meta])
    first = meta.get("first_death") if meta.get("rings") else None
    others: list[float] = []
    for m in rings:
        d = m.get("death")
        if not d or not d.get("time") or d.get("cause") == "clean_exit":
            continue
        at = np.datetime64(d["time"].rstrip("Z"), "ns").astype(np.int64) / 1e9 - t0
        is_first = first is None or (m.get("pid") == first.get("pid") and m.get("host") == first.get("host"))
        if not is_first:
            others.append(at)
            continue
        for ax in axes:
            ax.axvline(at, color="black", linewidth=1.5)
        who = f"rank {m.get('rank')} " if meta.get("rings") else ""
        axes[0].annotate(
            f"{who}{d['cause']}",
            (at, 0.98),
            xycoords=("data", "axes fraction"),
            va="top",
            ha="right",
            fontsize=9,
            bbox={"boxstyle": "round", "fc": "white", "alpha": 0.8},
        )
    from matplotlib.collections import LineCollection

    for ax in axes if others else ():  # like axvline: spans the panel's height, widens only its time axis
        segments = [[(x, 0.0), (x, 1.0)] for x in others]
        ax.add_collection(LineCollection(segments, transform=ax.get_xaxis_transform(), colors="black",
                                         linewidths=0.6, alpha=0.4), autolim=False)  # fmt: skip
        ax.update_datalim([(x, np.nan) for x in (min(others), max(others))], updatey=False)
        ax.autoscale_view(scaley=False)
    ooms = of_kind(table, "oom", columns=["time"])["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    for ns in ooms[-MAX_MARKS:].tolist():  # the last ones: a line per event, and a ring may hold a million
        at = ns / 1e9 - t0
        for ax in axes:
            ax.axvline(at, color="red", linestyle=":", linewidth=1)


def _title(meta: dict[str, Any]) -> str:
    if meta.get("rings"):
        first = meta.get("first_death") or {}
        tail = f"; first death rank {first.get('rank')} ({first.get('cause')})" if first else ""
        return f"blackbox: {len(meta['rings'])} processes{tail}"
    d = meta.get("death") or {}
    rank = "-" if meta.get("rank") is None else meta["rank"]
    return f"blackbox: {meta.get('host')} pid {meta.get('pid')} rank {rank}: {d.get('cause', '?')}"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"
