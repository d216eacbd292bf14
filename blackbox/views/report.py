"""``blackbox report``: one self-contained HTML page of a bundle, as a pure function.

``report_html(table, meta)`` returns the page as a string; writing it is the caller's job. The page
needs no network: its script and style are inlined (``report.js``, ``report.css`` beside this module,
hand-written), its data is one JSON block, and its Content-Security-Policy lets it load nothing from
anywhere (``default-src 'none'``) and run only its own script (by hash).

Sections: the verdict and its evidence, the memory timeline (steps, deaths; drag to zoom, which also
narrows the stacks below to that window), who holds the memory (allocation sampling's live bytes by
stack, where recorded), what it was doing (the time-sampled stacks as a flame graph), and the
per-rank table. What is known without the script (the verdict, the evidence, the per-rank table) is
written as HTML, so the page reads in a browser that runs no script too.

Every text from a ring is untrusted: it is escaped where it becomes HTML, and the JSON block is
written so that no string in it can end the block (``<``, ``>``, ``&`` and the line separators as
``\\u`` escapes); the script puts text into the page only as text nodes.
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
from importlib import resources
from typing import Any

import pyarrow as pa

from .._units import human_bytes
from ..recovery.ranks import rank_rows
from .report_data import allocation_data, drawn_pids, stack_data, timeline_data

MAX_TABLE_ROWS = 5000
RANK_COLUMNS = [("host", "host"), ("rank", "rank"), ("pid", "pid"), ("role", "role"), ("attempt", "attempt"),
                ("cause", "cause"), ("confidence", "confidence"), ("death_time", "death time"),
                ("last_step", "last step"), ("peak_host_rss", "peak host RSS"),
                ("peak_cgroup_usage", "peak cgroup"), ("peak_gpu_allocated", "peak GPU allocated"),
                ("job", "job")]  # fmt: skip
BYTE_COLUMNS = {"peak_host_rss", "peak_cgroup_usage", "peak_gpu_allocated"}
_JSON_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def _asset(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


def _csp_hash(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode() + "'"


def json_for_html(value: Any) -> str:
    """JSON that is safe inside a ``<script type="application/json">`` block: no string in it can end
    the block or open a comment (``</script>``, ``<!--``)."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)
    return "".join(_JSON_ESCAPES.get(c, c) for c in text)


def esc(value: Any) -> str:
    """Text for HTML: escaped, quotes included; None as a dash."""
    return "-" if value is None else html.escape(str(value), quote=True)


def _death_ring(meta: dict[str, Any]) -> dict[str, Any]:
    """The ring whose death the verdict explains: the first death's, else the only ring."""
    rings = meta.get("rings") or []
    first = meta.get("first_death") or {}
    for m in rings:
        if m.get("pid") == first.get("pid") and m.get("host") == first.get("host"):
            return dict(m)
    return dict(rings[0]) if rings and not first else meta


def verdict_html(meta: dict[str, Any]) -> str:
    """The verdict: the headline, cause and confidence, who died and when, the evidence, what to change."""
    ring = _death_ring(meta)
    death = ring.get("death") or {}
    first = meta.get("first_death") if meta.get("rings") else None
    if meta.get("rings") and not first:
        return ('<p class="headline" id="headline">Every process ended cleanly.</p>'
                f'<p>{len(meta["rings"])} processes; no death to explain.</p>')  # fmt: skip
    cause = death.get("cause") or (first or {}).get("cause") or meta.get("cause") or "unknown"
    headline = death.get("headline") or (first or {}).get("headline") or f"Cause: {cause}"
    facts = [
        ("cause", cause),
        ("confidence", death.get("confidence")),
        ("when", death.get("time")),
        ("step", death.get("step")),
        ("exit status", death.get("exit_status")),
    ]
    victim = death.get("victim") or {}
    if victim.get("pid") is not None:
        memory = ", ".join(f"{k.replace('_', ' ')} {human_bytes(victim[k])}" for k in ("rss", "anon_rss")
                           if isinstance(victim.get(k), int))  # fmt: skip
        facts.append(
            (
                "who",
                f"{victim.get('role') or 'process'} pid {victim['pid']}"
                + (f" ({victim['name']})" if victim.get("name") else "")
                + (f"; {memory}" if memory else ""),
            )
        )
    killer = death.get("killed_by") or {}
    if killer.get("sender"):
        facts.append(
            ("last signal", f"{killer.get('signal')} from {killer['sender']} (pid {killer.get('sender_pid')})")
        )
    if meta.get("rings"):
        facts.append(("processes", len(meta["rings"])))
    cls = "clean" if cause == "clean_exit" else "dead"
    out = [f'<p class="headline {cls}" id="headline">{esc(headline)}</p>', '<dl class="facts">']
    out += [f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts if v is not None]
    out.append("</dl>")
    evidence = [e for e in death.get("evidence") or [] if isinstance(e, str)]
    if evidence:
        out += ["<h3>Evidence</h3>", '<ol class="evidence">', *[f"<li>{esc(e)}</li>" for e in evidence], "</ol>"]
    levers = [lv for lv in death.get("levers") or [] if isinstance(lv, str)]
    if levers:
        out += ["<h3>What to change</h3>", "<ul>", *[f"<li>{esc(lv)}</li>" for lv in levers], "</ul>"]
    return "\n".join(out)


