"""What ``blackbox report`` draws, as plain data: pure functions of a timeline table and its metadata.

The page's script draws from this data alone (``views.report`` puts it in the page as JSON):

- ``timeline_data``: memory series per panel (the job's processes, its cgroup, its GPUs) in bytes
  against seconds since the first event, each thinned to at most ``MAX_POINTS`` points (each point
  the highest value of its span, so that no peak is lost), the limits, the steps and the deaths;
- ``stack_data``: the time-sampled Python stacks (what it was doing), each sample a time and an
  index into the distinct folded stacks, so that the page can fold the samples of any time window;
- ``allocation_data``: who holds the memory, from allocation sampling's ``allocations`` metadata
  (live bytes by allocating stack and the largest sites), where the bundle has it.

Text from rings (frame names, thread names, argv, hosts) goes into the data as it is: the page never
parses it as markup.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..recovery.alerts import ALERT_COLUMNS, alert_of
from ..recovery.kinds import of_kind, rows_of_kind
from ..recovery.timeline import py_rows
from .plot import drawn_process

MAX_POINTS = 2000  # points per series
MAX_PROCESSES = 16  # processes given lines of their own; the others are counted
MAX_STEPS = 5000
MAX_STACK_SAMPLES = 100_000  # the last ones
MAX_STACKS = 20_000  # distinct folded stacks
MAX_STACK_BYTES = 16 << 20  # their text, all together (a ring's stacks may be 64 frames of long names each)
MAX_LIVE_STACKS = 2000
SITE_FIELDS = ("site", "line", "thread", "live_bytes", "error_bytes", "growth_per_step", "growth_per_s", "first_step",
               "imports", "resident_bytes", "grows")  # fmt: skip
SAMPLE_COLUMNS = ["time", "kind", "pid", "rank", "device", "host_rss", "children_rss", "cgroup_usage", "cgroup_limit",
                  "gpu_allocated", "gpu_reserved", "device_total", "cgroup_anon", "cgroup_file"]  # fmt: skip


def ns_of(iso: Any) -> int | None:
    """UTC nanoseconds of an ISO-8601 time from metadata (``...Z``), or None."""
    if not isinstance(iso, str) or not iso:
        return None
    try:
        return int(np.datetime64(iso.rstrip("Z"), "ns").astype(np.int64))
    except ValueError:
        return None


def _seconds(times: pa.ChunkedArray | pa.Array, t0: int) -> np.ndarray:
    ns: np.ndarray = times.cast(pa.int64()).to_numpy(zero_copy_only=False)
    return (ns - t0) / 1e9


def thin(t: np.ndarray, v: np.ndarray, most: int = MAX_POINTS) -> tuple[list[float], list[float]]:
    """At most ``most`` points: of each span, its first time and its highest value."""
    if len(t) > most:
        starts = np.linspace(0, len(t), most, endpoint=False).astype(np.int64)
        t, v = t[starts], np.maximum.reduceat(v, starts)
    return [round(float(x), 4) for x in t], [float(x) for x in v]


def _series(rows: pa.Table, column: str, t0: int, name: str, panel: str, dash: str = "") -> dict[str, Any] | None:
    if column not in rows.column_names or rows.num_rows == 0:
        return None
    values = rows[column]
    keep = pc.is_valid(values)
    if not pc.any(keep).as_py():
        return None
    t = _seconds(rows["time"].filter(keep), t0)
    v = values.filter(keep).to_numpy(zero_copy_only=False).astype(float)
    ts, vs = thin(t, v)
    return {"name": name, "panel": panel, "dash": dash, "t": ts, "v": vs}


def drawn_pids(table: pa.Table, meta: dict[str, Any]) -> tuple[list[Any], int]:
    """(the processes given lines, how many there are): every one up to MAX_PROCESSES; beyond, the first
    death's and then the lowest ranks."""
    pids = [p for p in pc.unique(table["pid"]).to_pylist() if p is not None] if table.num_rows else []
    one = drawn_process(meta)
    if one is not None and one.get("pid") in pids:
        return [one["pid"]], len(pids)
    if len(pids) <= MAX_PROCESSES:
        return pids, len(pids)
    first = (meta.get("first_death") or {}).get("pid")
    ranks: dict[Any, int] = {}
    for m in meta.get("rings") or []:
        if isinstance(m.get("rank"), int):
            ranks[m.get("pid")] = m["rank"]
    order = sorted(pids, key=lambda p: (p != first, p not in ranks, ranks.get(p, 0), p))
    return order[:MAX_PROCESSES], len(pids)


def _who(rows: pa.Table, pid: Any, many: bool) -> str:
    if not many:
        return ""
    rank = rows["rank"][0].as_py() if rows.num_rows else None
    return f" rank {rank}" if rank is not None else f" pid {pid}"


