"""summary.md: a short human account of a recovered ring, as a pure function."""

from __future__ import annotations

from typing import Any

from .._units import human_bytes
from ..recovery.timeline import COUNTERS, GAUGES


def _ending(m: dict[str, Any]) -> str:
    state = m.get("writer_state")
    if state == "clean":
        return "Ended cleanly: the recorder was disarmed (normal exit or `blackbox.disarm()`)."
    if state == "running":
        return "Still running: the writer process is alive; this is a snapshot."
    return (
        "**No clean end was recorded.** The process died without running its exit handlers: "
        "SIGKILL, the kernel OOM killer, a native crash, or a power loss."
    )


CAUSE_TEXT = {
    "clean_exit": "clean exit",
    "exception": "an uncaught exception",
    "oom_exception": "an out-of-memory exception",
    "host_oom_kill": "the kernel's OOM killer (host memory)",
    "killed": "killed (SIGKILL, no handler ran)",
    "signal": "a signal",
    "unknown": "unknown",
}


def _death(d: dict[str, Any] | None) -> list[str]:
    if not d:
        return []
    lines = [
        "## Cause of death",
        "",
        f"**{CAUSE_TEXT.get(d['cause'], d['cause'])}** (`{d['cause']}`) at {d.get('time') or 'n/a'}, "
        f"step {_dash(d.get('step'))}.",
        "",
        "Evidence:",
        "",
        *[f"- {e}" for e in d.get("evidence", [])],
    ]
    gpu = d.get("gpu_oom")
    if gpu:
        lines += ["", f"GPU OOM: **{gpu['kind']}**: {gpu['why']}."]
    growth = d.get("host_growth") or {}
    if growth.get("rss_per_step") is not None:
        lines += [
            "",
            f"Host memory grew {human_bytes(int(growth['rss_per_step']))} per step (least squares over samples).",
        ]
    if d.get("levers"):
        lines += ["", "What to change:", "", *[f"- {lever}" for lever in d["levers"]]]
    return [*lines, ""]


