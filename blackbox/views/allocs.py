"""summary.md's "Who holds the memory": allocation sites by live bytes, as pure functions.

Per ring (``allocation_sections``, from its ``allocations`` metadata) and across
the rings of a job (``job_allocation_sections``: every process's largest sites,
workers' included). Sites are named innermost user frame first; the estimate
comes with its 95% error (recovery/allocs.py says how it is computed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._units import human_bytes
from ..recovery.allocs import is_import_frame, is_stdlib_frame, ring_sites
from ..recovery.crash import short_frame
from .stacks import innermost_first
from .text import shown

SHOWN = 8
INT64_MAX = (1 << 63) - 1  # a pprof sample's value is an int64: more (a hostile ring's weights) would wrap


def _growth(site: dict[str, Any]) -> str:
    if site.get("growth_by") == "step" and site.get("growth_per_step") is not None:
        return f"{human_bytes(site['growth_per_step'])}/step"
    if site.get("growth_per_s") is not None:
        return f"{human_bytes(site['growth_per_s'])}/s"
    return "-"


def _where(site: dict[str, Any]) -> str:
    line = (site.get("line") or "").replace("|", "\\|").replace("`", "'")
    where = f"`{short_frame(site['site']).replace('|', chr(92) + '|')}`" + (f": `{line}`" if line else "")
    return where + (" (imports)" if site.get("imports") else "")


def _held(site: dict[str, Any]) -> str:
    """Where a site's live bytes came from: resident since start-up, in the last step, grown."""
    live, parts = site.get("live_bytes") or 0, []
    for key, word in (("resident_bytes", "start-up"), ("last_step_bytes", "last step")):
        n = site.get(key)
        if n and live and n >= 0.05 * live:
            parts.append(f"{100 * n / live:.0f}% {word}")
    return ", ".join(parts) or "-"


def _cells(site: dict[str, Any]) -> list[str]:
    return [
        _where(site),
        f"{human_bytes(site['live_bytes'])} ± {human_bytes(site['error_bytes'])}",
        _held(site),
        _growth(site) if site.get("grows", True) else "-",
        "-" if site.get("first_step") is None else str(site["first_step"]),
        "/".join(site.get("domains") or []) or "-",
    ]


def _thread(site: dict[str, Any]) -> str:
    """The allocating thread's name as a table cell: a ``|`` in it (the writer's to choose) opens no column."""
    return (site.get("thread") or "-").replace("|", "\\|")


def shown_stack(folded: str | None) -> str:
    """A site's allocating stack for summary.md, innermost first: the import machinery's frames hidden, and the
    standard library's never heading it (they are dropped until the first frame of the job or a library)."""
    frames = [f for f in (folded or "").split(";") if f and not is_import_frame(f)]
    while len(frames) > 1 and is_stdlib_frame(frames[-1]):
        frames.pop()
    return innermost_first(";".join(frames))


def _totals(report: dict[str, Any]) -> str:
    live = report.get("live_bytes") or 0
    parts = []
    ran = report.get("last_step_ran_s")
    last = (f"allocated after the last step began (no step for {ran:.1f} s: its loop had ended, or something else "
            "ran)" if isinstance(ran, (int, float)) else "allocated in the last step (in flight)")  # fmt: skip
    for key, word in (("resident_bytes", "resident since start-up (before the first step: imports, the model, "
                                          "the optimizer's state)"),
                      ("last_step_bytes", last)):  # fmt: skip
        if report.get(key) is not None:
            parts.append(f"{human_bytes(report[key])} {word}")
    grown = sum(int(g.get("grown_bytes") or 0) for g in report.get("grew") or [])
    if report.get("last_step_bytes") is not None:
        parts.append(f"{human_bytes(max(0, live - (report.get('resident_bytes') or 0) - report['last_step_bytes']))}"
                     " allocated in the steps between")  # fmt: skip
    return ("; of it " + ", ".join(parts) if parts else "") + (f" (the sites that grew: {human_bytes(grown)})"
                                                                if grown else "")  # fmt: skip


def _raised(report: dict[str, Any]) -> str:
    raised = report.get("mean_bytes_raised_to")
    return f", raised to {human_bytes(raised)} as the job allocated faster" if raised else ""