def timeline_data(table: pa.Table, meta: dict[str, Any]) -> dict[str, Any]:
    """The memory timeline: series, limits, steps, deaths and OOM events, times in seconds since t0."""
    times = table["time"].cast(pa.int64())
    t0 = int(pc.min(times).as_py()) if table.num_rows else 0
    pids, total = drawn_pids(table, meta)
    rows = rows_of_kind(table, "sample", "gpu_sample", "cgroup_sample")
    samples = table.select([c for c in SAMPLE_COLUMNS if c in table.column_names]).take(rows)
    series: list[dict[str, Any]] = []
    many = len(pids) > 1
    cgroup_done = False
    limits: list[dict[str, Any]] = []
    for pid in pids:
        mine = samples.filter(pc.equal(samples["pid"], pid))
        who = _who(mine, pid, many)
        host = of_kind(mine, "sample")
        for column, dash in (("host_rss", ""), ("children_rss", "4 3")):
            s = _series(host, column, t0, f"{column}{who}", "job", dash)
            if s is not None and (column == "host_rss" or max(s["v"]) > 0):
                series.append(s)
        if not cgroup_done and host.num_rows:
            charged = of_kind(mine, "cgroup_sample")
            cgroup_lines = [
                (host, "cgroup_usage", "cgroup usage", ""),
                (charged, "cgroup_anon", "cgroup anon", "6 3"),
                (charged, "cgroup_file", "cgroup file (page cache)", "2 3"),
            ]
            for rows_of, column, name, dash in cgroup_lines:
                s = _series(rows_of, column, t0, name, "cgroup", dash)
                if s is not None:
                    series.append(s)
                    cgroup_done = True
        gpu = of_kind(mine, "gpu_sample")
        for device in sorted(d for d in pc.unique(gpu["device"]).to_pylist() if d is not None) if gpu.num_rows else []:
            d = gpu.filter(pc.equal(gpu["device"], device))
            for column, dash in (("gpu_allocated", ""), ("gpu_reserved", "4 3")):
                s = _series(d, column, t0, f"{column} cuda:{device}{who}", "gpu", dash)
                if s is not None:
                    series.append(s)
    for kind, column, name, panel in (("sample", "cgroup_limit", "cgroup limit", "cgroup"),
                                      ("gpu_sample", "device_total", "device total", "gpu")):  # fmt: skip
        if column in table.column_names:
            values = table[column].take(rows_of_kind(table, kind))
            if len(values) and values.null_count < len(values):
                limits.append({"name": name, "panel": panel, "value": float(pc.max(values).as_py())})
    end = (int(pc.max(times).as_py()) - t0) / 1e9 if table.num_rows else 0.0
    return {
        "t0": _iso(t0),
        "end": round(end, 4),
        "processes": total,
        "drawn": len(pids),
        "series": series,
        "limits": limits,
        "steps": _steps(table, pids, t0),
        "deaths": _deaths(meta, t0),
        "ooms": [round(float(x), 4) for x in _seconds(of_kind(table, "oom", columns=["time"])["time"], t0)[-200:]],
        "alerts": _alerts(table, t0),
    }


ALERT_PANEL = {"cgroup": "cgroup", "gpu": "gpu"}  # the host's and RLIMIT_AS's alerts go on the job's panel


def _alerts(table: pa.Table, t0: int) -> list[dict[str, Any]]:
    """The alerts (their forecasts' updates aside), at most 200: seconds, level, panel, the alert's line."""
    rows = of_kind(table, "alert", columns=ALERT_COLUMNS)
    keep = pc.invert(pc.equal(pc.fill_null(rows["alert_level"].cast(pa.string()), ""), "info"))
    rows = rows.filter(keep)
    t = _seconds(rows["time"], t0)
    return [{"t": round(float(at), 4), "level": r["alert_level"], "panel": ALERT_PANEL.get(r["limit_kind"], "job"),
             "text": alert_of(r).text} for at, r in zip(t[-200:], py_rows(rows.slice(max(0, rows.num_rows - 200))),
                                                        strict=True)]  # fmt: skip


def _iso(ns: int) -> str:
    return str(np.datetime64(ns, "ns")) + "Z"


def _steps(table: pa.Table, pids: list[Any], t0: int) -> list[list[float]]:
    """[seconds, step] of one process's steps (the first drawn that has any), at most MAX_STEPS."""
    steps = of_kind(table, "step", columns=["time", "value", "pid"])
    steps = steps.filter(pc.is_valid(steps["value"]))  # a step record with no number: a damaged or crafted ring's
    for pid in pids:
        mine = steps.filter(pc.equal(steps["pid"], pid))
        if mine.num_rows:
            t = _seconds(mine["time"], t0)
            n = mine["value"].to_numpy(zero_copy_only=False)
            idx = np.linspace(0, len(t) - 1, min(len(t), MAX_STEPS)).astype(np.int64)
            return [[round(float(t[i]), 4), int(n[i])] for i in idx]
    return []


