"""The live view of a running job's ring, as a pure function of what was read.

``blackbox watch`` re-reads the ring read-only (the ring is the interface: no
IPC, no signal to the job) and prints this frame: current memory, headroom to
each limit, growth rate and time to the limit at that rate, the step and its
pace, and the latest exception or signal. A slot being written while it is read
fails the commit rule and is left out of that frame. Of a folder of rings (a
``blackbox run`` folder's rings/), the frame names the live rings it follows
and gives each one's lines.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._errors import one_line
from .._units import human_bytes
from ..collect.alerts import limit_name, plus_minus
from ..recovery.alerts import live_alerts
from ..recovery.allocs import live_sites
from ..recovery.crash import short_frame
from ..recovery.kinds import of_kind
from ..recovery.timeline import py_rows, ring_table
from ..ring.reader import Ring

WINDOW_S = 30.0


def _rate(t: np.ndarray, v: np.ndarray) -> float | None:
    """Least-squares slope (units per second) over the last WINDOW_S seconds."""
    ok = ~np.isnan(v)
    t, v = t[ok], v[ok]
    if len(t) < 3:
        return None
    keep = t >= t[-1] - WINDOW_S
    t, v = t[keep], v[keep]
    if len(t) < 3 or np.ptp(t) <= 0:
        return None
    return float(np.polyfit(t, v, 1)[0])


def _series(rows: pa.Table, column: str) -> tuple[np.ndarray, np.ndarray]:
    t = rows["time"].cast(pa.int64()).to_numpy(zero_copy_only=False) / 1e9
    return t, rows[column].to_numpy(zero_copy_only=False).astype(float)


def _headroom(name: str, used: Any, limit: Any, rate: float | None) -> str:
    if used is None or not limit:
        return f"{name}: {human_bytes(used)}" if used is not None else f"{name}: n/a"
    room = limit - used
    text = (
        f"{name}: {human_bytes(used)} of {human_bytes(limit)} ({100 * used / limit:.1f}%), headroom {human_bytes(room)}"
    )
    if rate is not None:
        text += f", {'+' if rate >= 0 else '-'}{human_bytes(int(abs(rate)))}/s"
        if rate > 0 and room > 0:
            text += f", limit in ~{room / rate:.0f} s at this rate"
    return text


def who(meta: dict[str, Any]) -> str:
    """``host pid N`` and `` rank R`` where the process has a rank (a job not started by a launcher has none)."""
    ident = meta.get("identity") or {}
    rank = ident.get("rank")
    return one_line(f"{ident.get('host')} pid {ident.get('pid')}" + ("" if rank is None else f" rank {rank}"))


def frame(ring: Ring, running: bool, now_ns: int | None = None) -> str:
    """One screen of the live view of one ring."""
    head, *rest = ring_lines(ring, running, now_ns)
    return "\n".join([f"blackbox watch  {head}", *rest]) + "\n"


def job_frame(shown: list[tuple[Ring, bool]], where: str, live: int, total: int, now_ns: int | None = None) -> str:
    """One screen of the live view of a folder of rings: which rings it follows, then each one's lines."""
    if live:
        head = f"following {_count(live, 'live ring')} (of {total})"
        if live > len(shown):
            head += f", {len(shown)} shown here (blackbox watch RING for another)"
    else:
        head = f"no live ring (of {total}); the {_count(len(shown), 'ring')} written last"
    lines = [f"blackbox watch  {where}: {head}"]
    for ring, running in shown:
        first, *rest = ring_lines(ring, running, now_ns)
        lines += ["", f"== {ring.path.name}", first, *rest]
    return "\n".join(lines) + "\n"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _holders(ring: Ring, last_step: int | None, end_ns: int | None, top: int = 3) -> dict[str, Any] | None:
    """Who holds the memory now (allocations sampled): the totals and the largest sites, with their error
    and growth; None where allocations are not sampled or nothing sampled is live."""
    report = live_sites(ring.heap, ring.stacks, ring.meta, last_step, end_ns)
    if not report or not report["sites"]:
        return None
    keep = ("site", "thread", "live_bytes", "error_bytes", "growth_per_s")
    return {"live_bytes": report["live_bytes"], "error_bytes": report["error_bytes"],
            "sites": [{k: site[k] for k in keep} for site in report["sites"][:top]]}  # fmt: skip