def coverage_line(cov: dict[str, Any] | None) -> list[str]:
    """What the samples account for against the process's anonymous memory at the end, and why not all."""
    if not cov:
        return []
    anon, sampled = cov["anon_rss"], cov["sampled_bytes"]
    if sampled > anon:
        return [f"The sampled blocks ({human_bytes(sampled)}) exceed the process's anonymous resident memory at its "
                f"last sample ({human_bytes(anon)}): {cov['reasons'][0]}.", ""]  # fmt: skip
    share = 100 * sampled / anon if anon else 0.0
    return [f"The samples account for {human_bytes(sampled)} of the {human_bytes(anon)} of anonymous resident "
            f"memory at the last sample ({share:.0f}%); {human_bytes(cov['unaccounted_bytes'])} is not accounted "
            "for: " + "; ".join(cov.get("reasons") or []) + ".", ""]  # fmt: skip


NOT_RECORDED = (
    "Not recorded in this process: {why}. Allocation sampling is on by default; see README, \"Who holds the memory\"."
)


def allocation_sections(report: dict[str, Any] | None, role: str | None = None) -> list[str]:
    """summary.md lines for one ring's ``allocations`` (``recovery.allocs.live_sites``): who holds the memory,
    who grew, and what the samples do not cover; "not recorded" (never "0 B") where nothing was sampled."""
    if not report:
        return []
    if report.get("recorded") is False:
        return ["## Who holds the memory", "", NOT_RECORDED.format(why=report.get("why") or "unknown"), ""]
    sites = report.get("sites") or []
    lines = [
        "## Who holds the memory",
        "",
        f"Allocations sampled by bytes (one sample per {human_bytes(report.get('mean_bytes'))} on average"
        f"{_raised(report)}, each weighted so totals are unbiased): {human_bytes(report['live_bytes'])} ± "
        f"{human_bytes(report['error_bytes'])} (95%) live in {report['sampled_blocks']} sampled blocks at the "
        f"end, from {report.get('site_count', len(sites))} sites{_totals(report)}.",
        "",
        *coverage_line(report.get("coverage")),
    ]
    if not sites:
        return [*lines, "No sampled allocation was live at the end.", ""]
    lines += ["Who holds it, largest first (an import's memory after the job's own):", "",
              "| site | live | of it | growth | first step | allocator | thread |",
              "|---|---:|---|---:|---:|---|---|"]  # fmt: skip
    lines += ["| " + " | ".join([*_cells(s), _thread(s)]) + " |" for s in sites[:SHOWN]]
    stack = sites[0].get("stack")  # (none where a reader did not put allocations.parquet's stacks back)
    lines += ["", f"Allocating stack of the largest: {shown_stack(stack)}.", ""] if isinstance(stack, str) else [""]
    return [*lines, *_grew_lines(report)]


def _grew_lines(report: dict[str, Any]) -> list[str]:
    grew = report.get("grew") or []
    if not grew:
        return ["Who grew: no site grew across the steps (or, for threads without steps, over "
                "several sample intervals) beyond its sampling error.", ""]  # fmt: skip
    outside = ("outside the last step, or by the second after it began" if report.get("last_step_ran_s") is not None
               else "outside the last step")  # fmt: skip
    lines = [f"Who grew, most first (live bytes allocated since start-up, {outside}):", "",
             "| site | grew | growth | since step | thread |", "|---|---:|---:|---:|---|"]  # fmt: skip
    lines += [f"| {_where(g)} | {human_bytes(g['grown_bytes'])} ± {human_bytes(g['grown_error_bytes'])} | "
              f"{_growth(g)} | {'-' if g.get('first_step') is None else g['first_step']} | {_thread(g)} |"
              for g in grew]  # fmt: skip
    return [*lines, ""]


def folded_site(site: dict[str, Any]) -> str:
    """One allocation site a folded helper kept (``folded.jsonl``), for a summary line."""
    line = (site.get("line") or "").replace("`", "'")
    return (f"`{short_frame(site['site'])}`" + (f": `{line}`" if line else "") +
            f", {human_bytes(site['live_bytes'])} ± {human_bytes(site['error_bytes'])} (thread {site['thread']})")