def ring_summary(m: dict[str, Any]) -> str:
    """Markdown for one ring's metadata (as built by ``ring_metadata``)."""
    rec = m["recovery"]
    argv = " ".join(m.get("argv") or []) or "n/a"
    lines = [
        f"# blackbox: {m.get('host')} pid {m.get('pid')} rank {_dash(m.get('rank'))}",
        "",
        f"- Command: `{argv}`",
        f"- Started: {m.get('started_at')}; last event: {m.get('last_event_at')} "
        f"({_duration(m.get('duration_s'))} recorded)",
        f"- Steps: {'none recorded' if m.get('last_step') is None else 'last step ' + str(m['last_step'])}",
        f"- Ending: {_ending(m)}",
        "",
        *_death(m.get("death")),
        "## Last memory figures",
        "",
    ]
    last = m.get("last_sample")
    if last:
        lines += ["| gauge | value | human |", "|---|---:|---:|"]
        for g in GAUGES:
            if last.get(g) is not None:
                human = str(last[g]) if g in COUNTERS else human_bytes(last[g])
                lines.append(f"| {g} | {last[g]} | {human} |")
        lines += ["", f"Sampled at {last.get('time')}, step {_dash(last.get('step'))}."]
        usage, limit = last.get("cgroup_usage"), last.get("cgroup_limit")
        if usage is not None and limit:
            lines.append(f"Memory cgroup at {100 * usage / limit:.1f}% of its {human_bytes(limit)} limit.")
    else:
        lines.append("No memory sample survived.")
    tail = m.get("last_samples") or []
    if tail:
        lines += ["", "## The last seconds", "", "| time | step | host RSS | workers | cgroup | GPU allocated |",
                  "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in tail:
            lines.append(
                f"| {r['time']} | {_dash(r['step'])} | {human_bytes(r['host_rss'])} | "
                f"{human_bytes(r['children_rss'])} | {human_bytes(r['cgroup_usage'])} | "
                f"{human_bytes(r.get('gpu_allocated'))} |"
            )
    grew = m.get("module_growth") or []
    if grew:
        lines += ["", "## Modules whose own forward grew memory most", "", "| module | calls | GPU | host |",
                  "|---|---:|---:|---:|"]  # fmt: skip
        for g in grew:
            lines.append(
                f"| {g['module']} | {g['calls']} | {human_bytes(g['gpu_growth'])} | {human_bytes(g['host_growth'])} |"
            )
    peaks = m.get("peaks") or {}
    if peaks:
        lines += ["", "## Peaks", "", "| gauge | peak | at |", "|---|---:|---|"]
        for g, p in peaks.items():
            lines.append(f"| {g} | {human_bytes(p['bytes'])} | {p['time']} |")
    lines += [
        "",
        "## Recovery",
        "",
        f"{rec['valid']} events recovered from {rec['slots_read']} of {rec['slots']} slots "
        f"(seq {_dash(rec['first_seq'])}..{_dash(rec['last_seq'])}); {rec['overwritten']} older events "
        f"were overwritten by wrap-around; {rec['torn']} torn and {rec['stale']} stale slots dropped; "
        f"{rec['holes']} holes; {rec['labels_lost']} labels lost.",
        "",
    ]
    return "\n".join(lines)


ROLE_TEXT = {
    "worker": "multiprocessing workers (DataLoader workers, spawn or forkserver)",
    "mp_service": "multiprocessing service processes (forkserver, resource tracker)",
    "compile_worker": "torch.compile workers",
    "child": "other Python processes of the job",
    "main": "processes",
}


def helpers_section(meta: dict[str, Any]) -> list[str]:
    """Helper processes that ended cleanly under `blackbox run`, one line per parent and role."""
    groups = meta.get("helpers") or []
    if not groups:
        return []
    lines = ["## Helper processes that ended cleanly", ""]
    for g in groups:
        argv = " ".join(g.get("argv") or [])[:80]
        lines.append(
            f"- {g['count']} {ROLE_TEXT.get(g['role'], g['role'])} of pid {g['ppid']}, "
            f"{g['first_started_at']} to {g['last_ended_at']}, peak RSS up to {human_bytes(g['peak_rss'])}"
            + (f" (`{argv}`)" if argv else "")
        )
    return [*lines, ""]


def bundle_summary(meta: dict[str, Any]) -> str:
    rings = meta.get("rings")
    helpers = helpers_section(meta)
    if not rings:
        return ring_summary(meta) + ("\n" + "\n".join(helpers) if helpers else "")
    head = [f"# blackbox: {len(rings)} rings, {meta['events']} events", "", *_across_ranks(meta), "", *helpers]
    parts = [_demote(ring_summary(m)) for m in rings]
    return "\n".join(head + parts)


def _demote(markdown: str) -> str:
    """One ring's summary as a section of the multi-ring one: every heading one level down."""
    return "\n".join("#" + line if line.startswith("#") else line for line in markdown.splitlines())


def _peak(m: dict[str, Any], gauge: str) -> str:
    p = (m.get("peaks") or {}).get(gauge)
    return human_bytes(p["bytes"]) if p else "-"


def _across_ranks(meta: dict[str, Any]) -> list[str]:
    """Who died first, and how each ring ended and peaked, side by side."""
    first = meta.get("first_death")
    lines = ["## Across ranks", ""]
    if first:
        lines.append(
            f"**First death: rank {_dash(first['rank'])}** (host {first['host']}, pid {first['pid']}), "
            f"`{first['cause']}` at {first['time']}."
        )
    else:
        lines.append("No ring records a death: every writer ended cleanly or is still running.")
    lines += [
        "",
        "| rank | host | pid | cause | at | last step | peak host RSS | peak GPU allocated |",
        "|---|---|---:|---|---|---:|---:|---:|",
    ]
    order = sorted(meta["rings"], key=lambda m: (m.get("rank") is None, m.get("rank") or 0, m.get("pid") or 0))
    for m in order:
        d = m.get("death") or {}
        lines.append(
            f"| {_dash(m.get('rank'))} | {m.get('host')} | {m.get('pid')} | {d.get('cause', '-')} | "
            f"{_dash(d.get('time'))} | {_dash(m.get('last_step'))} | {_peak(m, 'host_rss')} | "
            f"{_peak(m, 'gpu_allocated')} |"
        )
    return lines


def _dash(v: Any) -> str:
    return "-" if v is None else str(v)


def _duration(s: float | None) -> str:
    if s is None:
        return "n/a"
    if s < 120:
        return f"{s:.1f} s"
    if s < 7200:
        return f"{s / 60:.1f} min"
    return f"{s / 3600:.2f} h"
