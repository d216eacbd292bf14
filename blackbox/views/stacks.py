"""Stack samples for people and other tools, as pure functions.

- ``stack_sections``: summary.md's "What it was doing" (time-sampled: what ran, never what allocated);
- ``folded_stacks``: the folded-stacks text that flamegraph.pl and speedscope read as is
  (one line per distinct stack: frames outermost first joined by ``;``, a space, the count);
- ``trace_stacks``: Perfetto / Chrome trace events for one process's stack samples.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any
from urllib.parse import quote

import numpy as np
import pyarrow as pa

from ..recovery.crash import short_frame
from ..recovery.kinds import of_kind

SHOWN_FRAMES = 6  # innermost frames shown per stack in summary.md
GAP_INTERVALS = 10  # trace: a sampled stack lasts until the next sample unless this many intervals apart




def innermost_first(folded: str | None, shown: int = SHOWN_FRAMES) -> str:
    """A folded stack for a Markdown cell: innermost frame first, short file names, ``←`` between."""
    if not folded:
        return "-"
    frames = [short_frame(f) for f in reversed(folded.split(";"))]
    more = len(frames) - shown
    text = " ← ".join(f"`{f.replace('`', chr(39))}`" for f in frames[:shown])
    return (text + f" ← … ({more} more)" if more > 0 else text).replace("|", "\\|")


CRASH_FRAMES = 20  # frames of the crashing thread listed in summary.md (the file holds them all)


def crash_section(crash: dict[str, Any] | None, folder: str = "", *, shutdown: bool = False) -> list[str]:
    """summary.md's account of a native crash (``native_crash``, ``recovery.crash``): the signal, the
    crashing thread's Python stack, and the file in the bundle (``folder``: where that bundle is, from the
    summary's own) that holds every thread's; ``shutdown``: the same of ``shutdown_stacks``."""
    if not crash:
        return []
    name = str(crash.get("file") or "")
    signal = f" ({crash['signal']})" if crash.get("signal") else ""
    ours = re.fullmatch(r"crash-\d+\.txt", name)  # no planted link; a reference link (``text.inert``)
    where = f"[`{name}`][{name}]" if ours else f"`{name}`"
    if shutdown:
        lines = [f"## Where it was when {crash.get('signal') or 'the signal'} ended its shutdown", "",
                 f"Every thread's Python stack at that signal, after its clean end, is in {where}.", ""]  # fmt: skip
    else:
        lines = ["## The crash", "", f"Every thread's Python stack at the crash{signal}, as faulthandler writes it, "
                 f"is in {where}: \"{crash.get('first_line') or ''}\".", ""]  # fmt: skip
    if ours:
        lines += [f"[{name}]: {quote(folder + name)}", ""]
    lines += _native_frame(crash.get("native_frame"))
    stack = crash.get("stack")
    if not stack:
        return [*lines, "No Python frame was running in the thread that crashed.", ""]
    frames = list(reversed(str(stack).split(";")))
    lines += [f"The {'thread that took it' if shutdown else 'crashing thread'}, innermost frame first:", ""]
    lines += [f"{i}. `{f.replace('`', chr(39))}`" for i, f in enumerate(frames[:CRASH_FRAMES], 1)]
    if len(frames) > CRASH_FRAMES:
        lines.append(f"{CRASH_FRAMES + 1}. ... and {len(frames) - CRASH_FRAMES} more (in `{name}`)")
    return [*lines, ""]


def _native_frame(frame: Any) -> list[str]:
    """The faulting instruction and the file that holds it (``native_frame`` of ``recovery.crash``)."""
    if not isinstance(frame, dict) or not frame.get("instruction"):
        return []
    ip, file, offset, mapping = (str(frame.get(k) or "").replace("`", "'")[:400]
                                 for k in ("instruction", "file", "offset", "mapping"))  # fmt: skip
    if not file:
        return [f"The faulting instruction, `{ip}`, is in `{mapping or 'no mapping'}`.", ""]
    return [f"The faulting instruction, `{ip}`, is in `{file}` at file offset `{offset}`: "
            f"`addr2line -f -e {file} {offset}` names its function.", ""]  # fmt: skip


def stack_sections(report: dict[str, Any] | None) -> list[str]:
    """summary.md lines for a ring's ``stacks`` metadata (``recovery.stacks.stack_report``)."""
    if not report:
        return []
    threads = report.get("threads") or []
    sampled = ", ".join(f"`{t}`" for t in threads) if threads else "none"
    lines = [
        "## What it was doing",
        "",
        f"Python stacks sampled in the last {report['window_s']:g} s before the last event, by share of "
        "each thread's samples (innermost frame first). Time-sampled: they show what ran, not what "
        f"allocated. Threads sampled: {sampled} (more with `arm(stack_threads=...)`).",
        "",
        "| share | samples | thread | stack |",
        "|---:|---:|---|---|",
    ]
    lines += [f"| {100 * e['share']:.0f}% | {e['samples']} | {e['thread'] or '-'} | {innermost_first(e['stack'])} |"
              for e in report.get("last") or []]  # fmt: skip
    return [*lines, ""]


