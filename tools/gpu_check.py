"""Every GPU claim of blackbox, proved on one GPU in one command, each against a planted truth.

    python tools/gpu_check.py --out DIR            # on a CUDA machine: under 10 minutes on one H100/H200
    python tools/gpu_check.py --dry-run --out DIR  # the same jobs and checks on a fake CUDA device, on a CPU

The checks (tools/gpucheck/checks.py and rates.py; the jobs they run are tools/gpucheck/job.py):

1. ``oom``: CUDA OOM by exhaustion and by fragmentation: the verdict's kind, its figures beside
   ``torch.cuda.memory_stats()`` and the OOM message; under ``expandable_segments:True`` and
   ``backend:cudaMallocAsync`` one clear note each, no error.
2. ``history``: the allocator history at real rates (a small GPT, a few hundred steps): the actions
   PyTorch counted against those in the ring, per step; lost ones in metadata.json; the drain's cost.
3. ``snapshot``: the snapshot at the first OOM loads in ``torch.cuda._memory_viz`` and renders its HTML.
4. ``sigkill``: SIGKILL mid-step: ``gpu_sample`` rows up to one interval before the kill, verdict ``killed``.
5. ``gpu_leak``: who holds GPU memory: CUDA tensors kept in a list at a known line, named first, within
   25%, after SIGKILL.
6. ``cost``: a real bf16 step of 5-50 ms unarmed, under default ``arm()``, with allocation sampling and
   with the history on, interleaved: the goals are 0.5% (default) and 2% (history).
7. ``unchanged``: a job that never touches CUDA leaves it uninitialised; ``pin_memory=True`` DataLoader
   workers forked after CUDA init run as unarmed.

Each check runs in a process of its own under its own timeout; one that fails or runs over is recorded
and the rest still run. It writes ``DIR/gpu_check.json`` (every figure), ``DIR/gpu_check.md`` (the table
for docs/gpu.md) and ``DIR/memory_viz.html``; rings and bundles go to a scratch folder (``--scratch``,
removed after unless ``--keep``). It fetches nothing and needs what a GPU machine has: its CUDA torch,
numpy and pyarrow, and blackbox from this checkout (``pip install --no-deps .``). Without zstandard the
bundles are written without their raw rings; to bring it, make the wheel here, beside the checkout:

    pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 -d whl zstandard

and on the GPU machine ``pip install --no-index --no-deps whl/*.whl``. Exit status 0 when every check held.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "gpucheck"))

CHECKS = [  # name, title, the seconds it may take
    ("oom", "CUDA OOM: exhaustion and fragmentation", 150),
    ("history", "Allocator history at real rates", 240),
    ("snapshot", "The snapshot at the first OOM in memory_viz", 100),
    ("sigkill", "SIGKILL mid-step: GPU memory kept", 100),
    ("gpu_leak", "Who holds GPU memory, after SIGKILL", 100),
    ("cost", "The recorder's cost on a real step", 240),
    ("unchanged", "The job is never changed", 120),
]
BUDGET_S = 570.0  # the whole check, under ten minutes
MIN_LEFT_S = 20.0  # a check is not started with less than this left


def _check_function(name: str) -> Any:
    import checks
    import rates

    return {"oom": checks.check_oom, "history": rates.check_history, "snapshot": checks.check_snapshot,
            "sigkill": checks.check_sigkill, "gpu_leak": checks.check_gpu_leak, "cost": rates.check_cost,
            "unchanged": checks.check_unchanged}[name]  # fmt: skip


def run_one(name: str, args: argparse.Namespace) -> int:
    """One check, in this process (a child of the command): its result as JSON in the scratch folder."""
    from runner import Ctx

    scratch = Path(args.scratch) / name
    scratch.mkdir(parents=True, exist_ok=True)
    ctx = Ctx(fake=args.dry_run, scratch=scratch, out=Path(args.out), deadline=time.monotonic() + args.seconds,
              raw=_has("zstandard"))  # fmt: skip
    try:
        result = _check_function(name)(ctx)
    except Exception as exc:
        import traceback

        result = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-2000:]}
    (scratch / "result.json").write_text(json.dumps(result, default=str))
    return 0


def _has(module: str) -> bool:
    try:
        __import__(module)
    except ImportError:
        return False
    return True


PROBE = r"""
import json, platform, sys
out = {"python": platform.python_version()}
for m in ("numpy", "pyarrow", "zstandard", "blackbox"):
    try:
        out[m] = __import__(m).__version__
    except Exception as exc:
        out[m] = None
fake = sys.argv[1] == "1"
if not fake:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
    out["cuda_available"] = torch.cuda.is_available()
    if out["cuda_available"]:
        p = torch.cuda.get_device_properties(0)
        out["device"] = p.name
        out["device_memory"] = p.total_memory
        out["device_count"] = torch.cuda.device_count()
else:
    out["device"] = "fake CUDA device (dry run, tools/gpucheck/fake_cuda.py)"
