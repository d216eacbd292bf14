"""The two checks measured at real rates: the allocator history drained during training (2), and what the
recorder costs a real step (6)."""

from __future__ import annotations

import bisect
import statistics
from typing import Any

from runner import CheckError, Ctx, recover, rows, run_job, truth

COUNTED_KINDS = ("alloc", "free", "segment_alloc", "segment_free")  # history actions PyTorch counts
COST_CONFIGS: dict[str, dict[str, Any] | None] = {
    "unarmed": None,
    "default": {},
    "allocations": {"allocations": True},
    "history": {"allocator_history": True},
}
GOALS = {"default": 0.5, "history": 2.0}  # per cent of the step, the goals


def _total(c: dict[str, Any]) -> int:
    return int(c["alloc"] + c["free"] + c["segment_alloc"] + c["segment_free"])


def check_history(ctx: Ctx) -> dict[str, Any]:
    s = ctx.sizes
    cfg = ctx.cfg("history", steps=s["history_steps"], batch=s["batch"], capacity=1 << 21)
    job = run_job(ctx, "history_gpt", cfg, timeout=300)
    if job.returncode != 0:
        raise CheckError(f"the training job failed (exit {job.returncode}): {job.tail()}")
    t = truth(cfg)
    meta, table, _ = recover(ctx, cfg)
    hist = meta.get("allocator_history") or {}
    steps = t["steps"]
    counted = rows(table, *COUNTED_KINDS, columns=["allocator_time_us"])
    times = sorted(r["allocator_time_us"] for r in counted if r["allocator_time_us"] is not None)
    bounds = [c["t_us"] for c in steps]
    per_step = []
    for a, b in zip(steps, steps[1:], strict=False):
        in_ring = bisect.bisect_right(times, b["t_us"]) - bisect.bisect_right(times, a["t_us"])
        per_step.append((_total(b) - _total(a), in_ring))
    recorded = sum(p for p, _ in per_step)
    in_window = sum(r for _, r in per_step)
    aligned = bool(times) and times[0] <= bounds[-1] and times[-1] >= bounds[0]
    lost_steps = [p - r for p, r in per_step if p > r]
    measured_lost = recorded - in_window if aligned else None
    step_s = t["step_s"]
    drain_ms = 1000 * t.get("drain_s", 0.0) / max(1, len(per_step))
    figures = {
        "steps": len(per_step),
        "step_ms": round(1000 * step_s, 2),
        "batch": t.get("batch"),
        "actions_per_step_pytorch": statistics.median(p for p, _ in per_step) if per_step else None,
        "actions_per_step_ring": statistics.median(r for _, r in per_step) if per_step else None,
        "recorded_by_pytorch": recorded,
        "in_ring": in_window,
        "lost_measured": measured_lost,
        "steps_with_loss": len(lost_steps),
        "worst_step_lost": max(lost_steps, default=0),
        "metadata_allocator_history": hist,
        "drains": t.get("drains"),
        "drain_ms_per_step": round(drain_ms, 3),
        "drain_share_of_step_pct": round(100 * drain_ms / (1000 * step_s), 3) if step_s else None,
        "time_bases_aligned": aligned,
    }
    # The whole run's loss, from the history's start: PyTorch's count at the end less its count after init,
    # against every counted action the ring holds (the truth's counters are read before the job's exit, whose
    # frees the ring holds too: a few actions of slack).
    if "after_init" in t:
        total = _total(steps[-1]) - _total(t["after_init"])
        whole = total - len(counted)
        figures["lost_whole_run"] = whole
        slack = 8 + 0.005 * total
        ok = abs(hist.get("lost", -1) - max(0, whole)) <= slack
    else:
        ok = False
    figures["inductor_imported_by"] = t.get("inductor_imported_by")
    ok = ok and t.get("inductor_imported_by") in (None, "MainThread")  # the fake says; a GPU's torch does not
    return {
        "ok": ok and hist.get("entries") is not None,
        "truth": f"a small GPT trained {len(per_step)} steps with allocator_history=True: PyTorch's own counters "
        "of allocations, frees and segments at each step's end",
        "found": f"{in_window:,} of {recorded:,} counted actions in the ring "
        f"({0 if not recorded else 100 * in_window / recorded:.1f}%); metadata.json says {hist.get('lost')} lost; "
        f"the drain costs {drain_ms:.2f} ms a step ({figures['drain_share_of_step_pct']}% of it)",
        "figures": figures,
        "notes": [] if aligned else ["PyTorch's time_us is not on the wall clock here: per-step figures skipped"],
    }


def check_cost(ctx: Ctx) -> dict[str, Any]:
    s = ctx.sizes
    cfg = ctx.cfg("cost", batch=s["batch"], warmup=s["warmup"], rounds=s["cost_rounds"], steps=s["cost_steps"],
                  settle_steps=s["settle_steps"], settle_s=s["settle_s"], target_ms=s["target_ms"],
                  configs=COST_CONFIGS)  # fmt: skip
    job = run_job(ctx, "cost", cfg, timeout=300)
    if job.returncode != 0:
        raise CheckError(f"the cost job failed (exit {job.returncode}): {job.tail()}")
    t = truth(cfg)
    med = t["median_s"]
    base = med["unarmed"]
    blocks = t["blocks"]
    # Each round's block against the same round's unarmed block (the rounds rotate the order, so a round's
    # blocks ran side by side): the median of those paired ratios, and their spread, is the overhead.
    paired = {k: sorted(100 * (a / u - 1) for a, u in zip(v, blocks["unarmed"], strict=False))
              for k, v in blocks.items() if k != "unarmed"}  # fmt: skip
    overhead = {k: round(statistics.median(v), 3) for k, v in paired.items()}
    noise = sorted(100 * (u / statistics.median(blocks["unarmed"]) - 1) for u in blocks["unarmed"])
    spread = {k: [round(1000 * min(v), 3), round(1000 * max(v), 3)] for k, v in blocks.items()}
    goals = {k: overhead.get(k, float("inf")) <= g for k, g in GOALS.items()}
    return {
        "ok": all(goals.values()) if not ctx.fake else True,
        "truth": f"a GPT step of {1000 * base:.1f} ms (bf16, batch {t['batch']}), unarmed and armed, "
        f"{len(t['blocks']['unarmed'])} interleaved rounds of {s['cost_steps']} steps",
        "found": ", ".join(f"{k} {v:+.2f}% (rounds {min(paired[k]):+.1f} to {max(paired[k]):+.1f})"
                           for k, v in overhead.items())
        + f"; unarmed blocks {min(noise):+.1f} to {max(noise):+.1f}% of their median",
        "figures": {"step_ms": {k: round(1000 * v, 3) for k, v in med.items()}, "overhead_pct": overhead,
                    "paired_pct": {k: [round(x, 2) for x in v] for k, v in paired.items()},
                    "unarmed_blocks_pct_from_median": [round(x, 2) for x in noise],
                    "block_medians_ms_min_max": spread, "goals_pct": GOALS, "goals_met": goals,
                    "batch": t["batch"]},
        "notes": ["the fake device's step is CPU work: its figures say nothing of a GPU"] if ctx.fake else [],
    }  # fmt: skip
