"""metadata.json for a bundle: pure assembly of what the recovery pass found.

Nothing here looks at the machine or decides the cause: the evidence was
gathered (``evidence``) and the death diagnosed (``diagnosis``) before.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from .._times import epoch_ns
from .._version import __version__
from ..ring import format as fmt
from ..ring.reader import Ring, without_c_extension
from ..ring.writer import NO_C_EXTENSION
from .alerts import alerts_report, with_alert_evidence
from .alloc_levers import coverage, with_site_lever
from .allocs import live_sites, main_thread_of, step_records
from .attempts import SLIM_DEATH, attempt_metadata, group_attempts, slim
from .crash import crash_reading, shutdown_signal
from .evidence import Evidence
from .family import RECENT_STEPS, extra, retell
from .hang import as_decided, snapshot_death
from .headline import still_running
from .kinds import last_of_kind, of_kind, rows_of_kind
from .spill import SpilledRings
from .stacks import stack_report
from .stuck_rank import ranked
from .timeline import BYTE_GAUGES, GAUGES, OOM_COLUMNS, py_rows, stamps_ns


def iso(ns: int | None) -> str | None:
    """UTC ISO-8601 with microseconds, or None."""
    if ns is None:
        return None
    dt = datetime.fromtimestamp(ns // 1000 / 1e6, tz=timezone.utc)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def writer_state(ring: Ring, alive: bool | None) -> str:
    """``clean``, ``running`` (``alive``: the writer is a live process) or ``ended without a clean end``."""
    if ring.clean or ring.header.state == fmt.STATE_CLEAN:
        return "clean"
    return "running" if alive else "ended without a clean end"


def _last_row(table: pa.Table, kind: str) -> dict[str, Any] | None:
    rows = last_of_kind(table, kind, columns=["time", "step", "device", *GAUGES], n=1)
    return py_rows(rows)[0] if rows.num_rows else None


def _last_sample(table: pa.Table) -> dict[str, Any] | None:
    """The last host sample's gauges, with the last GPU sample's (any device) merged in."""
    row = _last_row(table, "sample")
    if row is None:
        return None
    out = {g: row[g] for g in GAUGES}
    gpu = _last_row(table, "gpu_sample")
    if gpu is not None:
        out.update({g: gpu[g] for g in GAUGES if gpu[g] is not None})
        out["gpu_device"] = gpu["device"]
    out["time"] = row["time"]
    out["step"] = row["step"]
    return out


def _first_anon(table: pa.Table) -> int | None:
    """The process's anonymous resident memory at its first sample (as blackbox armed)."""
    rows = of_kind(table, "sample", columns=["host_anon"])
    values = rows["host_anon"].drop_null() if rows.num_rows else None
    return int(values[0].as_py()) if values is not None and len(values) else None


OFF = "allocation sampling was off (arm(allocations=False), BLACKBOX_ALLOCATIONS=0 or blackbox run --no-allocations)"


RAISED = re.compile(r"allocations: sampling interval raised to (\d+) bytes")  # the tick's note (collect/allocs.py)
UNSAMPLED = "allocations not sampled"  # the recorder's note where the hooks could not go in (collect/allocs.py)


def not_recorded(ring: Ring, unsampled: list[str]) -> dict[str, Any] | None:
    """``allocations`` of a ring where nothing was sampled: ``recorded`` false and ``why`` (the recorder's
    note, else sampling turned off); None for a ring older than allocation sampling (before version 4)."""
    if ring.header.version < 4:
        return None
    return {"recorded": False, "why": unsampled[0] if unsampled else OFF}


def _peaks(table: pa.Table) -> dict[str, Any]:
    out: dict[str, Any] = {}
    times = stamps_ns(table["time"])
    for g in BYTE_GAUGES:
        col = table[g]
        if col.null_count == len(col):
            continue
        peak = pc.max(col)  # its first row, as argmax would; no copy of the column with its nulls filled in
        i = int(pc.index(col, peak).as_py())
        out[g] = {"bytes": int(peak.as_py()), "time": iso(int(times[i]))}
    return out