print(json.dumps(out))
"""


def environment(args: argparse.Namespace) -> dict[str, Any]:
    """What ran: the machine, the device, the driver, the versions (a probe process of its own)."""
    env: dict[str, Any] = {"mode": "dry run (fake CUDA device)" if args.dry_run else "GPU"}
    try:
        r = subprocess.run([sys.executable, "-c", PROBE, "1" if args.dry_run else "0"], capture_output=True,
                           text=True, timeout=120)  # fmt: skip
        env.update(json.loads(r.stdout) if r.returncode == 0 else {"probe_error": r.stderr[-500:]})
    except (subprocess.TimeoutExpired, ValueError) as exc:
        env["probe_error"] = str(exc)
    if not args.dry_run and shutil.which("nvidia-smi"):
        try:
            r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)  # fmt: skip
            env["driver"] = r.stdout.strip().splitlines()[0] if r.stdout.strip() else None
        except (subprocess.TimeoutExpired, OSError):
            env["driver"] = None
    try:
        r = subprocess.run(["git", "-C", str(HERE.parent), "rev-parse", "--short", "HEAD"], capture_output=True,
                           text=True, timeout=10)  # fmt: skip
        env["commit"] = r.stdout.strip() or None
    except (subprocess.TimeoutExpired, OSError):
        env["commit"] = None
    env["commit"] = args.label or env.get("commit")
    return env


def run_all(args: argparse.Namespace) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="gpucheck-"))
    t0 = time.monotonic()
    report: dict[str, Any] = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                              "environment": environment(args), "checks": []}  # fmt: skip
    only = set(args.only.split(",")) if args.only else None
    for name, title, seconds in CHECKS:
        if only is not None and name not in only:
            continue
        left = args.budget - (time.monotonic() - t0)
        entry: dict[str, Any] = {"name": name, "title": title}
        if left < MIN_LEFT_S:
            entry.update(ok=False, error=f"not run: {left:.0f} s of the {args.budget:.0f} s budget left")
        else:
            cap = args.check_timeout if args.check_timeout is not None else float(seconds)
            entry.update(_run_child(name, args, scratch, min(float(seconds), cap, left)))
        report["checks"].append(entry)
        print(f"gpu_check: {name}: {'held' if entry.get('ok') else 'FAILED'} ({entry.get('seconds', 0):.1f} s)"
              + (f": {entry['error']}" if entry.get("error") else ""), flush=True)  # fmt: skip
    report["seconds"] = round(time.monotonic() - t0, 1)
    report["all_held"] = all(c.get("ok") for c in report["checks"])
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "gpu_check.md").write_text(markdown(report))
    if not args.keep and not args.scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"gpu_check: {sum(bool(c.get('ok')) for c in report['checks'])} of {len(report['checks'])} held in "
          f"{report['seconds']} s; {out / 'gpu_check.md'}")  # fmt: skip
    return 0 if report["all_held"] else 1


def _run_child(name: str, args: argparse.Namespace, scratch: Path, seconds: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--one", name, "--out", str(args.out), "--scratch", str(scratch),
           "--seconds", str(seconds)] + (["--dry-run"] if args.dry_run else [])  # fmt: skip
    t = time.monotonic()
    proc = subprocess.Popen(cmd, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        output, _ = proc.communicate(timeout=seconds + 5)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return {"ok": False, "error": f"ran past its {seconds:.0f} s", "seconds": round(time.monotonic() - t, 1)}
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever its jobs left behind
        except OSError:
            pass
    result_file = scratch / name / "result.json"
    if not result_file.exists():
        return {"ok": False, "error": f"no result (exit {proc.returncode}): {output[-1500:]}",
                "seconds": round(time.monotonic() - t, 1)}  # fmt: skip
    result: dict[str, Any] = json.loads(result_file.read_text())
    result["seconds"] = round(time.monotonic() - t, 1)
    return result


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    device = env.get("device") or "no CUDA device"
    lines = [
        f"GPU check of {report['date']}: {env.get('mode')}, {device}"
        + (f" ({env['device_memory'] / 2**30:.0f} GiB)" if env.get("device_memory") else "")
        + (f", driver {env['driver']}" if env.get("driver") else "")
        + f"; torch {env.get('torch', '-')} (CUDA {env.get('cuda', '-')}), Python {env.get('python')}, "
        f"numpy {env.get('numpy')}, pyarrow {env.get('pyarrow')}, zstandard {env.get('zstandard') or 'absent'}; "
        f"blackbox {env.get('blackbox')} at {env.get('commit') or '?'}; {report['seconds']} s in all.",
        "",
        "| # | check | planted truth | blackbox's account | held |",
        "|---|---|---|---|---|",
    ]
    for i, c in enumerate(report["checks"], 1):
        held = "yes" if c.get("ok") else ("**no**" if "error" not in c else "**error**")
        found = c.get("found") or c.get("error", "")
        lines.append(f"| {i} | {c['title']} | {_cell(c.get('truth', ''))} | {_cell(found)} | {held} |")
    notes = [(c["title"], n) for c in report["checks"] for n in c.get("notes") or []]
    if notes:
        lines += ["", *(f"- {title}: {note}" for title, note in notes)]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="the report's folder: gpu_check.json, gpu_check.md, memory_viz.html")
    p.add_argument("--dry-run", action="store_true", help="a fake CUDA device on the CPU: the same jobs and checks")
    p.add_argument("--only", help="a comma-separated list of checks: " + ",".join(c[0] for c in CHECKS))
    p.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for all checks (default %(default)s)")
    p.add_argument("--check-timeout", type=float, help="seconds at most for each check (default: its own, 100-240)")
    p.add_argument("--scratch", help="where the rings and bundles go (default: a temporary folder, removed)")
    p.add_argument("--keep", action="store_true", help="keep the temporary scratch folder")
    p.add_argument("--label", help="what to call this checkout in the report (default: git's short hash)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=120.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.one:
        return run_one(args.one, args)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
