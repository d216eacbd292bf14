"""summary.md: a short human account of a recovered ring, as a pure function."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._errors import one_line
from .._units import human_bytes
from ..recovery.headline import sent_from
from ..recovery.ranks import rank_rows
from ..recovery.spill import derived
from ..recovery.timeline import COUNTERS, GAUGES
from .across import across_lines
from .alerts import alert_section
from .allocs import allocation_sections, folded_site, job_allocation_sections
from .stacks import crash_section, stack_sections
from .text import inert, shown


def _ending(m: dict[str, Any]) -> str:
    state = m.get("writer_state")
    cause = (m.get("death") or {}).get("cause")
    if state == "clean" and cause not in (None, "clean_exit"):  # an exception, a deliberate exit status
        return "The process ran its exit handlers (the recorder disarmed at exit); how it died: below."
    if state == "clean":
        return "Ended cleanly: the recorder was disarmed (normal exit or `blackbox.disarm()`)."
    if state == "running":
        return "Still running: the writer process is alive; this is a snapshot."
    if cause not in (None, "unknown"):
        return "**No clean end was recorded.** The process ended without running its exit handlers; how: below."
    return (
        "**No clean end was recorded.** The process died without running its exit handlers: SIGKILL, the "
        "kernel OOM killer, a signal with no handler (SIGTERM's default), a native crash, os._exit, or a power loss."
    )


CAUSE_TEXT = {
    "clean_exit": "clean exit",
    "nonzero_exit": "a deliberate nonzero exit",
    "interrupted": "interrupted (Ctrl-C, SIGINT)",
    "exception": "an uncaught exception",
    "oom_exception": "an out-of-memory exception",
    "host_oom_kill": "the kernel's OOM killer (host memory)",
    "userspace_oom_kill": "a userspace OOM killer (earlyoom, systemd-oomd)",
    "killed": "killed (SIGKILL, no handler ran)",
    "signal": "a signal",
    "hang": "a hang: no progress for a long time, then ended from outside",
    "unknown": "unknown",
}


def _victim(v: dict[str, Any] | None, alive: bool = False) -> str:
    if not v or v.get("pid") is None:
        return ""
    memory = [f"{k.replace('_', ' ')} {human_bytes(v[k])}" for k in ("rss", "anon_rss", "file_rss", "shmem_rss")
              if v.get(k) is not None]  # fmt: skip
    name = f" `{v['name']}`" if v.get("name") else ""
    what = "Process still running" if alive else "Process that died"
    return f"{what}: {v.get('role', 'process')} pid {v['pid']}{name}" + (
        f"; its memory at the end: {', '.join(memory)}." if memory else "."
    )


def _composition(m: dict[str, Any] | None) -> str:
    if not m:
        return ""
    parts = [f"{human_bytes(m.get(k))} {label}" for k, label in (("anon", "anonymous"), ("file", "page cache"),
             ("shmem", "of it shared memory"), ("file_dirty", "dirty")) if m.get(k) is not None]  # fmt: skip
    return "The cgroup's memory at the end: " + ", ".join(parts) + "."


def _death(d: dict[str, Any] | None) -> list[str]:
    if not d:
        return []
    lines = ["## Cause of death", ""]
    if d.get("headline"):
        lines += [f"**{d['headline']}**", ""]
    lines += [
        f"Cause `{d['cause']}` ({CAUSE_TEXT.get(d['cause'], d['cause'])}), confidence {d.get('confidence', 'n/a')}, "
        f"at {d.get('time') or 'n/a'}, step {_dash(d.get('step'))}"
        + (f", exit status {d['exit_status']}" if d.get("exit_status") is not None else "")
        + ".",
    ]
    limit = d.get("limit")
    hit = f"The limit it hit: {limit['text']}." if isinstance(limit, dict) and limit.get("text") else ""
    for extra in (_when(d), _victim(d.get("victim"), bool(d.get("alive"))), hit, _composition(d.get("memory_at_end"))):
        if extra:
            lines += ["", extra]
    killer = d.get("killed_by")
    if killer and (killer.get("sender") or killer.get("sender_pid")):
        lines += ["", f"Last signal: {killer['signal']}{sent_from(killer)} at {killer['time']}."]
    lines += ["", "Evidence:", "", *[f"- {e}" for e in d.get("evidence", [])]]
    report = d.get("kernel_report")
    if report and report.get("tasks"):
        top = sorted(report["tasks"], key=lambda r: -r["rss"])[:5]
        lines += ["", f"The kernel's OOM report is in `{report['file']}`; its largest tasks:", ""]
        lines += [f"- pid {r['pid']} `{r['name']}`: RSS {human_bytes(r['rss'])} (anon {human_bytes(r['rss_anon'])}, "
                  f"file {human_bytes(r['rss_file'])}, shmem {human_bytes(r['rss_shmem'])})" for r in top]  # fmt: skip
    gpu = d.get("gpu_oom")
    if gpu:
        lines += ["", f"GPU OOM: **{gpu['kind']}**: {gpu['why']}."]
    growth = d.get("host_growth") or {}
    if growth.get("rss_per_step") is not None:
        lines += ["", _per_step(growth)]
    for child in (growth.get("children") or [])[:3]:
        if child["growth"] > 0:
            lines += [f"Child pid {child['pid']} (`{child['name']}`) grew {human_bytes(child['growth'])}, "
                      f"to {human_bytes(child['peak_rss'])}."]  # fmt: skip
    if d.get("levers"):
        lines += ["", "What to change:", "", *[f"- {lever}" for lever in d["levers"]]]
    return [*lines, ""]


def _when(d: dict[str, Any]) -> str:
    """How well the death's time is known, where it is the last record; that the process was starved."""
    error, starved = d.get("time_error_s"), d.get("starved")
    text = ""
    if d.get("alive"):  # no death: the time is the snapshot's
        return "Its time is its last record before it was recovered."
    if isinstance(error, (int, float)) and error > 0:
        text = (f"Its time is its last record: the death came after it, within {error:.3g} s if it ran as in its "
                "last seconds (the longest gap between its last records).")  # fmt: skip
    if isinstance(starved, dict) and isinstance(starved.get("late_s"), (int, float)):
        text += (f" It was starved at its end (of CPU, or of the GIL): its sampler, asked to run every "
                 f"{starved.get('interval_s')} s, ran up to {starved['late_s']:.3g} s late.")  # fmt: skip
    return text.strip()