def job_allocation_sections(rings: Iterable[dict[str, Any]]) -> list[str]:
    """summary.md lines across a job's rings: the largest sites of every process, workers' included (their
    text escaped, ``text``)."""
    sites = shown(ring_sites(rings))
    if not sites:
        return []
    lines = [
        "## Who holds the memory, in every process",
        "",
        "Allocations sampled by bytes in each process (live at its end, 95% error), largest first:",
        "",
        "| site | live | of it | growth | first step | allocator | process | thread |",
        "|---|---:|---|---:|---:|---|---|---|",
    ]
    for s in sites[:SHOWN]:
        who = f"{s.get('role') or 'process'} pid {s.get('pid')}" + (f" rank {s['rank']}" if s.get("rank") is not None
                                                                     else "")  # fmt: skip
        lines.append("| " + " | ".join([*_cells(s), who, _thread(s)]) + " |")
    return [*lines, ""]


def _live_stacks(meta: dict[str, Any]) -> list[tuple[str, int]]:
    """(folded stack, live bytes) of a ring's metadata, or of every ring of a bundle's (each stack then
    rooted at a frame naming its process)."""
    rings = meta.get("rings")
    if not rings:
        return [(s["stack"], int(s["live_bytes"])) for s in (meta.get("allocations") or {}).get("stacks") or []]
    out: list[tuple[str, int]] = []
    for m in rings:
        root = f"{m.get('role') or 'process'} pid {m.get('pid')}" + (f" rank {m['rank']}" if m.get("rank") is not None
                                                                     else "")  # fmt: skip
        out += [
            (f"{root};{s['stack']}", int(s["live_bytes"])) for s in (m.get("allocations") or {}).get("stacks") or []
        ]
    return out


def folded_live(meta: dict[str, Any]) -> str:
    """Live bytes by allocating stack as folded stacks (``outer;...;inner bytes``), largest first: what
    flamegraph.pl and speedscope read as is."""
    stacks = sorted(_live_stacks(meta), key=lambda kv: (-kv[1], kv[0]))
    return "".join(f"{stack} {n}\n" for stack, n in stacks if n > 0)


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes | int) -> bytes:
    """One protobuf field: an int as a varint, bytes length-delimited."""
    if isinstance(payload, int):
        return _varint(number << 3) + _varint(payload)
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def pprof_live(meta: dict[str, Any], mean_bytes: int | None = None) -> bytes:
    """Live bytes by allocating stack as a pprof profile (profile.proto, gzipped): one sample type,
    ``inuse_space`` in bytes, each location one Python frame (``go tool pprof``, speedscope, Pyroscope)."""
    import gzip
    import re

    strings: dict[str, int] = {"": 0}
    functions: dict[tuple[str, str], int] = {}
    locations: dict[tuple[int, int], int] = {}

    def sid(text: str) -> int:
        return strings.setdefault(text, len(strings))

    body = bytearray()
    body += _field(1, _field(1, sid("inuse_space")) + _field(2, sid("bytes")))
    for stack, n in _live_stacks(meta):
        ids = []
        for frame in reversed(stack.split(";")):  # pprof: the leaf first
            m = re.fullmatch(r"(.*) \((.*):(\d+)\)", frame)
            name, file, line = (m.group(1), m.group(2), int(m.group(3))) if m else (frame, "", 0)
            fid = functions.setdefault((name, file), len(functions) + 1)
            ids.append(locations.setdefault((fid, line), len(locations) + 1))
        packed = b"".join(_varint(i) for i in ids)
        body += _field(2, _field(1, packed) + _field(2, _varint(min(n, INT64_MAX))))  # an int64 there
    for (fid, line), lid in locations.items():
        body += _field(4, _field(1, lid) + _field(4, _field(1, fid) + _field(2, line)))
    for (name, file), fid in functions.items():
        body += _field(5, _field(1, fid) + _field(2, sid(name)) + _field(3, sid(name)) + _field(4, sid(file)))
    body += _field(11, _field(1, sid("space")) + _field(2, sid("bytes")))
    if mean_bytes:
        body += _field(12, mean_bytes)
    body += b"".join(_field(6, text.encode("utf-8")) for text in strings)
    return gzip.compress(bytes(body), mtime=0)