def _deaths(meta: dict[str, Any], t0: int) -> list[dict[str, Any]]:
    """Every end that is not a clean exit: seconds, who, cause, whether it is the first death."""
    rings = meta.get("rings") or [meta]
    first = meta.get("first_death") if meta.get("rings") else None
    out = []
    for m in rings:
        d = m.get("death") or {}
        at = ns_of(d.get("time"))
        if at is None or d.get("cause") == "clean_exit":
            continue
        is_first = first is None or (m.get("pid") == first.get("pid") and m.get("host") == first.get("host"))
        who = f"rank {m['rank']}" if m.get("rank") is not None else f"pid {m.get('pid')}"
        out.append({"t": round((at - t0) / 1e9, 4), "who": who, "cause": str(d.get("cause")), "first": is_first})
    out.sort(key=lambda d: (not d["first"], d["t"]))
    return out[:1000]


def stack_data(table: pa.Table, pids: list[Any], t0_iso: str) -> dict[str, Any]:
    """The stack samples of the drawn processes: ``stacks`` (distinct folded stacks, outermost frame
    first; rooted at the process where there are several), ``samples`` ([seconds, index]), ``dropped``
    (the earliest samples, past MAX_STACK_SAMPLES) and ``unlisted`` (samples of stacks past MAX_STACKS
    or MAX_STACK_BYTES: counted, not drawn)."""
    t0 = ns_of(t0_iso) or 0
    rows = of_kind(table, "stack_sample", columns=["time", "detail", "pid", "rank"])
    if rows.num_rows and pids:
        rows = rows.filter(pc.is_in(rows["pid"], pa.array(pids, rows.schema.field("pid").type)))
    rows = rows.filter(pc.is_valid(rows["detail"])) if rows.num_rows else rows
    cut = max(0, rows.num_rows - MAX_STACK_SAMPLES)
    rows = rows.slice(cut)
    many = len(pids) > 1
    t = _seconds(rows["time"], t0) if rows.num_rows else np.empty(0)
    index: dict[str, int] = {}
    samples: list[list[float]] = []
    text = unlisted = 0  # the stacks' text so far; samples of stacks past the budgets
    for ti, folded, pid, rank in zip(t, rows["detail"].to_pylist(), rows["pid"].to_pylist(), rows["rank"].to_pylist(),
                                     strict=True):  # fmt: skip
        stack = f"{'rank ' + str(rank) if rank is not None else 'pid ' + str(pid)};{folded}" if many else folded
        i = index.get(stack)
        if i is None:
            if len(index) >= MAX_STACKS or text + len(stack) > MAX_STACK_BYTES:
                unlisted += 1
                continue
            text += len(stack)
            i = index[stack] = len(index)
        samples.append([round(float(ti), 4), i])
    return {"stacks": list(index), "samples": samples, "dropped": cut, "unlisted": unlisted}


def allocation_data(meta: dict[str, Any]) -> dict[str, Any] | None:
    """Who holds the memory, from the ``allocations`` metadata of allocation sampling: live bytes by
    allocating stack (rooted at the process where there are several) and the largest sites. None
    where no ring has it."""
    rings = meta.get("rings") or [meta]
    many = len(rings) > 1
    stacks: list[list[Any]] = []
    sites: list[dict[str, Any]] = []
    live = error = 0.0
    found = False
    for m in rings:
        report = m.get("allocations")
        if not isinstance(report, dict) or report.get("recorded") is False:  # not recorded: never "0 B live"
            continue
        found = True
        who = f"{m.get('role') or 'process'} pid {m.get('pid')}" + (
            f" rank {m['rank']}" if m.get("rank") is not None else "")  # fmt: skip
        live += _number(report.get("live_bytes"))
        error = (error**2 + _number(report.get("error_bytes")) ** 2) ** 0.5
        stacks += [
            [f"{who};{s['stack']}" if many else s["stack"], _number(s["live_bytes"])]
            for s in report.get("stacks") or []
            if isinstance(s, dict) and isinstance(s.get("stack"), str) and _number(s.get("live_bytes")) > 0
        ]
        sites += [
            {k: site.get(k) for k in SITE_FIELDS} | {"process": who if many else None}
            for site in report.get("sites") or []
            if isinstance(site, dict) and isinstance(site.get("site"), str)
        ]
    if not found:
        return None
    stacks.sort(key=lambda s: -s[1])
    sites.sort(key=lambda s: (bool(s.get("imports")), -_number(s.get("live_bytes"))))  # an import's memory never first
    return {"live_bytes": live, "error_bytes": error, "stacks": stacks[:MAX_LIVE_STACKS], "sites": sites[:50]}


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0