def _events(table: pa.Table, kinds: tuple[str, ...], columns: tuple[str, ...], last: int) -> list[dict[str, Any]]:
    """The last ``last`` events of these kinds, as plain dicts (time in ISO UTC)."""
    rows = py_rows(last_of_kind(table, *kinds, columns=["time", "kind", "step", *columns], n=last))
    for r in rows:
        for c in [c for c in r if c.startswith("oom_") and r[c] is None]:
            del r[c]
    return rows


MAX_MODULE_DEPTH = 256
_EXC_COLUMNS = ("label", "detail", "traceback", "device", "value", "device_total", "device_free", *OOM_COLUMNS)


def ring_metadata(ring: Ring, table: pa.Table, evidence: Evidence, death: dict[str, Any]) -> dict[str, Any]:
    """The metadata of one recovered ring.

    ``evidence``: what recovery learned outside the ring (``evidence.gather``);
    ``death``: its diagnosis (``diagnosis.diagnose``).
    """
    native = crash_reading(ring.meta.get("identity", {}).get("pid"), evidence.crash)
    late = shutdown_signal(evidence.crash) is not None  # the stacks at a signal that ended the shutdown, no crash's
    ident = ring.meta.get("identity") or {}
    times = stamps_ns(table["time"])
    steps = table["step"].drop_null()
    clock = ring.meta.get("clock") or {}
    start_ns = clock.get("wall_ns") if isinstance(clock.get("wall_ns"), int) else None
    end_ns = int(times[-1]) if len(times) else None
    last_step = int(pc.max(steps).as_py()) if len(steps) else None
    allocations = live_sites(ring.heap, ring.stacks, ring.meta, last_step, end_ns, main_thread_of(table),
                             step_records(table) if ring.heap is not None else None)  # fmt: skip
    last_sample, notes = _last_sample(table), _notes(table, ring.meta)
    unsampled = [n for n in notes if n.startswith(UNSAMPLED)]
    if allocations is not None and not unsampled:
        allocations["coverage"] = coverage(allocations, (last_sample or {}).get("host_anon"), _first_anon(table))
        raised = [int(m.group(1)) for n in notes if (m := RAISED.match(n))]
        allocations["mean_bytes_raised_to"] = raised[-1] if raised else None
    else:
        allocations = not_recorded(ring, unsampled)
    death = with_site_lever(death, allocations, ident.get("role"), last_sample, ident.get("pid"))
    alerts = alerts_report(table, death_time(death, evidence.writer_alive))
    death = with_alert_evidence(death, alerts)
    if evidence.writer_alive and death.get("cause") == "unknown":  # a snapshot of a process that runs on
        running = {**death, "headline": still_running(death.get("victim") or {})}
        death = snapshot_death(running, table, end_ns, isinstance(ident.get("rank"), int))
    return {
        "format_version": ring.header.version,
        "ring": str(ring.path),
        "host": ident.get("host"),
        "pid": ident.get("pid"),
        "ppid": ident.get("ppid"),
        "rank": ident.get("rank"),
        "local_rank": ident.get("local_rank"),
        "world_size": ident.get("world_size"),
        "role": ident.get("role"),
        "attempt": ident.get("attempt"),
        "job": ident.get("job"),
        "argv": ident.get("argv"),
        "boot_id": ident.get("boot_id"),
        "versions": ring.meta.get("versions"),
        "started_at": iso(start_ns),
        "last_event_at": iso(end_ns),
        "duration_s": round((end_ns - start_ns) / 1e9, 6) if start_ns and end_ns else None,
        "clean": ring.clean,
        "writer_state": writer_state(ring, evidence.writer_alive),
        "events": table.num_rows,
        "last_step": last_step,
        "last_step_s": _last_step_s(table),
        "recent_steps": _recent_steps(table),
        "clock_error_s": clock.get("error_s") if isinstance(clock.get("error_s"), (int, float)) else None,
        "sample_interval_s": ring.meta.get("sample_interval_s"),
        "cgroup": ring.meta.get("cgroup"),
        "last_sample": last_sample,
        "peaks": _peaks(table),
        "last_samples": _tail(table, 10),
        "module_growth": _module_growth(table, 5),
        "stacks": stack_report(table),
        "allocations": allocations,
        "alerts": alerts,
        "exceptions": _events(table, ("oom", "exception"), _EXC_COLUMNS, 10),
        "signals": _events(table, ("signal",), ("label", "value", "detail"), 10),
        "native_crash": None if late else native,
        "shutdown_stacks": native if late else None,
        "death": death,
        "notes": notes,
        "allocator_history": allocator_history(table, ring.meta),
        "recovery": ring.recovery.as_dict(),
        "recovered_by": {"blackbox": __version__},
    }


