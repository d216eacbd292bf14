"""A timeline as a Chrome / Perfetto trace (the JSON trace-event format), as a pure function.

Open the file in https://ui.perfetto.dev or chrome://tracing. Per process: counter
tracks for host and GPU memory, a ``steps`` track of one slice per step, phase
and module slices on the thread that recorded them, instant events for
OOMs, exceptions, signals, marks and the death, and the Python stack samples (a
flame chart track per sampled thread, and the format's ``P`` sample events with
``stackFrames``; see ``views.stacks.trace_stacks``).
Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .stacks import stack_frames, trace_stacks

HOST_COUNTERS = ("host_rss", "children_rss", "cgroup_usage", "cgroup_limit")
GPU_COUNTERS = ("gpu_allocated", "gpu_reserved", "gpu_active", "device_total")
INSTANTS = ("oom", "exception", "signal", "mark")
STEPS_TID = 0


def trace_events(table: pa.Table, meta: dict[str, Any]) -> dict[str, Any]:
    """``{"traceEvents": [...], "displayTimeUnit": "ms", "otherData": {...}}`` for a timeline."""
    times = table["time"].cast(pa.int64()).to_numpy(zero_copy_only=False)
    t0 = int(times.min()) if len(times) else 0
    events: list[dict[str, Any]] = []
    frames: dict[str, dict[str, Any]] = {}  # the stack samples' frames, shared by every process
    by_pid = _ring_metas(meta.get("rings", [meta]))
    for pid in pc.unique(table["pid"]).to_pylist():
        rows = table.filter(pc.equal(table["pid"], pid)) if pid is not None else table
        events += _process(rows, pid if pid is not None else 0, t0, by_pid.get(pid, {}), frames)
    return {
        "traceEvents": events,
        "stackFrames": stack_frames(frames),
        "displayTimeUnit": "ms",
        "otherData": {"generator": "blackbox", "first_death": meta.get("first_death"), "t0_unix_ns": t0},
    }


def _ring_metas(rings: Sequence[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """What a process's track takes of its ring's metadata, by pid (the first ring of a pid), read in
    one pass (``rings`` may be a ``SpilledRings``, a JSON parse per ring)."""
    out: dict[Any, dict[str, Any]] = {}
    for m in rings:
        if m.get("pid") not in out:
            out[m.get("pid")] = {k: m.get(k) for k in ("rank", "host", "sample_interval_s", "death")}
    return out


def _us(ns: int, t0: int) -> float:
    return (ns - t0) / 1e3


def _process(
    rows: pa.Table, pid: int, t0: int, meta: dict[str, Any], frames: dict[str, dict[str, Any]]
) -> list[dict[str, Any]]:
    rank = meta.get("rank")
    name = f"rank {rank} pid {pid}" if rank is not None else f"pid {pid}"
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"{name} ({meta.get('host')})"}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank or 0}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": STEPS_TID, "args": {"name": "steps"}},
    ]
    threads: dict[int, int] = {}
    stamps = rows["time"].cast(pa.int64()).to_numpy(zero_copy_only=False).tolist()
    data = rows.drop_columns(["time"]).to_pylist()
    end = _us(stamps[-1], t0) if stamps else 0.0
    step_open: dict[str, Any] | None = None
    samples: list[tuple[float, int, str | None, str | None]] = []
    for ns, r in zip(stamps, data, strict=True):
        ts = _us(ns, t0)
        kind = r["kind"]
        if kind == "stack_sample":  # the sampled thread's stack, drawn on a track of its own below
            samples.append((ts, int(r["thread"]), r["label"], r["detail"]))
            continue
        tid = threads.setdefault(int(r["thread"]), len(threads) + 1)
        if kind == "sample":
            args = {c: r[c] for c in HOST_COUNTERS if r[c] is not None}
            if args:
                out.append({"ph": "C", "name": "host memory (bytes)", "pid": pid, "tid": 0, "ts": ts, "args": args})
        elif kind == "gpu_sample":
            args = {c: r[c] for c in GPU_COUNTERS if r[c] is not None}
            if args:
                name_ = f"cuda:{r['device']} memory (bytes)"
                out.append({"ph": "C", "name": name_, "pid": pid, "tid": 0, "ts": ts, "args": args})
        elif kind == "step":
            if step_open is not None:
                out.append(_slice(step_open, ts, pid))
            step_open = {"name": f"step {r['value']}", "ts": ts}
        elif kind in ("phase_begin", "module_begin"):
            out.append({"ph": "B", "name": r["label"] or kind, "cat": kind.split("_")[0], "pid": pid, "tid": tid,
                        "ts": ts})  # fmt: skip
        elif kind in ("phase_end", "module_end"):
            out.append({"ph": "E", "pid": pid, "tid": tid, "ts": ts})
        elif kind in INSTANTS:
            label = (r["label"] or kind)[:200]
            args = {k: r[k] for k in ("value", "detail", "step") if r[k] is not None}
            out.append({"ph": "i", "s": "t", "name": f"{kind}: {label}", "cat": kind, "pid": pid, "tid": tid,
                        "ts": ts, "args": args})  # fmt: skip
    if step_open is not None:
        out.append(_slice(step_open, end, pid))
    out += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": t, "args": {"name": f"thread {ident:#x}"}}
            for ident, t in threads.items()]  # fmt: skip
    out += _unclosed(out, pid, end)
    interval = float(meta.get("sample_interval_s") or 0.1) * 1e6
    out += trace_stacks(samples, pid, frames, len(threads) + 1, interval, end)
    death = meta.get("death") or {}
    if death.get("cause") and death.get("cause") != "clean_exit" and data:
        out.append({"ph": "i", "s": "p", "name": f"death: {death['cause']}", "cat": "death", "pid": pid,
                    "tid": STEPS_TID, "ts": end, "args": {"evidence": death.get("evidence")}})  # fmt: skip
    return out


def _slice(opened: dict[str, Any], end: float, pid: int) -> dict[str, Any]:
    return {"ph": "X", "name": opened["name"], "cat": "step", "pid": pid, "tid": STEPS_TID, "ts": opened["ts"],
            "dur": max(0.0, end - opened["ts"])}  # fmt: skip


def _unclosed(events: list[dict[str, Any]], pid: int, end: float) -> list[dict[str, Any]]:
    """E events for slices still open at the end (a process killed mid-phase), and none for stray ends."""
    depth: dict[int, int] = {}
    keep: list[dict[str, Any]] = []
    for e in events:
        if e["ph"] == "B":
            depth[e["tid"]] = depth.get(e["tid"], 0) + 1
        elif e["ph"] == "E":
            if depth.get(e["tid"], 0) == 0:
                e["ph"] = "drop"
                continue
            depth[e["tid"]] -= 1
    events[:] = [e for e in events if e["ph"] != "drop"]
    for tid, n in depth.items():
        keep += [{"ph": "E", "pid": pid, "tid": tid, "ts": end}] * n
    return keep
