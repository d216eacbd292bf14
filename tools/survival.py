"""What survives a hard death: blackbox against stormlog and PyTorch's memory history, measured.

    .venv/bin/python tools/survival.py      # as root, for the kernel OOM kill in a memory cgroup

One leaking training-like job records every step three ways at once: blackbox
(armed), stormlog's OOMFlightRecorder (its in-memory ring, dumped only when the
process lives to call dump()) plus stormlog's opt-in append-only JSONL telemetry
sink (its one crash-tolerant path), and PyTorch's allocator memory history. The
job is killed twice: by SIGKILL, and by the kernel OOM killer in a memory cgroup
(cgroup v1 or v2; skipped with the reason where the kernel refuses). Then we
count what each left on disk. A tool that is not installed is reported as such.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from cgroup_util import CgroupRefused, child_memory_cgroup, join  # noqa: E402

JOB = r"""
import json, os, sys, time
work = sys.argv[1]
import blackbox
os.makedirs(os.path.join(work, "rings"), exist_ok=True)
blackbox.arm(os.path.join(work, "rings"), sample_interval=0.05)
notes = {}
storm = sink = None
try:
    from stormlog import OOMFlightRecorder, OOMFlightRecorderConfig
    from stormlog.telemetry_sink import AppendOnlyTelemetrySink, TelemetrySinkConfig
    storm = OOMFlightRecorder(OOMFlightRecorderConfig(enabled=True, dump_dir=os.path.join(work, "oom_dumps")))
    sink = AppendOnlyTelemetrySink(TelemetrySinkConfig(root_dir=os.path.join(work, "sink")))
except ImportError as exc:
    notes["stormlog"] = f"not installed ({exc})"
try:
    import torch
    torch.cuda.memory._record_memory_history(max_entries=100000)
    notes["torch"] = "recording"
except ImportError:
    notes["torch"] = "torch not installed"
except Exception as exc:
    notes["torch"] = f"{type(exc).__name__}: {exc}"[:120]
print(json.dumps(notes), flush=True)
kept = []
for step in range(1, 1000000):
    blackbox.step(step)
    event = {"ts_ns": time.time_ns(), "event_type": "sample", "step": step, "bytes": len(kept) << 22}
    if storm is not None:
        storm.record_event(event)
        sink.append(event)
    kept.append(bytearray(4 << 20))  # the leak: 4 MiB a step
    print(step, flush=True)
    time.sleep(0.01)
"""


def run(work: Path, kill: str, cgroup: Path | None) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))

    proc = subprocess.Popen([sys.executable, "-c", JOB, str(work)], stdout=subprocess.PIPE, text=True, env=env,
                            preexec_fn=(lambda: join(cgroup)) if cgroup is not None else None)  # fmt: skip
    assert proc.stdout is not None
    notes = json.loads(proc.stdout.readline())
    if kill == "SIGKILL":
        time.sleep(1.5)
        os.kill(proc.pid, signal.SIGKILL)
    out = proc.stdout.read()
    proc.wait()
    printed = [int(x) for x in out.split()]
    from blackbox.recovery.pipeline import recover_rings

    recovered = recover_rings([work / "rings"])
    table, meta = recovered.table, recovered.meta
    steps = table["step"].drop_null()
    result: dict[str, object] = {
        "exit": proc.returncode,
        "printed_last_step": printed[-1] if printed else None,
        "blackbox_events": table.num_rows,
        "blackbox_last_step": max(steps.to_pylist()) if len(steps) else None,
        "blackbox_cause": meta["death"]["cause"],
        "notes": notes,
    }
    if "stormlog" not in notes:
        dumps = list((work / "oom_dumps").glob("*")) if (work / "oom_dumps").exists() else []
        lines = []
        for seg in sorted((work / "sink").glob("segment-*.jsonl")):
            for line in seg.read_text().splitlines():
                try:
                    lines.append(json.loads(line))
                except ValueError:
                    pass  # a torn last line
        sink_steps = [r.get("step") for r in lines if isinstance(r.get("step"), int)]
        result.update(
            stormlog_recorder_files=len(dumps),
            stormlog_sink_events=len(sink_steps),
            stormlog_sink_last_step=max(sink_steps) if sink_steps else None,
        )
    torch_files = [p.name for p in work.rglob("*.pickle")]
    result["torch_history_files"] = len(torch_files)
    return result


def main() -> int:
    rows = []
    with tempfile.TemporaryDirectory(dir=os.environ.get("BLACKBOX_DIR") or "/var/tmp") as d:
        rows.append(("SIGKILL", run(Path(d) / "sigkill", "SIGKILL", None)))
        try:
            with child_memory_cgroup(400 << 20, "blackbox-survival") as (cg, version):
                rows.append((f"kernel OOM kill (cgroup v{version}, 400 MiB)", run(Path(d) / "oom", "oom", cg)))
        except CgroupRefused as exc:
            print(f"kernel OOM kill skipped: {exc}")
    print("| death | job's last printed step | blackbox recovers | stormlog flight recorder leaves | "
          "stormlog JSONL sink (opt-in) leaves | PyTorch memory history leaves |")  # fmt: skip
    print("|---|---:|---|---|---|---|")
    for name, r in rows:
        notes = r["notes"]
        assert isinstance(notes, dict)
        storm = notes.get("stormlog")
        rec = f"{r['stormlog_recorder_files']} files" if not storm else f"- ({storm})"
        sink = f"{r['stormlog_sink_events']} events, last step {r['stormlog_sink_last_step']}" if not storm else "-"
        torch_note = notes.get("torch", "")
        hist = f"{r['torch_history_files']} files ({torch_note})"
        print(f"| {name} (exit {r['exit']}) | {r['printed_last_step']} | {r['blackbox_events']} events, last step "
              f"{r['blackbox_last_step']}, cause `{r['blackbox_cause']}` | {rec} | {sink} | {hist} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
