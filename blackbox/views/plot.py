"""The memory picture: did memory grow, and what killed the job.

``memory_figure`` is a pure function of a timeline table and its metadata that
returns a matplotlib Figure (matplotlib is optional: ``pip install matplotlib``,
or the ``plot`` extra); saving it is the caller's job.

Panels, one time axis:

- the job's own memory (each process's RSS and its workers'), on an axis scaled
  to it, so that a leak of a tenth of a GiB is a visible slope;
- the memory cgroup (its usage, the anonymous and file pages charged to it, its
  limit): drawn in the first panel where its figures are within ``FIT`` times the
  job's, else in a panel of its own below. A container's usage is mostly page
  cache, often ten times the job's RSS; on one axis it flattens the job's lines;
- GPU memory per device, only where the job has GPU samples.

Each line's legend entry says where it started and ended. Where a process's RSS
is drawn above a cgroup limit that the cgroup's usage is below, a note under the
panels says why (RSS counts pages the cgroup was not charged for).
"""

from __future__ import annotations

import os
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._errors import BlackboxError, one_line
from .._units import human_bytes
from ..recovery.kinds import of_kind, rows_of_kind

MAX_POINTS = 5000
MAX_MARKS = 200
MAX_SAMPLE_ROWS = 20 * MAX_POINTS
MAX_LEGEND = 12  # entries a panel's legend names (a job of many processes draws a line or two each)
SAMPLE_COLUMNS = ["time", "kind", "pid", "rank", "device", "host_rss", "children_rss", "cgroup_usage",
                  "cgroup_limit", "gpu_allocated", "gpu_reserved", "device_total", "cgroup_anon",
                  "cgroup_file"]  # fmt: skip
GiB = float(1 << 30)
FIT = 1.5  # the cgroup (or a device's total) shares the job's axis when within this many times the job's peak
HEADROOM = 1.12  # the axis above its highest line
# What memory_figure reads of a timeline: a bundle writer reads back only these rows and columns.
PLOT_KINDS = ["sample", "gpu_sample", "cgroup_sample", "step", "oom"]
PLOT_COLUMNS = [*SAMPLE_COLUMNS, "value", "step", "host"]
PANEL_HEIGHTS = {"job": 3.0, "cgroup": 1.6, "gpu": 2.2}  # inches
PLOT_ALL_UP_TO = 32  # processes drawn together; beyond, one: the first death, else the lowest rank


class PlotUnavailableError(BlackboxError):
    """matplotlib is not installed."""


@dataclass
class _Line:
    """One series to draw: seconds since the first event, GiB."""

    t: np.ndarray
    v: np.ndarray
    style: str
    label: str
    color: str | None = None  # None: the next of the cycle (the job's own lines); the cgroup's are grey

    @property
    def peak(self) -> float:
        return float(self.v.max())


def drawn_process(meta: dict[str, Any]) -> dict[str, Any] | None:
    """Of a job of more than PLOT_ALL_UP_TO processes, the one drawn (its ``pid`` and ``host``): the
    first death, else the lowest rank. None where every process is drawn."""
    rings = meta.get("rings") or []
    if len(rings) <= PLOT_ALL_UP_TO:
        return None
    first: dict[str, Any] | None = meta.get("first_death")
    return first or min(rings, key=lambda m: (m.get("rank") is None, m.get("rank") or 0))


def figure_class() -> Any:
    """matplotlib's Figure, used without pyplot: no global figure registry, no GUI backend. A backend named in
    ``MPLBACKEND`` is never used, so it is not read: where it names one this Python lacks (a shell a Jupyter
    kernel started: ``module://matplotlib_inline.backend_inline``), importing matplotlib raised ValueError."""
    backend = os.environ.pop("MPLBACKEND", None) if "matplotlib" not in sys.modules else None
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailableError(
            "expected matplotlib for plots (pip install matplotlib), found it is not installed"
        ) from None
    finally:
        if backend is not None:
            os.environ["MPLBACKEND"] = backend
    return Figure


def _series(rows: pa.Table, column: str, t0: float) -> tuple[np.ndarray, np.ndarray]:
    """(seconds since t0, GiB) of the non-null values, thinned to at most MAX_POINTS."""
    if column not in rows.column_names:  # a bundle of an older version
        return np.empty(0), np.empty(0)
    values = rows[column]
    keep = pc.is_valid(values)
    t = rows["time"].filter(keep).cast(pa.int64()).to_numpy(zero_copy_only=False) / 1e9 - t0
    v = values.filter(keep).to_numpy(zero_copy_only=False) / GiB
    if len(t) > MAX_POINTS:
        idx = np.linspace(0, len(t) - 1, MAX_POINTS).astype(int)
        t, v = t[idx], v[idx]
    return t, v


def _line(rows: pa.Table, column: str, t0: float, style: str, name: str, color: str | None = None) -> _Line | None:
    """The series with its legend entry: where it started and ended (and its peak, where higher)."""
    t, v = _series(rows, column, t0)
    if len(t) == 0:
        return None
    first, last, peak = (human_bytes(int(x * GiB)) for x in (v[0], v[-1], v.max()))
    higher = v.max() > 1.05 * max(v[0], v[-1])
    return _Line(t, v, style, f"{name} {first} \u2192 {last}" + (f" (peak {peak})" if higher else ""), color)


