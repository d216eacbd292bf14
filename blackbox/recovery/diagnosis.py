"""What killed the job, with the evidence, and what to change: a pure function of the
recovered timeline, the ring's clean-end record and the evidence gathered at recovery.

``death.cause`` is one of CAUSES. The rules, in order:

1. the writer is still alive: ``unknown`` (no death yet);
2. a clean end was recorded: ``oom_exception`` / ``exception`` if an uncaught
   exception of the main thread came first, else ``clean_exit``;
3. no clean end (nothing ran at exit):
   the kernel logged an OOM kill of this pid, or the memory cgroup's
   ``oom_kill`` counter rose after the last sample: ``host_oom_kill``;
   faulthandler left a native crash: ``signal``;
   the recorder saw a fatal signal (default action): ``signal``;
   ``blackbox run`` saw a signal exit: ``killed`` for SIGKILL (``host_oom_kill``
   when the last sample was within 5% of the cgroup limit), else ``signal``;
   otherwise ``killed`` on the same boot (no handler ran: SIGKILL or
   ``os._exit``), ``unknown`` when the host rebooted or cannot be told.
"""

from __future__ import annotations

import signal
from typing import Any

import numpy as np
import pyarrow as pa

from .._units import human_bytes
from .evidence import Evidence
from .timeline import of_kind, py_rows

CAUSES = ("clean_exit", "exception", "oom_exception", "host_oom_kill", "killed", "signal", "unknown")
NEAR_LIMIT = 0.95


_SAMPLE_COLUMNS = [
    "time",
    "step",
    "host_rss",
    "children_rss",
    "cgroup_usage",
    "cgroup_limit",
    "cgroup_oom_kills",
    "mem_available",
]


def _rows(table: pa.Table, *kinds: str) -> pa.Table:
    columns = _SAMPLE_COLUMNS if kinds == ("sample",) else None
    return of_kind(table, *kinds, columns=columns)


def _last(table: pa.Table) -> dict[str, Any] | None:
    return py_rows(table.slice(table.num_rows - 1))[0] if table.num_rows else None


def _iso(t: Any) -> str | None:
    return t if isinstance(t, str) else None


def diagnose(table: pa.Table, clean: bool, ev: Evidence) -> dict[str, Any]:
    """``death``: cause, evidence (facts that decided it), time, step, and analysis with levers."""
    crash = first_line(ev.crash)
    evidence: list[str] = []
    last_event = _last(table.select(["time", "step"])) if table.num_rows else None
    when = last_event
    samples = _rows(table, "sample")
    last_sample = _last(samples)
    first_sample = py_rows(samples.slice(0, 1))[0] if samples.num_rows else None
    errors = _rows(table, "oom", "exception").select(
        [
            "time",
            "kind",
            "step",
            "label",
            "detail",
            "oom_requested",
            "oom_reserved_unallocated",
            "oom_capacity",
            "oom_free",
        ]
    )
    main_uncaught = [
        r for r in py_rows(errors) if r["detail"] == "uncaught" or (r["detail"] or "").startswith("uncaught;")
    ]
    fatal_signals = [r for r in py_rows(_rows(table, "signal")) if r["detail"] == "default action"]
    near = _near_limit(last_sample)
    if near is not None:
        evidence.append(near[1])
    if last_sample and last_sample.get("mem_available") is not None:
        evidence.append(f"last sample: the host had {human_bytes(last_sample['mem_available'])} MemAvailable")

    cause = "unknown"
    if ev.writer_alive and not clean:
        cause = "unknown"
        evidence.insert(0, "the writer process is still alive: this is a snapshot, not a death")
    elif clean:
        evidence.insert(0, "a clean end was recorded (the recorder was disarmed at exit)")
        if main_uncaught:
            exc = main_uncaught[-1]
            cause = "oom_exception" if exc["kind"] == "oom" else "exception"
            evidence.append(f"uncaught {exc['kind']} at step {exc['step']}: {_short(exc['label'])}")
            when = exc
        else:
            cause = "clean_exit"
        if ev.exit_status is not None:
            evidence.append(f"exit status {ev.exit_status}")
    else:
        evidence.insert(0, "no clean end: the process ended without running its exit handlers")
        sig = _signal_of(ev.exit_status)
        rose = _oom_kills_rose(first_sample, last_sample, ev)
        if ev.kernel_oom_line:
            cause = "host_oom_kill"
            evidence.append(f"kernel log: {ev.kernel_oom_line}")
        elif rose:
            cause = "host_oom_kill"
            evidence.append(rose)
        elif crash:
            cause = "signal"
            evidence.append(f"native crash (faulthandler): {crash}")
        elif fatal_signals:
            cause = "signal"
            s = fatal_signals[-1]
            evidence.append(f"{s['label']} received with its default action at {_iso(s['time'])}")
            when = s
        elif sig is not None:
            if sig == signal.SIGKILL and near is not None and near[0] >= NEAR_LIMIT:
                cause = "host_oom_kill"
                evidence.append("SIGKILL with memory at the cgroup limit (no kernel log to confirm)")
            else:
                cause = "killed" if sig == signal.SIGKILL else "signal"
                evidence.append(f"`blackbox run` saw the job end by {signal.Signals(sig).name}")
        elif ev.same_boot:
            cause = "killed"
            evidence.append("same boot, no exception, no signal handler ran: SIGKILL (or os._exit)")
        else:
            evidence.append("the host rebooted or could not be checked: SIGKILL, power loss or kernel crash")
    death: dict[str, Any] = {
        "cause": cause,
        "evidence": evidence,
        "time": _iso(when["time"]) if when else None,
        "step": when["step"] if when else None,
    }
    death.update(_analysis(table, cause, main_uncaught, samples))
    return death


