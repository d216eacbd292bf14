"""Stack samples folded by function, and speedscope's own file format, as pure functions.

- ``function_frame``: ``fn (/venv/lib/python3.12/site-packages/torch/nn/modules/module.py:1751)`` ->
  ``fn (torch/nn/modules/module.py)``: no line number, and the path from its package (the folder
  after ``site-packages``, ``dist-packages`` or the standard library's ``lib/pythonX.Y``), else the
  file's base name; so that one function is one box of a flame graph;
- ``folded_by_function``: folded stacks (flamegraph.pl, speedscope) with every frame so named;
- ``speedscope_profile``: speedscope's JSON (https://www.speedscope.app/file-format-schema.json):
  one "sampled" profile per sampled thread of each process, the samples in time order, each
  weighted by the seconds until that thread's next sample, so that speedscope's "Time Order" view is
  the job's own timeline.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from .._version import __version__
from ..recovery.kinds import of_kind

SCHEMA = "https://www.speedscope.app/file-format-schema.json"
GAP_INTERVALS = 10  # a sample lasts until the thread's next one, unless this many intervals apart
_FRAME = re.compile(r"^(.*) \((.*):(\d+)\)$")
_PACKAGE_ROOT = re.compile(r"^.*/(?:site-packages|dist-packages|lib/python\d+(?:\.\d+)?t?)/")


def parse_frame(frame: str) -> tuple[str, str | None, int | None]:
    """(function, file, line) of a folded frame ``fn (file:line)``; a placeholder frame is its own name."""
    m = _FRAME.match(frame)
    return (m.group(1), m.group(2), int(m.group(3))) if m else (frame, None, None)


def short_path(path: str) -> str:
    """A file's path from its package (``torch/nn/modules/module.py``), else its base name."""
    rooted = _PACKAGE_ROOT.sub("", path)
    return rooted if rooted != path else path.rsplit("/", 1)[-1]


def function_frame(frame: str) -> str:
    """A frame without its line number and with a short path: one function, one box."""
    name, path, _ = parse_frame(frame)
    return frame if path is None else f"{name} ({short_path(path)})"


def _counts(table: pa.Table) -> Counter[str]:
    rows = of_kind(table, "stack_sample", columns=["detail"])
    return Counter(s for s in rows["detail"].to_pylist() if s)


def folded_by_function(table: pa.Table) -> str:
    """Every stack sample as folded stacks of functions (``function_frame``), most sampled first."""
    counts: Counter[str] = Counter()
    for stack, n in _counts(table).items():
        counts[";".join(function_frame(f) for f in stack.split(";"))] += n
    return "".join(f"{stack} {n}\n" for stack, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def speedscope_profile(table: pa.Table, meta: dict[str, Any], *, by_function: bool = False) -> dict[str, Any]:
    """speedscope's file: a sampled profile per (process, thread), frames shared, weights in seconds."""
    rows = of_kind(table, "stack_sample", columns=["time", "detail", "pid", "rank", "thread"])
    frames: list[dict[str, Any]] = []
    index: dict[str, int] = {}

    def frame_id(frame: str) -> int:
        key = function_frame(frame) if by_function else frame
        found = index.get(key)
        if found is None:
            name, path, line = parse_frame(frame)
            entry: dict[str, Any] = {"name": name}
            if path is not None:
                entry["file"] = short_path(path) if by_function else path
                if not by_function and line is not None:
                    entry["line"] = line
            found = index[key] = len(frames)
            frames.append(entry)
        return found

    ns = rows["time"].cast(pa.int64()).to_numpy(zero_copy_only=False) if rows.num_rows else np.empty(0, np.int64)
    t0 = int(table["time"].cast(pa.int64())[0].as_py()) if table.num_rows else 0
    groups: dict[tuple[Any, Any], list[int]] = {}
    for i, key in enumerate(zip(rows["pid"].to_pylist(), rows["thread"].to_pylist(), strict=True)):
        groups.setdefault(key, []).append(i)
    stacks, ranks = rows["detail"].to_pylist(), rows["rank"].to_pylist()
    profiles = []
    for (pid, thread), members in sorted(groups.items(), key=lambda kv: (ranks[kv[1][0]] is None, kv[0])):
        t = (ns[members] - t0) / 1e9
        gaps = np.diff(t)
        interval = float(np.median(gaps)) if len(gaps) else float(meta.get("sample_interval_s") or 0.1)
        weights = np.append(np.minimum(gaps, GAP_INTERVALS * interval), interval) if len(t) else t
        rank = ranks[members[0]]
        who = f"rank {rank} pid {pid}" if rank is not None else f"pid {pid}"
        start, rounded = round(float(t[0]), 6), [round(float(w), 6) for w in weights]
        profiles.append({
            "type": "sampled",
            "name": f"{who} thread {thread:#x}" if isinstance(thread, int) else who,
            "unit": "seconds",
            "startValue": start,
            "endValue": round(start + sum(rounded), 6),  # the weights' own sum: they fill the profile exactly
            "samples": [[frame_id(f) for f in (stacks[i] or "<no stack>").split(";")] for i in members],
            "weights": rounded,
        })  # fmt: skip
    return {
        "$schema": SCHEMA,
        "shared": {"frames": frames},
        "profiles": profiles,
        "name": f"blackbox: {_title(meta)}",
        "activeProfileIndex": 0,
        "exporter": f"blackbox {__version__}",
    }


def _title(meta: dict[str, Any]) -> str:
    if meta.get("rings"):
        return f"{len(meta['rings'])} processes"
    return f"{meta.get('host')} pid {meta.get('pid')}"