def memory_figure(table: pa.Table, meta: dict[str, Any]) -> Any:
    """The job's memory, its cgroup and its GPUs against time, for every process in the timeline."""
    times = table["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    t0 = float(times.min()) / 1e9 if len(times) else 0.0
    rows = rows_of_kind(table, "sample", "gpu_sample", "cgroup_sample")
    if len(rows) > MAX_SAMPLE_ROWS:  # a ring of samples: thin them before taking (a few per pixel are left)
        rows = rows[np.linspace(0, len(rows) - 1, MAX_SAMPLE_ROWS).astype(np.int64)]
    samples = table.select([c for c in SAMPLE_COLUMNS if c in table.column_names]).take(rows)
    job, cgroup, gpu = _lines(samples, pc.unique(table["pid"]).to_pylist(), t0)
    limit = _highest(table, "sample", "cgroup_limit")
    total = _highest(table, "gpu_sample", "device_total")
    job_peak = max((line.peak for line in job), default=0.0)
    cgroup_peak = max([line.peak for line in cgroup] + [limit or 0.0])
    together = not job or cgroup_peak <= FIT * job_peak
    panels = ["job"] + (["cgroup"] if cgroup_peak > 0 and not together else []) + (["gpu"] if gpu else [])
    notes = _notes(samples, len(pc.unique(table["pid"])) > 1, t0)
    heights = [PANEL_HEIGHTS[p] for p in panels]
    fig = figure_class()(figsize=(13, 1.2 + sum(heights) + 0.35 * len(notes)))
    axes = list(fig.subplots(len(panels), 1, sharex=True, squeeze=False, height_ratios=heights)[:, 0])
    job_ax = axes[0]
    _draw(job_ax, job + (cgroup if together else []), limit if together else None, "cgroup limit")
    job_ax.set_ylabel("job's memory (GiB)" if together or not cgroup_peak else "job's processes (GiB)")
    if "cgroup" in panels:
        cgroup_ax = axes[panels.index("cgroup")]
        _draw(cgroup_ax, cgroup, limit, "cgroup limit")
        if limit is None:
            cgroup_ax.plot([], [], " ", label="no cgroup limit recorded")
        cgroup_ax.set_ylabel("cgroup (GiB)")
    if gpu:
        gpu_ax = axes[panels.index("gpu")]
        gpu_peak = max(line.peak for line in gpu)
        _draw(gpu_ax, gpu, total if total and total <= FIT * gpu_peak else None, "device total")
        if total and total > FIT * gpu_peak:  # named, not drawn: 80 GiB would flatten a job's 3 GiB
            gpu_ax.plot([], [], color="red", linewidth=1, alpha=0.6, label=f"device total {total:.1f} GiB (above)")
        gpu_ax.set_ylabel("GPU memory (GiB)")
    _steps(job_ax, table, t0)
    _deaths(fig, tuple(axes), table, meta, t0)
    axes[-1].set_xlabel("seconds since the first event")
    for ax in axes:
        ax.grid(alpha=0.3)
        _legend(ax)
    fig.suptitle(_clip(one_line(_title(meta)), 120))  # a ring names its host: matplotlib lays out every character
    bottom = 0.0
    if notes:
        text = "\n".join(textwrap.fill(n, 150) for n in notes)
        note = fig.text(0.01, 0.01, text, fontsize=8, va="bottom", ha="left", wrap=False)
        note.set_gid("note")
        bottom = (0.2 + 0.15 * text.count("\n")) / fig.get_figheight()
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


def _lines(samples: pa.Table, pids: list[Any], t0: float) -> tuple[list[_Line], list[_Line], list[_Line]]:
    """(the job's processes, the cgroup, the GPUs): the cgroup once, from the first process that read
    it (the processes of a job share one)."""
    many = len(pids) > 1
    job: list[_Line] = []
    cgroup: list[_Line] = []
    gpu: list[_Line] = []
    for pid in pids:
        rows = samples.filter(pc.equal(samples["pid"], pid)) if pid is not None and many else samples
        rank = rows["rank"][0].as_py() if rows.num_rows else None
        who = f" rank {rank}" if many and rank is not None else (f" pid {pid}" if many else "")
        host = of_kind(rows, "sample")
        for column, style in (("host_rss", "-"), ("children_rss", ":")):
            line = _line(host, column, t0, style, f"{column}{who}")
            if line is not None and (column == "host_rss" or line.peak > 0):
                job.append(line)
        if not cgroup:
            charged = of_kind(rows, "cgroup_sample")
            cgroup = [line for line in (_line(host, "cgroup_usage", t0, "--", "cgroup usage", "dimgray"),
                                        _line(charged, "cgroup_anon", t0, "-.", "cgroup anon", "gray"),
                                        _line(charged, "cgroup_file", t0, ":", "cgroup file (page cache)", "gray"))
                      if line is not None]  # fmt: skip
        on_gpu = of_kind(rows, "gpu_sample")
        for device in pc.unique(on_gpu["device"]).to_pylist() if on_gpu.num_rows else []:
            d = on_gpu.filter(pc.equal(on_gpu["device"], device))
            for column, style in (("gpu_allocated", "-"), ("gpu_reserved", "--")):
                line = _line(d, column, t0, style, f"{column} cuda:{device}{who}")
                if line is not None:
                    gpu.append(line)
    return job, cgroup, gpu


def _legend(ax: Any) -> None:
    """Beside the panel (it hides no line), at most MAX_LEGEND entries: the limits, then the lines in order."""
    handles, labels = ax.get_legend_handles_labels()
    if not labels:
        return
    if len(labels) > MAX_LEGEND:
        limits = [i for i, label in enumerate(labels) if " limit" in label or "device total" in label]
        keep = sorted(set(limits) | set(range(MAX_LEGEND - len(limits) - 1)))
        handles = [handles[i] for i in keep] + [ax.plot([], [], " ")[0]]
        labels = [labels[i] for i in keep] + [f"\u2026 and {len(labels) - len(keep)} more lines"]
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)


