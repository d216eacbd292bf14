"""The jobs the GPU check runs, each in a process of its own: ``python job.py NAME CONFIG_JSON``.

Each job plants a truth (what filled the device, which line leaked, when it was killed) and writes it,
with PyTorch's own figures, to ``config["truth"]`` as JSON, so the check can hold blackbox's account
against it. ``config["fake"]`` runs the same job on the fake device (fake_cuda.py, for ``--dry-run``).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from device import Device

MiB, GiB = 1 << 20, 1 << 30


def write_truth(cfg: dict[str, Any], truth: dict[str, Any]) -> None:
    tmp = cfg["truth"] + ".tmp"
    with open(tmp, "w") as f:
        json.dump(truth, f)
    os.replace(tmp, cfg["truth"])


def arm(cfg: dict[str, Any], **kwargs: Any) -> Any:
    import blackbox

    return blackbox.arm(cfg["ring"], capacity=cfg.get("capacity", 1 << 16), **kwargs)


def fill(dev: Device, chunk: int) -> list[Any]:
    """Device buffers of ``chunk`` bytes until the allocator refuses one (its exception caught and dropped:
    its traceback would keep this frame's list, and so every buffer, alive)."""
    held: list[Any] = []
    while True:
        try:
            held.append(dev.empty(chunk))
        except dev.OOM:
            break
    return held


def oom_exhaustion(cfg: dict[str, Any], dev: Device) -> None:
    """Fill the device in equal chunks; the chunk that does not fit is an uncaught OOM by exhaustion."""
    arm(cfg, sample_interval=0.05)
    dev.init()
    chunk = cfg["chunk"]
    held: list[Any] = []
    while True:
        stats = dev.stats()
        try:
            held.append(dev.empty(chunk))
        except dev.OOM as exc:
            write_truth(cfg, {"requested": chunk, "message": str(exc), "stats": dev.stats(), "stats_before": stats,
                              "held": len(held) * chunk, "mem_get_info": dev.mem_get_info()})  # fmt: skip
            raise


def oom_fragmentation(cfg: dict[str, Any], dev: Device) -> None:
    """Fill the device with large segments, free them (cached), carve them into pieces, free every other
    piece: half the device is cached but no hole is larger than a piece; then ask for three pieces."""
    arm(cfg, sample_interval=0.05, allocator_history=cfg.get("history", False))
    dev.init()
    big = fill(dev, cfg["segment"])
    del big
    pieces = fill(dev, cfg["piece"])
    del pieces[::2]
    request = 3 * cfg["piece"]
    truth: dict[str, Any] = {"requested": request, "pieces_held": len(pieces), "piece": cfg["piece"]}
    before = dev.stats()
    try:
        extra = dev.empty(request)
    except dev.OOM as exc:
        truth.update(message=str(exc), stats=dev.stats(), stats_before=before, oom="fragmentation")
        write_truth(cfg, truth)
        raise
    truth.update(request_succeeded=True, stats_after_request=dev.stats())
    del extra, pieces
    # The request fitted (the allocator mapped or pooled it): end as an exhaustion, the same on every backend.
    free, total = dev.mem_get_info()
    try:
        dev.empty(2 * total)
    except dev.OOM as exc:
        truth.update(message=str(exc), stats=dev.stats(), oom="exhaustion", requested=2 * total)
        write_truth(cfg, truth)
        raise


def history_gpt(cfg: dict[str, Any], dev: Device) -> None:
    """A small GPT trained for a few hundred steps with the allocator history on: PyTorch's own counters of
    allocator actions at each step's end, to hold against the actions drained into the ring."""
    rec = arm(cfg, allocator_history=cfg.get("entries", True))
    dev.init()
    trainer = dev.trainer(cfg["batch"])
    steps: list[dict[str, Any]] = []

    def counters() -> dict[str, Any]:
        s = dev.stats()
        return {"t_us": int(time.time() * 1e6), "alloc": s.get("allocation.all.allocated", 0),
                "free": s.get("allocation.all.freed", 0), "segment_alloc": s.get("segment.all.allocated", 0),
                "segment_free": s.get("segment.all.freed", 0)}  # fmt: skip

    after_init = counters()
    steps.append(counters())
    times = []
    for _ in range(cfg["steps"]):
        times.append(trainer.step())
        steps.append(counters())
    hooks = torch_hooks(rec)
    truth = {"steps": steps, "after_init": after_init, "step_s": statistics.median(times), "batch": trainer.batch,
             "inductor_imported_by": dev.inductor_imported_by()}
    if hooks is not None:
        hooks.drain()
        truth["drains"], truth["drained"], truth["drain_s"] = hooks.history_drains, hooks.history_events, \
            hooks.history_seconds  # fmt: skip
    write_truth(cfg, truth)


def torch_hooks(rec: Any) -> Any:
    """The recorder's torch collector (to read its drain counters), wherever the Recorder keeps it."""
    for value in vars(rec).values():
        if type(value).__name__ == "TorchHooks":
            return value
        for inner in vars(value).values() if hasattr(value, "__dict__") else ():
            if type(inner).__name__ == "TorchHooks":
                return inner
    return None


def sigkill(cfg: dict[str, Any], dev: Device) -> None:
    """Training steps until the check SIGKILLs it (``ready`` once the device holds the model)."""
    arm(cfg, sample_interval=cfg["interval"])
    dev.init()
    trainer = dev.trainer(cfg["batch"])
    trainer.step()
    write_truth(cfg, {"pid": os.getpid(), "allocated": dev.stats().get("allocated_bytes.all.current")})
    Path(cfg["ready"]).write_text("ready")
    while True:
        trainer.step()


def gpu_leak(cfg: dict[str, Any], dev: Device) -> None:
    """Each step makes and drops some scratch buffers and keeps one of ``leak`` bytes in a list, at the
    line marked below; then waits to be SIGKILLed."""
    import blackbox

    torch = dev.torch
    arm(cfg, sample_interval=0.1, allocations=True, allocator_history=True)
    dev.init()
    optimizer = dev.optimizer()  # a training job's: the history is drained once the job has loaded its modules
    kept = []
    for i in range(cfg["steps"]):
        blackbox.step(i)
        scratch = [dev.empty(cfg["scratch"]) for _ in range(4)]
        kept.append(torch.empty(cfg["leak"], dtype=torch.uint8, device="cuda"))  # planted GPU leak
        del scratch
        time.sleep(0.02)
    del optimizer
    write_truth(cfg, {"leaked": len(kept) * cfg["leak"], "allocated": dev.stats().get("allocated_bytes.all.current"),
                      "inductor_imported_by": dev.inductor_imported_by()})  # fmt: skip
    time.sleep(cfg["settle"])  # drains and sampler ticks: the history's entries reach the ring
    Path(cfg["ready"]).write_text("ready")
    while True:
        time.sleep(1)


def cost(cfg: dict[str, Any], dev: Device) -> None:
    """Step time unarmed and under each configuration, in one process, interleaved round by round (the
    order rotated), each block a median of its steps: the device's clocks and the host's noise hit all."""
    import blackbox

    dev.init()
    trainer = dev.trainer(cfg["batch"])
    for _ in range(cfg["warmup"]):
        trainer.step()
    lo, hi = cfg["target_ms"]
    for _ in range(6):  # a real step of lo..hi ms: the batch doubled or halved
        ms = 1000 * statistics.median(trainer.step() for _ in range(5))
        if ms < lo and trainer.batch < 1024:
            trainer.set_batch(trainer.batch * 2)
        elif ms > hi and trainer.batch > 1:
            trainer.set_batch(trainer.batch // 2)
        else:
            break
    for _ in range(cfg["warmup"]):
        trainer.step()
    configs: dict[str, dict[str, Any] | None] = dict(cfg["configs"])
    blocks: dict[str, list[float]] = {name: [] for name in configs}
    names = list(configs)
    for r in range(cfg["rounds"]):
        for name in names[r % len(names):] + names[: r % len(names)]:
            kw = configs[name]
            if kw is not None:
                blackbox.arm(cfg["ring"], capacity=1 << 16, **kw)
            settled, t0 = 0, time.monotonic()  # collectors attach at the sampler's first ticks
            while time.monotonic() - t0 < cfg["settle_s"] or settled < cfg["settle_steps"]:
                trainer.step()
                settled += 1
            blocks[name].append(statistics.median(trainer.step() for _ in range(cfg["steps"])))
            if kw is not None:
                blackbox.disarm()
    write_truth(cfg, {"batch": trainer.batch, "blocks": blocks,
                      "median_s": {k: statistics.median(v) for k, v in blocks.items()}})  # fmt: skip


def untouched(cfg: dict[str, Any], dev: Device) -> None:
    """Never touches the device: armed, the sampler ticks for a while; CUDA must stay uninitialised."""
    if cfg["armed"]:
        arm(cfg, sample_interval=0.05)
    time.sleep(cfg["seconds"])
    print(json.dumps({"initialised": bool(dev.torch.cuda.is_initialized())}))


def pin_memory(cfg: dict[str, Any], dev: Device) -> None:
    """CUDA initialised, then DataLoader workers forked with ``pin_memory=True``: the batches and their sum."""
    if cfg["armed"]:
        arm(cfg, sample_interval=0.05)
    dev.init()
    if dev.fake:
        import multiprocessing

        with multiprocessing.get_context("fork").Pool(2) as pool:
            sums = pool.map(sum, [range(i, i + 64) for i in range(0, 4096, 64)])
        print(json.dumps({"sum": sum(sums), "batches": len(sums), "pinned": True}))
        return
    torch = dev.torch
    data = torch.utils.data.TensorDataset(torch.arange(4096, dtype=torch.float64).view(-1, 4))
    loader = torch.utils.data.DataLoader(data, batch_size=64, num_workers=2, pin_memory=True,
                                         multiprocessing_context="fork")  # fmt: skip
    total, batches, pinned = 0.0, 0, True
    for (batch,) in loader:
        pinned = pinned and bool(batch.is_pinned())
        total += float(batch.cuda(non_blocking=True).sum().item())
        batches += 1
    print(json.dumps({"sum": total, "batches": batches, "pinned": pinned}))


JOBS = {f.__name__: f for f in (oom_exhaustion, oom_fragmentation, history_gpt, sigkill, gpu_leak, cost, untouched,
                                pin_memory)}  # fmt: skip


def main() -> None:
    name, cfg = sys.argv[1], json.loads(sys.argv[2])
    if name in os.environ.get("GPUCHECK_HANG", "").split(","):  # a planted hang: the tool's own test of its timeouts
        time.sleep(3600)
    JOBS[name](cfg, Device(cfg["fake"]))


if __name__ == "__main__":
    main()