def death_time(death: dict[str, Any], alive: bool | None) -> int | None:
    """When the process died (ns since the epoch: the kernel's kill, else its last event); None where it is
    alive, ended cleanly, or its end is not known."""
    if alive or not death or death.get("cause") in ("clean_exit", "unknown"):
        return None
    return epoch_ns(death.get("time"))


def _last_step_s(table: pa.Table) -> float | None:
    """Seconds between the last two step records: how long the last finished step took."""
    times = of_kind(table, "step", columns=["time"])["time"]
    if len(times) < 2:
        return None
    last = times.slice(len(times) - 2).cast(pa.int64()).to_pylist()
    return round(float(last[1] - last[0]) / 1e9, 6)


def _recent_steps(table: pa.Table) -> list[list[Any]]:
    """The last steps' starts, ``[[time, step], ...]`` (ISO UTC), oldest first: the steps its helpers'
    deaths are told at (``family``)."""
    rows = of_kind(table, "step", columns=["time", "step"])
    rows = rows.slice(max(0, rows.num_rows - RECENT_STEPS))
    times = stamps_ns(rows["time"])
    return [[iso(int(t)), s] for t, s in zip(times, rows["step"].to_pylist(), strict=True) if s is not None]


def _tail(table: pa.Table, n: int) -> list[dict[str, Any]]:
    """The last ``n`` host samples (with the GPU figures of the moment), for the "last seconds" table."""
    columns = ["time", "kind", "step", "host_rss", "children_rss", "cgroup_usage", "gpu_allocated", "gpu_reserved"]
    rows = py_rows(last_of_kind(table, "sample", "gpu_sample", columns=columns, n=4 * n))
    out: list[dict[str, Any]] = []
    gpu: dict[str, Any] = {}
    for r in rows:
        if r["kind"] == "gpu_sample":
            gpu = {"gpu_allocated": r["gpu_allocated"], "gpu_reserved": r["gpu_reserved"]}
            continue
        out.append({"time": r["time"], "step": r["step"], "host_rss": r["host_rss"],
                    "children_rss": r["children_rss"], "cgroup_usage": r["cgroup_usage"], **gpu})  # fmt: skip
    return out[-n:]


def _module_growth(table: pa.Table, top: int) -> list[dict[str, Any]]:
    """Modules whose own forward grew memory most (modules=True): each call's growth (module_end
    minus module_begin) less what its child modules grew, summed over calls. None: not measured."""
    rows = of_kind(
        table, "module_begin", "module_end", columns=["kind", "label", "thread", "gpu_allocated", "host_rss"]
    )
    stacks: dict[int, list[list[Any]]] = {}  # per thread: [label, gpu0, rss0, children's gpu, children's rss]
    grew: dict[str, list[Any]] = {}  # label -> [calls, own GPU growth, own host growth]
    for r in (row for batch in rows.to_batches(max_chunksize=4096) for row in batch.to_pylist()):
        stack = stacks.setdefault(r["thread"], [])
        if r["kind"] == "module_begin":
            stack.append([r["label"], r["gpu_allocated"], r["host_rss"], 0, 0])
            del stack[:-MAX_MODULE_DEPTH]  # begins whose ends were lost: never a million deep
            continue
        while stack and stack[-1][0] != r["label"]:
            stack.pop()  # a begin whose end was lost (wrap-around, or an exception in forward)
        if not stack:
            continue
        label, gpu0, rss0, child_gpu, child_rss = stack.pop()
        g = grew.setdefault(label, [0, None, None])
        g[0] += 1
        incl_gpu = r["gpu_allocated"] - gpu0 if gpu0 is not None and r["gpu_allocated"] is not None else None
        incl_rss = r["host_rss"] - rss0 if rss0 is not None and r["host_rss"] is not None else None
        if incl_gpu is not None:
            g[1] = (g[1] or 0) + incl_gpu - child_gpu
        if incl_rss is not None:
            g[2] = (g[2] or 0) + incl_rss - child_rss
        if stack:
            stack[-1][3] += incl_gpu or 0
            stack[-1][4] += incl_rss or 0
    ranked = sorted(grew.items(), key=lambda kv: max(kv[1][1] or 0, kv[1][2] or 0), reverse=True)[:top]
    return [{"module": k, "calls": v[0], "gpu_growth": v[1], "host_growth": v[2]} for k, v in ranked]