def _draw(ax: Any, lines: list[_Line], limit: float | None, name: str) -> None:
    """``lines`` and the limit on an axis from 0 to just above the highest of them."""
    for line in lines:
        ax.plot(line.t, line.v, line.style, label=line.label, color=line.color)
    if limit:
        ax.axhline(limit, color="red", linewidth=1, alpha=0.6, label=f"{name} {limit:.2f} GiB")
    top = max([line.peak for line in lines] + [limit or 0.0])
    if top > 0:
        ax.set_ylim(0, top * HEADROOM)


def _highest(table: pa.Table, kind: str, column: str) -> float | None:
    """The highest ``column`` of the ``kind`` rows (all of them, not the thinned ones), in GiB."""
    if column not in table.column_names:
        return None
    values = table[column].take(rows_of_kind(table, kind))
    if len(values) == 0 or values.null_count == len(values):
        return None
    return float(pc.max(values).as_py()) / GiB


def _notes(samples: pa.Table, many: bool, t0: float) -> list[str]:
    """What the picture would otherwise leave a reader to puzzle over: a process's RSS drawn above a
    cgroup limit that the cgroup's usage is below."""
    host = of_kind(samples, "sample")
    if host.num_rows == 0 or "cgroup_limit" not in host.column_names:
        return []
    rss, usage, limit = (host[c].to_numpy(zero_copy_only=False).astype(float) for c in
                         ("host_rss", "cgroup_usage", "cgroup_limit"))  # fmt: skip
    above = np.flatnonzero((rss > limit) & (usage <= limit))  # NaN (not measured) compares False
    if len(above) == 0:
        return []
    at = int(above[np.argmax(rss[above] - limit[above])])
    when = host["time"].cast(pa.int64())[at].as_py() / 1e9 - t0
    pid = host["pid"][at].as_py()
    who = f" of pid {pid}" if many else ""
    figures = ", ".join(f"{name} {human_bytes(int(x[at]))}" for name, x in (("RSS", rss), ("cgroup usage", usage),
                                                                            ("limit", limit)))  # fmt: skip
    return [
        f"Why host_rss{who} is drawn above the cgroup limit while the cgroup's usage is not (at {when:.1f} s: "
        f"{figures}): RSS counts every page the process maps, shared libraries, mapped files and shared memory "
        "included, even those the kernel charged to another cgroup (the one that first read them); the limit "
        "bounds only what is charged to this cgroup, its usage, and the OOM killer acts when that usage "
        "reaches it. Where the limit is a parent cgroup's, the parent's other members count against it too."
    ]


def _steps(ax: Any, table: pa.Table, t0: float) -> None:
    """Step numbers along the top of the host panel: one process's steps, labels at least 8% apart."""
    steps = of_kind(table, "step", columns=["time", "value", "pid"])
    if steps.num_rows == 0:
        return
    steps = steps.filter(pc.and_kleene(pc.equal(steps["pid"], steps["pid"][0]), pc.is_valid(steps["value"])))
    if steps.num_rows == 0:  # (a step record with no number: a damaged or crafted ring's)
        return
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
        who = f"{_who(m).strip()} " if meta.get("rings") else ""
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
        tail = f"; first death{_who(first)} ({first.get('cause')})" if first else ""
        return f"blackbox: {len(meta['rings'])} processes{tail}"
    d = meta.get("death") or {}
    return f"blackbox: {meta.get('host')} pid {meta.get('pid')}{_rank(meta)}: {d.get('cause', '?')}"


def _rank(m: dict[str, Any]) -> str:
    """`` rank N``, or nothing for a process that has no rank (a job not started by a launcher)."""
    return "" if m.get("rank") is None else f" rank {m['rank']}"


def _who(m: dict[str, Any]) -> str:
    return _rank(m) or f" pid {m.get('pid')}"


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"