def folded_stacks(table: pa.Table) -> str:
    """Every stack sample of a timeline as folded stacks: ``outer;...;inner count`` per distinct stack,
    most sampled first. Samples whose stack was lost keep their placeholder frame. Counted through the
    column's dictionary: each distinct stack's text is taken once, not once per sample."""
    column = of_kind(table, "stack_sample", columns=["detail"]).unify_dictionaries().combine_chunks()["detail"]
    counts: Counter[str] = Counter()
    for chunk in column.chunks:
        if not pa.types.is_dictionary(chunk.type):
            chunk = chunk.dictionary_encode()
        codes = chunk.indices.drop_null().to_numpy(zero_copy_only=False)
        per_code = np.bincount(codes, minlength=len(chunk.dictionary))
        for code in np.flatnonzero(per_code).tolist():
            stack = chunk.dictionary[code].as_py()
            if stack:
                counts[stack] += int(per_code[code])
    return "".join(f"{stack} {n}\n" for stack, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def trace_stacks(
    samples: list[tuple[float, int, str | None, str | None]],
    pid: int,
    frames: dict[str, dict[str, Any]],
    first_tid: int,
    interval_us: float,
    end_us: float,
) -> list[dict[str, Any]]:
    """Trace events for one process's stack samples ``(ts in us, thread, thread name, folded stack)``.

    Two renderings: a flame chart track per sampled thread (nested ``X`` slices, one per frame, as
    long as consecutive samples share it; what ui.perfetto.dev draws), and the trace-event format's
    sample events (``P`` with ``sf``, naming entries that this adds to ``frames``, the trace's
    ``stackFrames``). A sample lasts until the thread's next one; after a gap of more than
    ``GAP_INTERVALS`` sample intervals (a slow tick, stacks turned off), one interval.
    """
    out: list[dict[str, Any]] = []
    by_thread: dict[int, list[tuple[float, list[str]]]] = {}
    names: dict[int, str | None] = {}
    tids: dict[int, int] = {}
    for ts, thread, name, folded in samples:
        stack = folded.split(";") if folded else []
        by_thread.setdefault(thread, []).append((ts, stack))
        names.setdefault(thread, name)
        tid = tids.setdefault(thread, first_tid + len(tids))
        out.append({"ph": "P", "name": "stack sample", "cat": "stack", "pid": pid, "tid": tid, "ts": ts,
                    "sf": _frame_id(frames, stack)})  # fmt: skip
    for thread, series in by_thread.items():
        out.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tids[thread],
                    "args": {"name": f"stacks: {names[thread] or 'thread'} {thread:#x}"}})  # fmt: skip
        out += _flame(series, pid, tids[thread], interval_us, end_us)
    return out


def stack_frames(frames: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The trace's ``stackFrames`` object (id -> name, category, parent) from ``trace_stacks``'s entries."""
    return {f["id"]: {k: f[k] for k in ("name", "category", "parent") if k in f} for f in frames.values()}


def _frame_id(frames: dict[str, dict[str, Any]], stack: list[str]) -> str:
    """The ``stackFrames`` id of the innermost frame of ``stack``, adding the entries it needs."""
    parent: str | None = None
    for name in stack or ["<no frames>"]:
        key = f"{parent}\0{name}"
        found = frames.get(key)
        if found is None:
            found = frames[key] = {"id": str(len(frames) + 1), "name": name, "category": "python"}
            if parent is not None:
                found["parent"] = parent
        parent = found["id"]
    assert parent is not None
    return parent


def _flame(series: list[tuple[float, list[str]]], pid: int, tid: int, interval_us: float, end_us: float
           ) -> list[dict[str, Any]]:  # fmt: skip
    """Nested X slices: a frame stays open while consecutive samples share the stack up to it."""
    out: list[dict[str, Any]] = []
    open_: list[tuple[str, float]] = []  # (frame, start), outermost first

    def close(depth: int, at: float) -> None:
        while len(open_) > depth:
            name, start = open_.pop()
            out.append({"ph": "X", "name": name, "cat": "stack", "pid": pid, "tid": tid, "ts": start,
                        "dur": max(0.0, at - start)})  # fmt: skip

    last = None
    for ts, stack in series:
        if last is not None and ts - last > GAP_INTERVALS * interval_us:
            close(0, last + interval_us)  # a gap in the samples: the stack is unknown in between
        same = 0
        while same < min(len(open_), len(stack)) and open_[same][0] == stack[same]:
            same += 1
        close(same, ts)
        open_ += [(name, ts) for name in stack[same:]]
        last = ts
    if last is not None:
        close(0, min(end_us, last + interval_us) if end_us > last else last)
    return out