def _notes(table: pa.Table, header: dict[str, Any]) -> list[str]:
    """The recorder's own notes (marks labelled ``blackbox: ...``): collectors that could not attach; the
    header's word that the C extension was not built first, even where wrap-around overwrote its mark."""
    labels = of_kind(table, "mark", columns=["label"])["label"]
    notes: list[str] = []
    for chunk in labels.chunks:  # through the dictionary: the notes are few, the marks may be many
        words = chunk.dictionary.to_pylist()
        used = set(chunk.indices.drop_null().to_pylist()) if len(words) < len(chunk) else set(range(len(words)))
        notes += [words[i][len(fmt.NOTE_PREFIX) :] for i in sorted(used) if words[i].startswith(fmt.NOTE_PREFIX)]
    if without_c_extension(header):
        notes = [NO_C_EXTENSION, *(n for n in notes if n != NO_C_EXTENSION)]
    return notes


def allocator_history(table: pa.Table, header: dict[str, Any]) -> dict[str, Any] | None:
    """PyTorch's CUDA allocator history as drained into the ring (``arm(allocator_history=...)``): the entries
    PyTorch kept, the actions in the timeline, and those lost between drains (the total the recorder's note
    carries: PyTorch's own counters of allocations, frees and segments against the actions drained); null
    where the history was not asked for."""
    entries = (header.get("options") or {}).get("allocator_history")
    if not isinstance(entries, int) or isinstance(entries, bool) or entries <= 0:
        return None
    marks = of_kind(table, "mark", columns=["label", "value"])
    note = pc.equal(marks["label"].cast(pa.string()), fmt.NOTE_PREFIX + fmt.NOTE_HISTORY_LOST)
    lost = pc.filter(marks["value"], note)
    return {
        "entries": entries,
        "actions": len(rows_of_kind(table, *fmt.ALLOCATOR_KINDS)),
        "lost": int(pc.max(lost).as_py() or 0) if len(lost) else 0,
    }


FOLDED_SITES = 10  # allocation sites kept per group of folded helpers