def _per_step(growth: dict[str, Any]) -> str:
    """The job's own memory per step: growth said only where it is beyond the noise (its 95% interval
    excludes zero), and said to be within the noise otherwise."""
    per_step, error = growth["rss_per_step"], growth.get("rss_per_step_error")
    sign = "+" if per_step >= 0 else "-"
    fit = f"{sign}{human_bytes(int(abs(per_step)))}" + (f" ± {human_bytes(int(error))}" if error is not None else "")
    if growth.get("rss_per_step_beyond_noise"):
        trend = "grew" if per_step > 0 else "shrank"
        return (f"The job's own memory {trend} {human_bytes(int(abs(per_step)))} ± {human_bytes(int(error or 0))} "
                "per step (least squares over the samples of the steps before the last, 95% interval).")  # fmt: skip
    why = "a 95% interval that includes zero" if error is not None else "too few independent samples to tell"
    return f"The job's own memory shows no growth per step beyond its noise (the fit: {fit} per step, {why})."


def ring_summary(m: dict[str, Any], folder: str = "") -> str:
    """Markdown for one ring's metadata (as built by ``ring_metadata``); text from the ring escaped.
    ``folder``: the path from the summary's own folder to the ring's bundle (its files are linked)."""
    m = shown(m)
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
        *alert_section(m),
        *crash_section(m.get("native_crash"), folder),
        *crash_section(m.get("shutdown_stacks"), folder, shutdown=True),
        *allocation_sections(m.get("allocations"), m.get("role")),
        *stack_sections(m.get("stacks")),
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
    notes = m.get("notes") or []
    if notes:
        lines += ["", "## What the recorder could not do", "", *[f"- {n}" for n in notes]]
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
    "worker": "multiprocessing workers",
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
        argv = one_line(" ".join(g.get("argv") or [])[:80]).replace("`", "'")  # a helper's own words: one code span
        what = g["name"] + ("s" if g["count"] != 1 else "") if g.get("name") else ROLE_TEXT.get(g["role"], g["role"])
        how = f" (started by {g['start_method']})" if g.get("start_method") else ""
        lines.append(
            f"- {g['count']} {what}{how} of pid {g['ppid']}, "
            f"{g['first_started_at']} to {g['last_ended_at']}, peak RSS up to {human_bytes(g['peak_rss'])}"
            + (f" (`{argv}`)" if argv else "")
        )
        lines += [f"  - held at its end by pid {site['pid']}: {folded_site(site)}"
                  for site in (g.get("sites") or [])[:3]]  # fmt: skip
    return [*lines, ""]