def first_line(text: str | None) -> str | None:
    """The first non-blank line of a text (a native crash's first traceback line)."""
    if text is None:
        return None
    return next((ln for ln in text.splitlines() if ln.strip()), "")


def _short(text: str | None, n: int = 300) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


def _signal_of(status: int | None) -> int | None:
    if status is None:
        return None
    if status < 0:
        return -status
    if status > 128 and status - 128 < 65:
        return status - 128
    return None


def _near_limit(sample: dict[str, Any] | None) -> tuple[float, str] | None:
    if not sample or not sample.get("cgroup_limit") or sample.get("cgroup_usage") is None:
        return None
    frac = sample["cgroup_usage"] / sample["cgroup_limit"]
    return frac, (
        f"last sample: cgroup usage {human_bytes(sample['cgroup_usage'])} of its "
        f"{human_bytes(sample['cgroup_limit'])} limit ({100 * frac:.0f}%)"
    )


def _oom_kills_rose(first: dict[str, Any] | None, last: dict[str, Any] | None, ev: Evidence) -> str | None:
    if not last or last.get("cgroup_oom_kills") is None or ev.cgroup_oom_kills_now is None or not ev.same_boot:
        return None
    before = last["cgroup_oom_kills"]
    if ev.cgroup_oom_kills_now > before:
        return f"the memory cgroup's oom_kill counter rose from {before} (last sample) to {ev.cgroup_oom_kills_now}"
    return None


# ---------------------------------------------------------------- analysis and levers
def _analysis(table: pa.Table, cause: str, uncaught: list[dict[str, Any]], samples: pa.Table) -> dict[str, Any]:
    out: dict[str, Any] = {}
    levers: list[str] = []
    if cause == "oom_exception" and uncaught:
        gpu = gpu_oom_kind(uncaught[-1])
        if gpu:
            out["gpu_oom"] = gpu
            levers += gpu["levers"]
    growth = host_growth(samples)
    if growth:
        out["host_growth"] = growth
    if cause == "host_oom_kill":
        if growth and growth.get("rss_per_step", 0) > 0:
            who = "DataLoader workers" if growth.get("grew") == "children" else "the job's own process"
            levers.append(
                f"memory grew {human_bytes(int(growth['rss_per_step']))} per step in {who}: look for tensors "
                "kept across steps (e.g. `losses.append(loss)` instead of `loss.item()`), caches that never evict"
            )
            if growth.get("grew") == "children":
                levers.append("fewer DataLoader workers, or datasets whose workers do not copy-on-read Python objects")
        levers.append("raise the memory limit only once the growth is explained")
    if levers:
        out["levers"] = levers
    return out


def gpu_oom_kind(oom: dict[str, Any]) -> dict[str, Any] | None:
    """True exhaustion or fragmentation, from the parsed OOM figures, with the levers for each."""
    req, unalloc = oom.get("oom_requested"), oom.get("oom_reserved_unallocated")
    if req is None:
        return None
    if unalloc is not None and unalloc >= req:
        return {
            "kind": "fragmentation",
            "why": f"{human_bytes(unalloc)} reserved but unallocated >= the {human_bytes(req)} request",
            "levers": [
                "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (the cache had the bytes, not in one piece)"
            ],
        }
    return {
        "kind": "exhaustion",
        "why": f"the {human_bytes(req)} request exceeded what was free and cached",
        "levers": [
            "smaller micro-batch with gradient accumulation (same effective batch)",
            "activation checkpointing on the largest blocks",
            "shard more (FSDP / ZeRO stage up, tensor or pipeline parallel)",
        ],
    }


def host_growth(samples: pa.Table) -> dict[str, Any] | None:
    """Least-squares growth of RSS (job and children) per step and per second over the samples."""
    if samples.num_rows < 3:
        return None
    cols = {c: samples[c].to_numpy(zero_copy_only=False) for c in ("host_rss", "children_rss", "step")}
    t = samples["time"].cast(pa.int64()).to_numpy(zero_copy_only=False) / 1e9
    rss = np.nan_to_num(cols["host_rss"].astype(float), nan=np.nan)
    out: dict[str, Any] = {}
    ok = ~np.isnan(rss)
    if ok.sum() >= 3 and np.ptp(t[ok]) > 0:
        out["rss_per_second"] = float(np.polyfit(t[ok], rss[ok], 1)[0])
    steps = cols["step"].astype(float)
    oks = ok & ~np.isnan(steps)
    if oks.sum() >= 3 and np.ptp(steps[oks]) > 0:
        out["rss_per_step"] = float(np.polyfit(steps[oks], rss[oks], 1)[0])
    children = cols["children_rss"].astype(float)
    okc = ~np.isnan(children)
    if okc.sum() >= 3:
        grew_job = rss[ok][-1] - rss[ok][0] if ok.any() else 0.0
        grew_children = children[okc][-1] - children[okc][0]
        out["children_rss_growth"] = float(grew_children)
        out["grew"] = "children" if grew_children > grew_job else "job"
    return out or None