def helper_groups(folded: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Helper processes that ended cleanly (``folded.jsonl``), grouped by parent, role, name (``DataLoader
    worker``, ``multiprocessing Pool worker``) and start method, each null where not said: how many,
    when the first started and the last ended, the highest peak RSS among them, and the largest
    allocation sites live at their ends (``sites``, each with its helper's pid)."""
    groups: dict[tuple[int, str, str, str], dict[str, Any]] = {}
    for h in folded:
        g = groups.setdefault(
            (h["ppid"], h["role"], h.get("name") or "", h.get("start_method") or ""),
            {"ppid": h["ppid"], "role": h["role"], "name": h.get("name"), "start_method": h.get("start_method"),
             "count": 0, "first_started_at": h["started_at"], "last_ended_at": h["ended_at"], "peak_rss": -1,
             "argv": h["argv"]},
        )  # fmt: skip
        g["count"] += 1
        g["first_started_at"] = min(g["first_started_at"], h["started_at"])
        g["last_ended_at"] = max(g["last_ended_at"], h["ended_at"])
        g["peak_rss"] = max(g["peak_rss"], h["peak_rss"])
        g.setdefault("sites", []).extend({**site, "pid": h["pid"]} for site in h.get("sites") or [])
    for g in groups.values():  # the largest allocation sites of the group's helpers, each with its pid
        g["sites"] = sorted(g.get("sites") or [], key=lambda site: -site["live_bytes"])[:FOLDED_SITES]
    return sorted(groups.values(), key=lambda g: (-g["count"], g["ppid"], g["role"], g["name"] or ""))


def bundle_metadata(rings: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One ring's metadata as-is; several rings' under ``rings`` (the sequence given, read once here:
    it may be ``SpilledRings``; read twice where a ring is marked collateral) with summed counts.

    Both carry ``attempts`` (each attempt of each job with its own first death: ``attempts``),
    ``jobs`` (how many jobs the rings are of), ``first_death`` (rank, host, pid, cause, confidence,
    headline, victim, time and step of the earliest death of the last attempt of the job that started
    last, ranks torn down after it left out; null when there is none) and ``cause`` (that death's
    cause, else ``clean_exit``), so queries over many bundles can rely on them. A ring torn down by
    its launcher after another's death gets ``death.collateral_of``.
    """
    if len(rings) == 1:
        ring = rings[0]
        attempts = attempt_metadata(group_attempts([slim(ring)]))
        first_death = attempts[-1]["first_death"]
        return {**ring, "first_death": first_death, "cause": first_death["cause"] if first_death else "clean_exit",
                "attempts": attempts, "jobs": 1}  # fmt: skip
    totals: dict[str, int] = {}
    slims, extras, version, clean, events = [], [], 0, True, 0
    for m in rings:
        for k, v in m["recovery"].items():
            if isinstance(v, int) and k not in ("first_seq", "last_seq"):
                totals[k] = totals.get(k, 0) + v
        slims.append(slim(m))
        extras.append(extra(m))
        version, clean, events = max(version, m["format_version"]), clean and m["clean"], events + m["events"]
    retold = retell(slims, extras)
    for i, change in retold.items():
        slims[i]["death"].update({k: v for k, v in change.items() if k in SLIM_DEATH})
        if "killed_by" in change:
            slims[i]["death"]["killed_by"] = slim({"death": change})["death"]["killed_by"]
    causes = [s["death"]["cause"] for s in slims]
    attempts = attempt_metadata(group_attempts(slims))
    marks = {i: s["death"]["collateral_of"] for i, s in enumerate(slims) if "collateral_of" in s["death"]}
    decided = {i: s["death"] for i, s in enumerate(slims) if s["death"]["cause"] != causes[i]}  # (a stall its
    # waiters call a hang)
    first_death = attempts[-1]["first_death"] if attempts else None
    return {
        "format_version": version,
        "cause": first_death["cause"] if first_death else "clean_exit",
        "first_death": first_death,
        "attempts": attempts,
        "jobs": len({a["job"] for a in attempts}),
        "clean": clean,
        "events": events,
        "recovery": totals,
        "rings": _retold(rings, marks, retold, decided) if marks or retold or decided else rings,
        "recovered_by": {"blackbox": __version__},
    }


def _retold(
    rings: Sequence[dict[str, Any]],
    marks: dict[int, Any],
    retold: dict[int, dict[str, Any]],
    decided: dict[int, dict[str, Any]],
) -> Sequence[dict[str, Any]]:
    """The rings again, each one in ``marks`` with ``death.collateral_of`` set, each in ``retold`` with its
    death's fields changed (``family``; its own end now the death), each in ``decided`` as its attempt told
    its death (``hang.as_decided``), spilled again where they were."""
    out: SpilledRings | list[dict[str, Any]] = SpilledRings() if isinstance(rings, SpilledRings) else []
    for i, m in enumerate(rings):
        if i not in marks and i not in retold and i not in decided:
            out.append(m)
            continue
        death = {**m["death"], **retold.get(i, {})}
        if i in decided:
            death = as_decided(death, decided[i], ranked(m))
        if "after" in retold.get(i, {}):
            death.pop("own_end", None)
        out.append({**m, "death": death | ({"collateral_of": marks[i]} if i in marks else {})})
    return out