def unread_section(meta: dict[str, Any]) -> list[str]:
    """Rings that could not be recovered, each with its one-line reason."""
    unread = meta.get("unread_rings") or []
    if not unread:
        return []
    lines = [f"## Rings that could not be recovered ({len(unread)})", ""]
    return [*lines, *[f"- `{u['ring']}`: {u['reason']}" for u in unread], ""]


def left_out_section(meta: dict[str, Any]) -> list[str]:
    """Rings over the count one recovery reads: how many, and where they are named."""
    left = meta.get("rings_left_out")
    if not left:
        return []
    text = (
        f"More rings than one recovery reads ({left['limit']}): the {left['limit']} last modified were "
        f"recovered (the folder owner's first); `metadata.json` names the {left['count']} others (`rings_left_out`)."
    )
    return [f"## Rings left out ({left['count']})", "", text, ""]


def raw_rings_section(meta: dict[str, Any]) -> list[str]:
    """The rings the bundle keeps in ``rings/`` and those it does not, each with its reason."""
    raw = meta.get("raw_rings")
    if not isinstance(raw, dict):
        return []
    kept, skipped = raw.get("kept") or [], raw.get("skipped") or []
    lines = [f"## Raw rings ({len(kept)} kept, {len(skipped)} not kept)", ""]
    if kept:
        packed = human_bytes(sum(int(k.get("compressed_bytes") or 0) for k in kept))
        whole = human_bytes(sum(int(k.get("raw_bytes") or 0) for k in kept))
        lines += [f"`rings/` keeps them zstd-compressed ({packed} of {whole}); "
                  "`blackbox recover BUNDLE/rings -o NEW` reads them again.", ""]  # fmt: skip
    lines += [f"- `{s.get('ring')}`: {s.get('reason')}" for s in skipped[:MAX_LISTED]]
    return [*lines, *([f"- and {len(skipped) - MAX_LISTED} more"] if len(skipped) > MAX_LISTED else []), ""]


# Whose a failing status is where no process with a ring had it (said by summary.md and by `blackbox run`)
SHELLS_STATUS = "own (a shell, or a program that is not Python); each Python process of it ended cleanly"


def outlived_lines(meta: dict[str, Any]) -> list[str]:
    """Where `blackbox run` saw the job exit 0 and yet a process of it died: the job outlived that death; where it
    saw a failing status that no process with a ring had (a shell's, every Python process ended cleanly)."""
    status = meta.get("exit_status")
    if isinstance(status, int) and status != 0 and meta.get("cause") == "clean_exit":
        return ["", f"**The job exited with status {status}**, its {SHELLS_STATUS}."]
    if status != 0 or not meta.get("first_death"):
        return []
    alive = meta["first_death"].get("alive")
    below = "the process below is still running" if alive else "the death below did not end it"
    return ["", f"**The job exited with status 0**: its own process ended cleanly; {below}."]


def bundle_summary(meta: dict[str, Any]) -> str:
    """summary.md: one ring's account; for several, the account across them (the same length at any
    count: attempts, first death, how the others ended, outliers) and the detail of one ring, the
    first death's (else the lowest rank of the last attempt). Text from the rings is escaped (``text``)."""
    rings = meta.get("rings")
    view = shown({k: v for k, v in meta.items() if k != "rings"})  # the rings are read one at a time
    helpers = helpers_section(view) + unread_section(view) + left_out_section(view) + raw_rings_section(view)
    if not rings:
        title, _, rest = ring_summary(meta).partition("\n")
        text = "\n".join([title, *outlived_lines(view)]) + "\n" + rest + ("\n" + "\n".join(helpers) if helpers else "")
        return inert(text)
    rows = shown(rank_rows(meta))  # one pass over the rings (they may be read back from disk), for both
    hosts = len({r["host"] for r in rows})
    head = [f"# blackbox: {len(rings)} rings on {hosts} host{'s' if hosts != 1 else ''}, {meta['events']} events",
            *outlived_lines(view), ""]  # fmt: skip
    head += [*across_lines(view, rows), *job_allocation_sections(rings), *helpers]
    detail = _detail_ring(meta, rings)
    title = "the first death" if meta.get("first_death") else "the lowest rank of the last attempt"
    return inert("\n".join([*head, f"## Detail of {title}", "", _demote(_demote(ring_summary(detail)))]))


