"""The GPU check's claims, each held against a planted truth (issue: "Ready for the first GPU").

A check returns ``{"ok", "truth", "found", "figures", "notes"}``: ``truth`` is what was planted, ``found``
what blackbox said of it, ``figures`` every number both sides gave. ``ok`` is the claim held; a check
that cannot reach a verdict raises, and gpu_check.py records why and goes on with the next.
"""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

from runner import (
    HERE,
    CheckError,
    Ctx,
    blackbox_warnings,
    kill_when_ready,
    mib,
    near,
    recover,
    rows,
    run_job,
    time_s,
    truth,
)

MiB = 1 << 20
MESSAGE_SLACK = 6 * MiB  # PyTorch's message prints sizes with two decimals: 0.005 GiB is 5.1 MiB


# ---------------------------------------------------------------- 1. OOM: exhaustion and fragmentation
OOM_VARIANTS = [  # (name, job, environment, the kind planted; None: the job's own reading of what happened)
    ("exhaustion", "oom_exhaustion", {}, "exhaustion"),
    ("fragmentation", "oom_fragmentation", {}, "fragmentation"),
    ("expandable_segments", "oom_fragmentation", {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, None),
    ("cudaMallocAsync", "oom_fragmentation", {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"}, None),
]
NOTE_WORDS = {"expandable_segments": "expandable_segments", "cudaMallocAsync": "cudaMallocAsync"}


def check_oom(ctx: Ctx) -> dict[str, Any]:
    s = ctx.sizes
    figures: dict[str, Any] = {}
    failed: list[str] = []
    for name, job_name, env, planted in OOM_VARIANTS:
        cfg = ctx.cfg(name, chunk=s["chunk"], segment=s["segment"], piece=s["piece"])
        job = run_job(ctx, job_name, cfg, timeout=120, env=env)
        f = figures[name] = {"exit_status": job.returncode, "seconds": round(job.seconds, 1)}
        try:
            t = truth(cfg)
            meta, table, _ = recover(ctx, cfg)
        except Exception as exc:
            f["error"] = f"{type(exc).__name__}: {exc}; job stderr: {job.tail()}"
            failed.append(name)
            continue
        f.update(_oom_figures(name, planted or t.get("oom"), t, meta, table, job.stderr))
        if not f["ok"]:
            failed.append(name)
    return {
        "ok": not failed,
        "truth": "the device filled in 1 GiB chunks (exhaustion); half of it cached in pieces no larger than "
        "the request (fragmentation); the same under expandable_segments:True and backend:cudaMallocAsync",
        "found": "; ".join(f"{n}: {figures[n].get('verdict', figures[n].get('error', '?'))}" for n in figures),
        "figures": figures,
        "notes": [f"{n} did not hold" for n in failed],
    }


def _oom_figures(name: str, planted: str | None, t: dict[str, Any], meta: dict[str, Any], table: Any,
                 stderr: str) -> dict[str, Any]:  # fmt: skip
    death = meta.get("death") or {}
    kind = (death.get("gpu_oom") or {}).get("kind")
    stats = t.get("stats") or {}
    allocated = stats.get("allocated_bytes.all.current")
    reserved = stats.get("reserved_bytes.all.current")
    unallocated = None if reserved is None or allocated is None else reserved - allocated
    uncaught = [r for r in rows(table, "oom") if r.get("detail") == "uncaught"]
    observed = [r for r in rows(table, "oom") if r.get("detail") == "observer"]
    u = uncaught[-1] if uncaught else {}
    o = observed[-1] if observed else {}
    notes = [n for n in meta.get("notes") or [] if "alloc" in n]
    word = NOTE_WORDS.get(name)
    f: dict[str, Any] = {
        "verdict": f"{death.get('cause')} / {kind}",
        "planted": planted,
        "requested": {"pytorch": t.get("requested"), "blackbox": u.get("oom_requested"),
                      "observer": o.get("value")},
        "allocated": {"pytorch_stats": allocated, "blackbox": u.get("oom_allocated")},
        "reserved_unallocated": {"blackbox": u.get("oom_reserved_unallocated"),
                                 "pytorch_stats": unallocated},
        "device_total": {"pytorch": (t.get("mem_get_info") or [None, None])[1], "observer": o.get("device_total")},
        "message": (t.get("message") or "")[:400],
        "notes": notes,
        "warnings": blackbox_warnings(stderr),
        "request_succeeded": bool(t.get("request_succeeded")),
    }  # fmt: skip
    checks = {
        "cause": death.get("cause") == "oom_exception",
        "kind": kind == planted,
        "requested": near(u.get("oom_requested"), t.get("requested"), 0.001, MESSAGE_SLACK),
        "allocated": allocated is None or near(u.get("oom_allocated"), allocated, 0.001, MESSAGE_SLACK),
        "observer": not o or near(o.get("value"), t.get("requested"), 0.0, 2 * MiB),
        "one_note": len(notes) == (1 if word else 0) and all(word in n for n in notes) if word else not notes,
        "no_warning": not f["warnings"],
    }
    if f["device_total"]["pytorch"] is not None and o:
        checks["device_total"] = o.get("device_total") == f["device_total"]["pytorch"]
    f["held"] = checks
    f["ok"] = all(checks.values())
    return f


# ---------------------------------------------------------------- 3. the snapshot for memory_viz
RENDER = (
    "import pickle, sys\n"
    "from torch.cuda import _memory_viz\n"
    "data = pickle.load(open(sys.argv[1], 'rb'))  # the check's own file, written by PyTorch in this run\n"
    "html = _memory_viz.trace_plot(data)\n"
    "open(sys.argv[2], 'w').write(html)\n"
    "print(sum(len(t) for t in data.get('device_traces', [])), len(data.get('segments', [])), len(html))\n"
)


def check_snapshot(ctx: Ctx) -> dict[str, Any]:
    s = ctx.sizes
    cfg = ctx.cfg("snapshot", chunk=s["chunk"], segment=s["segment"], piece=s["piece"], history=2000)
    job = run_job(ctx, "oom_fragmentation", cfg, timeout=120)
    found = sorted(Path(cfg["ring"]).glob("*.oom-snapshot.pickle"))
    if not found:
        raise CheckError(f"no snapshot beside the ring (job exit {job.returncode}): {job.tail()}")
    html = Path(cfg["truth"]).parent / "memory_viz.html"
    try:
        r = subprocess.run([ctx.python, "-c", RENDER, str(found[0]), str(html)], capture_output=True, text=True,
                           timeout=max(5.0, min(120.0, ctx.left())), env=ctx.env())  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        raise CheckError("memory_viz's trace_plot ran past its timeout") from exc
    figures: dict[str, Any] = {"snapshot_bytes": found[0].stat().st_size, "exit_status": job.returncode}
    if r.returncode != 0:
        no_torch = "No module named 'torch'" in r.stderr
        figures["render_error"] = r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"
        return {"ok": ctx.fake and no_torch, "truth": "PyTorch's snapshot written at the first OOM",
                "found": "snapshot written; not rendered: " + figures["render_error"], "figures": figures,
                "notes": ["torch is not installed here: the render is checked on a GPU machine"] if no_torch else []}
    entries, segments, size = (int(x) for x in r.stdout.split())
    figures.update(trace_entries=entries, segments=segments, html_bytes=size)
    if size <= 8 * MiB:
        shutil.copyfile(html, ctx.out / "memory_viz.html")
        figures["file"] = "memory_viz.html"
    ok = entries > 0 and size > 1000 and "<html" in html.read_text()[:4096].lower()
    return {"ok": ok, "truth": "PyTorch's snapshot at the first OOM (history of 2,000 entries)",
            "found": f"{entries} trace entries, {segments} segments; torch.cuda._memory_viz.trace_plot rendered "
            f"{size:,} bytes of HTML", "figures": figures, "notes": []}  # fmt: skip


# ---------------------------------------------------------------- 4. SIGKILL mid-step
def check_sigkill(ctx: Ctx) -> dict[str, Any]:
    interval = 0.1
    cfg = ctx.cfg("sigkill", interval=interval, batch=ctx.sizes["batch"])
    after = random.uniform(*ctx.sizes["kill_after"])
    job, killed_at = kill_when_ready(ctx, "sigkill", cfg, timeout=150, after=after)
    if killed_at is None:
        raise CheckError(f"the job never got ready (exit {job.returncode}): {job.tail()}")
    t = truth(cfg)
    meta, table, bundle = recover(ctx, cfg)
    gpu = rows(table, "gpu_sample", columns=["time", "gpu_allocated", "gpu_reserved", "device_total"])
    death = meta.get("death") or {}
    last = gpu[-1] if gpu else {}
    gap = killed_at - time_s(last) if last else None
    summary = (bundle / "summary.md").read_text()
    held = {
        "killed": job.returncode == -9,
        "verdict_killed": death.get("cause") == "killed",
        "last_gpu_sample_within_one_interval": gap is not None and gap <= interval + 0.05,
        "gpu_memory_in_summary": "GPU" in summary and last.get("gpu_allocated") is not None,
        # the model and the optimizer's state stay allocated: never less than half what the first step left
        "gpu_allocated_plausible": (last.get("gpu_allocated") or 0) >= 0.5 * (t.get("allocated") or 0) > 0,
    }
    return {
        "ok": all(held.values()),
        "truth": f"SIGKILL {after:.2f} s into training (a GPT step loop), the recorder sampling every {interval} s",
        "found": f"verdict {death.get('cause')}; last gpu_sample {gap:.3f} s before the kill; "
        f"{mib(last.get('gpu_allocated'))} allocated then" if gap is not None else "no gpu_sample row",
        "figures": {"gap_s": gap, "interval_s": interval, "gpu_samples": len(gpu), "last": {
            k: v for k, v in last.items() if k != "time"}, "allocated_after_first_step": t.get("allocated"),
            "held": held, "headline": death.get("headline")},
        "notes": [],
    }  # fmt: skip


# ---------------------------------------------------------------- 5. who holds GPU memory
def planted_line() -> int:
    for i, line in enumerate((HERE / "job.py").read_text().splitlines(), 1):
        if "# planted GPU leak" in line:
            return i
    raise CheckError("job.py has no line marked '# planted GPU leak'")


def check_gpu_leak(ctx: Ctx) -> dict[str, Any]:
    s = ctx.sizes
    cfg = ctx.cfg("gpu_leak", steps=s["leak_steps"], leak=s["leak"], scratch=s["scratch"], settle=s["leak_settle_s"])
    job, killed_at = kill_when_ready(ctx, "gpu_leak", cfg, timeout=150)
    if killed_at is None:
        raise CheckError(f"the job never got ready (exit {job.returncode}): {job.tail()}")
    t = truth(cfg)
    meta, _, _ = recover(ctx, cfg)
    allocations = meta.get("allocations") or {}
    sites = allocations.get("sites") or []
    line = planted_line()
    top = sites[0] if sites else {}
    leaked = t["leaked"]
    held = {
        "never_imported_from_the_sampler": t.get("inductor_imported_by") in (None, "MainThread"),
        "named_first": str(top.get("site", "")).endswith(f"job.py:{line})"),
        "gpu_domain": "gpu" in (top.get("domains") or []),
        "within_25_percent": near(top.get("live_bytes"), leaked, 0.25),
        # each block takes the step it was allocated in (PyTorch's time_us), not the step of the drain that found it
        "growth_per_step_within_25_percent": near(top.get("growth_per_step"), s["leak"], 0.25),
        "error_covers_truth": top.get("live_bytes") is not None
        and abs(top["live_bytes"] - leaked) <= 2 * max(top.get("error_bytes") or 0, 1) + 0.25 * leaked,
    }
    return {
        "ok": all(v for k, v in held.items() if k != "error_covers_truth"),
        "truth": f"{s['leak_steps']} CUDA tensors of {mib(s['leak'])} kept in a list at job.py:{line}, one a step "
        f"({mib(leaked)}), SIGKILLed after",
        "found": f"first site {top.get('site')}: {mib(top.get('live_bytes'))} ± {mib(top.get('error_bytes'))} "
        f"({', '.join(top.get('domains') or [])}), growing {mib(top.get('growth_per_step'))} a step"
        if top else "no allocation site",
        "figures": {"leaked": leaked, "top": {k: top.get(k) for k in ("site", "live_bytes", "error_bytes", "blocks",
                    "growth_per_step", "growth_per_s", "domains")}, "sites": len(sites),
                    "live_bytes": allocations.get("live_bytes"), "held": held,
                    "allocator_history": meta.get("allocator_history")},
        "notes": [] if held["error_covers_truth"] else ["the stated error does not cover the truth"],
    }  # fmt: skip


# ---------------------------------------------------------------- 7. the job is never changed
def check_unchanged(ctx: Ctx) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for job_name, seconds in (("untouched", 1.5), ("pin_memory", 0.0)):
        for armed in (False, True):
            key = f"{job_name}_{'armed' if armed else 'unarmed'}"
            cfg = ctx.cfg(key, armed=armed, seconds=seconds)
            job = run_job(ctx, job_name, cfg, timeout=120)
            out[key] = {"exit_status": job.returncode, "stdout": job.stdout.strip()[-300:],
                        "warnings": blackbox_warnings(job.stderr), "stderr": job.tail(300)}  # fmt: skip
    u, a = out["untouched_unarmed"], out["untouched_armed"]
    p, q = out["pin_memory_unarmed"], out["pin_memory_armed"]
    held = {
        "cuda_never_initialised": u["exit_status"] == a["exit_status"] == 0
        and '"initialised": false' in u["stdout"] and '"initialised": false' in a["stdout"],
        "pin_memory_workers_same": p["exit_status"] == q["exit_status"] == 0 and p["stdout"] == q["stdout"]
        and '"pinned": true' in q["stdout"],
        "no_warning": not a["warnings"] and not q["warnings"],
    }
    return {
        "ok": all(held.values()),
        "truth": "a job that imports torch and never touches CUDA; fork DataLoader workers with pin_memory=True "
        "after CUDA init; each armed and unarmed",
        "found": f"CUDA initialised: unarmed {u['stdout']}, armed {a['stdout']}; workers: unarmed {p['stdout']}, "
        f"armed {q['stdout']}",
        "figures": {**out, "held": held},
        "notes": [],
    }