def ring_state(ring: Ring, running: bool, now_ns: int | None = None) -> dict[str, Any]:
    """What the live view says of one ring, as data (``blackbox watch --json``): who and its state,
    events, step and pace, memory and its growth per second, each GPU, who holds the memory (allocations
    sampled), the last event. Bytes, seconds."""
    table = ring_table(ring)
    now = now_ns if now_ns is not None else time.time_ns()
    times = table["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    ident = ring.meta.get("identity") or {}
    state: dict[str, Any] = {
        "ring": str(ring.path),
        "host": ident.get("host"),
        "pid": ident.get("pid"),
        "rank": ident.get("rank"),
        "state": "running" if running else ("ended cleanly" if ring.clean else "ended without a clean end"),
        "events": ring.recovery.valid,
        "last_seq": ring.recovery.last_seq,
        "last_event_age_s": (now - int(times[-1])) / 1e9 if len(times) else None,
        "step": None,
        "steps_per_s": None,
        "memory": None,
        "gpus": [],
        "holders": None,
        "alerts": None,
        "last_event": None,
    }
    steps = of_kind(table, "step", columns=["time", "value"])
    steps = steps.filter(pc.is_valid(steps["value"]))  # a step record with no number: a damaged or crafted ring's
    if steps.num_rows:
        t, v = _series(steps, "value")
        state["step"], state["steps_per_s"] = int(v[-1]), _rate(t, v)
    samples = of_kind(table, "sample", columns=["time", "host_rss", "children_rss", "cgroup_usage", "cgroup_limit",
                                                "mem_available"])  # fmt: skip
    if samples.num_rows:
        last = py_rows(samples.slice(samples.num_rows - 1))[0]
        state["memory"] = {k: last[k] for k in ("host_rss", "children_rss", "mem_available", "cgroup_usage",
                                                "cgroup_limit")}  # fmt: skip
        state["memory"]["host_rss_per_s"] = _rate(*_series(samples, "host_rss"))
        state["memory"]["cgroup_usage_per_s"] = _rate(*_series(samples, "cgroup_usage"))
    gpus = of_kind(table, "gpu_sample", columns=["time", "device", "gpu_allocated", "gpu_reserved", "device_total",
                                                 "device_free"])  # fmt: skip
    for device in sorted({d for d in gpus["device"].to_pylist() if d is not None}):
        rows = gpus.filter(pc.equal(gpus["device"], device))
        last = py_rows(rows.slice(rows.num_rows - 1))[0]
        state["gpus"].append({
            "device": device,
            "allocated": last["gpu_allocated"],
            "reserved": last["gpu_reserved"],
            "total": last["device_total"],
            "reserved_per_s": _rate(*_series(rows, "gpu_reserved")),
        })  # fmt: skip
    state["holders"] = _holders(ring, state["step"], int(times[-1]) if len(times) else None)
    state["alerts"] = live_alerts(table, now)
    events = of_kind(table, "oom", "exception", "signal", columns=["time", "kind", "label"])
    if events.num_rows:
        e = py_rows(events.slice(events.num_rows - 1))[0]
        state["last_event"] = {"kind": e["kind"], "label": e["label"]}
    return state


def ring_lines(ring: Ring, running: bool, now_ns: int | None = None) -> list[str]:
    """The live view's lines for one ring: who and its state, events, step, memory, GPUs, last event."""
    s = ring_state(ring, running, now_ns)
    age = s["last_event_age_s"]
    shown = "ENDED without a clean end" if s["state"] == "ended without a clean end" else s["state"]
    lines = [
        f"{who(ring.meta)}  [{shown}]",
        f"events {s['events']:,} (seq {s['last_seq']}), last event "
        + (f"{age:.1f} s ago" if age is not None else "none"),
    ]
    if s["step"] is not None:
        pace = s["steps_per_s"]
        lines.append(f"step {s['step']}" + (f", {pace:.2f} steps/s" if pace else ""))
    m = s["memory"]
    if m is not None:
        rss_rate = m["host_rss_per_s"]
        lines.append(
            f"host RSS {human_bytes(m['host_rss'])}"
            + (f" (+{human_bytes(int(rss_rate))}/s)" if rss_rate and rss_rate > 0 else "")
            + f", workers {human_bytes(m['children_rss'])}, MemAvailable {human_bytes(m['mem_available'])}"
        )
        lines.append(_headroom("cgroup", m["cgroup_usage"], m["cgroup_limit"], m["cgroup_usage_per_s"]))
    lines += [
        f"cuda:{g['device']} allocated {human_bytes(g['allocated'])}; "
        + _headroom("reserved", g["reserved"], g["total"], g["reserved_per_s"])
        for g in s["gpus"]
    ]
    held = s["holders"]
    if held is not None:
        lines.append(f"who holds the memory: {human_bytes(held['live_bytes'])} ± {human_bytes(held['error_bytes'])} "
                     "sampled")  # fmt: skip
        for site in held["sites"]:
            growth = site["growth_per_s"]
            lines.append(f"  {human_bytes(site['live_bytes'])} ± {human_bytes(site['error_bytes'])} "
                         f"{one_line(short_frame(site['site']))} [{one_line(site['thread'])}]"
                         + (f" +{human_bytes(growth)}/s" if growth and growth > 0 else ""))  # fmt: skip
    lines += _alert_lines(s["alerts"])
    e = s["last_event"]
    if e is not None:
        lines.append(f"last {e['kind']}: {one_line((e['label'] or '')[:160])}")
    return lines


def _alert_lines(alerts: dict[str, Any] | None) -> list[str]:
    """The live view's alerts: the latest forecast, the last alerts with their age, the alert signal."""
    if not alerts:
        return []
    out = []
    f = alerts["forecast"]
    if f is not None and f["forecast_s"] is not None:
        steps = plus_minus(f["forecast_steps"], f["forecast_steps_error"]) if f["forecast_steps"] is not None else None
        left = plus_minus(f["forecast_s"], f["forecast_error_s"])
        out.append(f"forecast: {limit_name(f['limit_kind'], f['device'])} in {left} s"
                   + (f" ({steps} steps)" if steps else "")
                   + f" at {human_bytes(int(f['growth_per_s'] or 0))}/s ({f['age_s']:.0f} s ago)")
    out.append(f"alerts: {alerts['count']}")
    out += [f"  {a['level'].upper()} {one_line(a['text'])} ({a['age_s']:.0f} s ago)" for a in alerts["last"]]
    sig = alerts["signal"]
    if sig is not None:
        if sig["sent"]:
            ran = (sig.get("handler") or {}).get("ran", "not seen")
            out.append(f"  sent {sig['signal']} at step {sig['step']} ({sig['alert']}); the job's handler: {ran}")
        else:
            out.append(f"  alert signal not sent: {one_line(sig['why'])}")
    return out
