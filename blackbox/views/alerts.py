"""summary.md's "Before the death": the alerts the job was given, the alert signal and its handler, the
watchdog, and how early the death was foreseeable (from ``metadata.json``'s ``alerts``)."""

from __future__ import annotations

from typing import Any

from .._errors import one_line
from .._units import human_bytes
from ..recovery.alerts import lines as alert_lines

MAX_ROWS = 20


def alert_section(m: dict[str, Any]) -> list[str]:
    """The section for one ring's metadata; none where it holds no alert and no action."""
    report = m.get("alerts")
    if not report:
        return []
    died = (m.get("death") or {}).get("cause") not in (None, "clean_exit", "unknown")
    out = ["## Before the death" if died else "## Alerts", ""]
    said = alert_lines(report, died)
    out += [f"- {one_line(s)}" for s in said]
    alerts = report.get("alerts") or []
    if alerts:
        out += ["" if said else "", "| time | step | alert | in use | limit | growth | forecast | before the end |",
                "|---|---:|---|---:|---|---:|---:|---:|"]  # fmt: skip
        for a in alerts[:MAX_ROWS]:
            device = "" if a["device"] is None else f" {a['device']}"
            limit = f"{a['limit_kind']}{device} {human_bytes(a['limit_bytes'])}"
            growth = f"{human_bytes(int(a['growth_per_s']))}/s" if a["growth_per_s"] else "-"
            ahead = "-" if a["forecast_s"] is None else f"{a['forecast_s']:.1f} ± {a['forecast_error_s'] or 0:.1f} s"
            before = "-" if a["before_death_s"] is None else f"{a['before_death_s']:.1f} s"
            out.append(f"| {a['time']} | {'-' if a['step'] is None else a['step']} | {a['kind']} {a['level']} | "
                       f"{human_bytes(a['value'])} | {limit} | {growth} | {ahead} | {before} |")  # fmt: skip
        if len(alerts) > MAX_ROWS:
            out.append(f"\n{len(alerts) - MAX_ROWS} more in metadata.json (`alerts`).")
    for w in report.get("watchdog") or []:
        out.append(f"\nThe watchdog emptied the CUDA cache at {w['time']}: {human_bytes(w['freed_bytes'])} freed.")
    return [*out, ""]