MAX_LISTED = 20  # bundles listed by name where some could not be read


def job_summary(meta: dict[str, Any], rows: list[dict[str, Any]], detail: dict[str, Any] | None) -> str:
    """summary.md of a job read from its node bundles (``recovery.job``): the account across every
    host, the bundles that could not be read, and the detail of the first death's ring. Text from the
    bundles is escaped (``text``)."""
    meta, rows = shown(meta), shown(rows)
    bundles = meta.get("bundles") or []
    hosts = meta.get("hosts") or 0
    lines = [
        f"# blackbox: job of {meta.get('ring_count', 0)} rings on {hosts} host{'s' if hosts != 1 else ''}, "
        f"from {len(bundles)} bundle{'s' if len(bundles) != 1 else ''}",
        "",
        *across_lines(meta, rows),
    ]
    unread = meta.get("unread_bundles") or []
    if unread:
        lines += [f"## Bundles that could not be read ({len(unread)})", ""]
        lines += [f"- `{u['bundle']}`: {u['reason']}" for u in unread[:MAX_LISTED]]
        if len(unread) > MAX_LISTED:
            lines.append(f"- ... and {len(unread) - MAX_LISTED} more (metadata.json: unread_bundles)")
        lines.append("")
    lines += claimed_lines(meta.get("claimed_twice") or [])
    first = meta.get("first_death")
    if first and detail is not None:
        lines += ["## Detail of the first death", "", f"Its timeline: `{first['bundle']}/timeline.parquet`.", ""]
        lines.append(_demote(_demote(ring_summary(detail, f"{first['bundle']}/"))))
    elif first:
        lines += [f"Its timeline: `{first['bundle']}/timeline.parquet`.", ""]
    return inert("\n".join(lines))


def claimed_lines(claimed: list[dict[str, Any]]) -> list[str]:
    """Rings that two bundles hold (``recovery.job``), grouped by the two bundles: read once where both
    hold the same account, twice where they differ (one may be planted: both are in the account)."""
    if not claimed:
        return []
    groups: dict[tuple[str, str, bool], int] = {}
    for c in claimed:
        key = (c["bundles"][0], c["bundles"][1], bool(c.get("same")))
        groups[key] = groups.get(key, 0) + 1
    lines = [f"## Rings that two bundles hold ({len(claimed)})", ""]
    for (first, second, same), n in list(groups.items())[:MAX_LISTED]:
        how = "the same account: read once" if same else "different accounts: both read, one may be planted"
        lines.append(f"- {n} ring{'s' if n != 1 else ''} in `{first}` and `{second}` ({how})")
    if len(groups) > MAX_LISTED:
        lines.append(f"- ... and {len(groups) - MAX_LISTED} more pairs of bundles (metadata.json: claimed_twice)")
    return [*lines, ""]


def _detail_ring(meta: dict[str, Any], rings: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The first death's ring, else the lowest rank of the last attempt; ``rings`` read a ring at a
    time (a ``SpilledRings`` is never held whole, and is searched once for both summaries)."""
    first = meta.get("first_death") or {}
    last = (meta.get("attempts") or [{}])[-1].get("started_at")
    key = f"detail {first.get('pid')!r} {first.get('host')!r} {last!r}"
    return derived(rings, key, lambda: _find_detail(meta, rings))


def _find_detail(meta: dict[str, Any], rings: Sequence[dict[str, Any]]) -> dict[str, Any]:
    first = meta.get("first_death") or {}
    if first:
        for m in rings:
            if m.get("pid") == first.get("pid") and m.get("host") == first.get("host"):
                return m
    last = (meta.get("attempts") or [{}])[-1].get("started_at") or ""

    def key(m: dict[str, Any]) -> tuple[bool, int, bool]:
        return m.get("rank") is None, m.get("rank") or 0, m.get("role") != "main"

    current = min((m for m in rings if (m.get("started_at") or "") >= last), key=key, default=None)
    return current if current is not None else min(rings, key=key)


def _demote(markdown: str) -> str:
    """One ring's summary as a section of the multi-ring one: every heading one level down."""
    return "\n".join("#" + line if line.startswith("#") else line for line in markdown.splitlines())


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