def _cell(column: str, value: Any) -> str:
    if value is None:
        return '<td data-v="">-</td>'
    if column in BYTE_COLUMNS and isinstance(value, int):
        return f'<td class="num" data-v="{value}">{esc(human_bytes(value))}</td>'
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f'<td class="num" data-v="{value}">{esc(value)}</td>'
    return f'<td data-v="{esc(value)}">{esc(value)}</td>'


def ranks_html(meta: dict[str, Any]) -> str:
    """The per-rank table: one row per ring (``ranks.parquet``'s rows), sortable by the page's script."""
    rows = rank_rows(meta)
    head = "".join(f'<th data-col="{i}">{esc(title)}</th>' for i, (_, title) in enumerate(RANK_COLUMNS))
    body = []
    for r in rows[:MAX_TABLE_ROWS]:
        cls = ' class="dead"' if r.get("cause") not in (None, "clean_exit") and not r.get("collateral_of") else ""
        body.append(f"<tr{cls}>" + "".join(_cell(c, r.get(c)) for c, _ in RANK_COLUMNS) + "</tr>")
    more = (f'<p class="note">{len(rows) - MAX_TABLE_ROWS} more rows in ranks.parquet.</p>'
            if len(rows) > MAX_TABLE_ROWS else "")  # fmt: skip
    return (f'<table id="ranks" class="sortable"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>'
            + more)  # fmt: skip


def _about(meta: dict[str, Any]) -> str:
    ring = _death_ring(meta)
    argv = " ".join(str(a) for a in ring.get("argv") or []) or None
    facts = [
        ("command", argv),
        ("host", ring.get("host")),
        ("started", ring.get("started_at")),
        ("last event", ring.get("last_event_at")),
        ("recovered by", _version(meta.get("recovered_by"))),
    ]
    return '<dl class="facts about">' + "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in facts if v) + "</dl>"


def report_html(table: pa.Table, meta: dict[str, Any], source: str = "") -> str:
    """The whole page for a timeline and its metadata (a bundle's, or rings recovered in memory)."""
    timeline = timeline_data(table, meta)
    pids, _ = drawn_pids(table, meta)
    data = {
        "timeline": timeline,
        "stacks": stack_data(table, pids, timeline["t0"]),
        "allocations": allocation_data(meta),
    }
    script, style = _asset("report.js"), _asset("report.css")
    csp = f"default-src 'none'; script-src {_csp_hash(script)}; style-src {_csp_hash(style)}; img-src data:"
    ring = _death_ring(meta)
    title = f"blackbox report: {ring.get('host') or ''} {_cause(meta)}".strip()
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="{csp}">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{esc(title)}</title>
<style>{style}</style>
</head>
<body>
<header><h1>blackbox report</h1><p class="source">{esc(source)}</p></header>
<main>
<section id="verdict"><h2>Why it died</h2>
{verdict_html(meta)}
{_about(meta)}
</section>
<section id="memory"><h2>Memory over time</h2>
<p class="hint">Drag across the chart to zoom (the stacks below follow the window); double-click to reset; click a
legend entry to hide its line.</p>
<div id="timeline" class="chart"><p class="noscript">The timeline is drawn by the page's script.</p></div>
</section>
<section id="holds"><h2>Who holds the memory</h2>
<div id="alloc"><p class="note">Not recorded: this bundle has no allocation samples (live bytes by allocating
stack); the stacks below are time-sampled, and say what ran, not what allocated.</p></div>
</section>
<section id="doing"><h2>What it was doing</h2>
<p class="hint">Python stacks sampled over time, outermost frame at the top; width is the share of samples. Click a
frame to zoom into it.</p>
<div id="flame" class="flame"></div>
</section>
<section id="ranks-section"><h2>Processes</h2>
<p class="hint">One row per ring; click a heading to sort.</p>
{ranks_html(meta)}
</section>
</main>
<script id="blackbox-data" type="application/json">{json_for_html(data)}</script>
<script>{script}</script>
</body>
</html>
"""


def _version(recovered_by: Any) -> str | None:
    """``recovered_by`` in words: ``blackbox 0.1.0`` (metadata holds ``{"blackbox": "0.1.0"}``)."""
    if isinstance(recovered_by, dict):
        return ", ".join(f"{k} {v}" for k, v in recovered_by.items()) or None
    return None if recovered_by is None else str(recovered_by)


def _cause(meta: dict[str, Any]) -> str:
    first = meta.get("first_death") if meta.get("rings") else meta.get("death")
    return str((first or {}).get("cause") or meta.get("cause") or "")
