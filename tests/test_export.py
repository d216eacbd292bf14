"""blackbox export --perfetto: a trace that follows the Chrome trace-event format."""

from __future__ import annotations

import json
import numbers
import signal
from pathlib import Path

from conftest import run_py

from blackbox.cli import main

JOB = """
import os, signal, sys, threading, blackbox
blackbox.arm(sys.argv[1], capacity=4096, sample_interval=0.01)
def side():
    with blackbox.phase("prefetch"):
        blackbox.mark("batch", 1)
t = threading.Thread(target=side); t.start(); t.join()
for step in range(1, 6):
    blackbox.step(step)
    with blackbox.phase("forward"):
        with blackbox.phase("attention"):
            pass
    blackbox.mark("loss_milli", 1000 - step)
blackbox.step(6)
blackbox.active()._event(6, "backward")  # a phase the kill leaves open
os.kill(os.getpid(), signal.SIGKILL)
"""
PHASES = {"B", "E", "X", "i", "I", "C", "M", "P"}
METADATA = {"process_name", "process_sort_index", "thread_name", "thread_sort_index"}


def validate_trace(trace: dict) -> list[str]:
    """Problems with a trace against the trace-event format (empty when it conforms)."""
    problems: list[str] = []
    if not isinstance(trace.get("traceEvents"), list):
        return ["traceEvents is not a list"]
    if trace.get("displayTimeUnit") not in (None, "ms", "ns"):
        problems.append(f"displayTimeUnit {trace.get('displayTimeUnit')!r}")
    stacks: dict[tuple[int, int], list[float]] = {}
    frames = trace.get("stackFrames", {})
    if not isinstance(frames, dict):
        return ["stackFrames is not an object"]
    for fid, frame in frames.items():
        if not isinstance(frame.get("name"), str) or frame.get("parent") == fid:
            problems.append(f"stack frame {fid}: needs a name, and a parent other than itself")
        elif "parent" in frame and frame["parent"] not in frames:
            problems.append(f"stack frame {fid}: parent {frame['parent']} is not a stack frame")
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for i, e in enumerate(trace["traceEvents"]):
        ph = e.get("ph")
        where = f"event {i} ({ph})"
        if ph not in PHASES:
            problems.append(f"{where}: unknown phase")
            continue
        if not isinstance(e.get("pid"), int) or not isinstance(e.get("tid"), int):
            problems.append(f"{where}: pid and tid must be integers")
        if ph == "M":
            if e.get("name") not in METADATA or not isinstance(e.get("args"), dict):
                problems.append(f"{where}: bad metadata event")
            continue
        if not isinstance(e.get("ts"), numbers.Real) or e["ts"] < 0:
            problems.append(f"{where}: ts must be a number >= 0")
        if ph in ("B", "X", "i", "I", "C") and not isinstance(e.get("name"), str):
            problems.append(f"{where}: name must be a string")
        if ph == "X" and not (isinstance(e.get("dur"), numbers.Real) and e["dur"] >= 0):
            problems.append(f"{where}: X needs dur >= 0")
        elif ph == "X":
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        if ph == "P" and str(e.get("sf")) not in frames:
            problems.append(f"{where}: P needs sf naming a stack frame")
        if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
            problems.append(f"{where}: instant scope must be g, p or t")
        if ph == "C" and not (
            isinstance(e.get("args"), dict) and all(isinstance(v, numbers.Real) for v in e["args"].values())
        ):
            problems.append(f"{where}: counter args must be numbers")
        key = (e.get("pid"), e.get("tid"))
        if ph == "B":
            stacks.setdefault(key, []).append(e["ts"])
        elif ph == "E":
            if not stacks.get(key):
                problems.append(f"{where}: E without an open B")
            elif e["ts"] < stacks[key].pop():
                problems.append(f"{where}: E before its B")
    problems += [f"{k}: {len(v)} slices never closed" for k, v in stacks.items() if v]
    for key, spans in slices.items():  # complete events on one track must nest: none overlaps another partly
        open_: list[float] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while open_ and open_[-1] <= start + 1e-6:
                open_.pop()
            if open_ and end > open_[-1] + 1e-6:
                problems.append(f"{key}: X slice {start}..{end} overlaps its parent's end {open_[-1]}")
            open_.append(end)
    return problems


def test_perfetto_trace_of_a_killed_job_is_valid_and_complete(tmp_path: Path) -> None:
    proc = run_py(JOB, str(tmp_path / "rings"), check=False)
    assert proc.returncode == -signal.SIGKILL
    out = tmp_path / "trace.json"
    assert main(["export", "--perfetto", str(tmp_path / "rings"), "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    assert validate_trace(trace) == []
    events = trace["traceEvents"]
    steps = [e["name"] for e in events if e["ph"] == "X" and e["cat"] == "step"]
    assert steps == [f"step {k}" for k in range(1, 7)]
    slices = [e["name"] for e in events if e["ph"] == "B"]
    assert slices.count("forward") == 5 and slices.count("attention") == 5 and "prefetch" in slices
    assert "backward" in slices, "the phase the kill cut is shown, closed at the last event"
    threads = {e["tid"] for e in events if e["ph"] == "B"}
    assert len(threads) == 2, "the prefetch phase is on its own thread's track"
    assert any(e["ph"] == "C" and "host_rss" in e["args"] for e in events)
    assert [e["name"] for e in events if e["ph"] == "i" and e.get("cat") == "death"] == ["death: killed"]
    assert sum(1 for e in events if e["ph"] == "i" and e["name"].startswith("mark: loss_milli")) == 5


def test_validator_catches_broken_traces() -> None:
    bad = {
        "traceEvents": [
            {"ph": "B", "name": "a", "pid": 1, "tid": 1, "ts": 5},
            {"ph": "E", "pid": 1, "tid": 1, "ts": 4},
            {"ph": "E", "pid": 1, "tid": 2, "ts": 4},
            {"ph": "X", "name": "x", "pid": 1, "tid": 1, "ts": 1},
            {"ph": "C", "name": "c", "pid": 1, "tid": 1, "ts": 1, "args": {"v": "high"}},
            {"ph": "Q", "pid": 1, "tid": 1, "ts": 1},
            {"ph": "P", "name": "s", "pid": 1, "tid": 1, "ts": 1, "sf": "9"},
            {"ph": "X", "name": "a", "pid": 1, "tid": 3, "ts": 1, "dur": 5},
            {"ph": "X", "name": "b", "pid": 1, "tid": 3, "ts": 2, "dur": 5},
        ],
        "stackFrames": {"1": {"name": "f", "parent": "7"}},
    }
    assert len(validate_trace(bad)) == 8
