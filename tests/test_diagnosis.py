"""death.cause from a real run of each kind, and the GPU OOM verdicts."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import run_py, spawn_py

import blackbox
from blackbox._units import human_bytes
from blackbox.collect.oom import is_oom_text
from blackbox.recovery.gpu_oom import gpu_oom_kind

ARM = "import sys, blackbox\nblackbox.arm(sys.argv[1], capacity=1 << 14, sample_interval=0.02)\n"


def _death(ring_dir: Path, out: Path) -> dict:
    blackbox.recover(ring_dir, out)
    return json.loads((out / "metadata.json").read_text())["death"]


@pytest.mark.parametrize(
    "code,cause,status",
    [
        ("blackbox.step(3)\nprint('done')\n", "clean_exit", 0),
        ("blackbox.step(2)\nraise ValueError('bad batch')\n", "exception", 1),
        ("blackbox.step(4)\nbuf = bytearray(1 << 60)\n", "oom_exception", 1),
        pytest.param(
            "import torch\nblackbox.step(4)\ntorch.empty(1 << 62, dtype=torch.uint8)\n",
            "oom_exception",
            1,
            marks=pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch"),
        ),
        (
            "import os, time\nblackbox.step(5)\nos.kill(os.getpid(), signal.SIGTERM)\ntime.sleep(5)\n",
            "signal",
            -signal.SIGTERM,
        ),
        ("import os, signal\nblackbox.step(6)\nos.kill(os.getpid(), signal.SIGKILL)\n", "killed", -signal.SIGKILL),
    ],
    ids=[
        "clean_exit",
        "exception",
        "oom_exception-MemoryError",
        "oom_exception-torch-CPU-allocator",
        "signal",
        "killed",
    ],
)
def test_cause_of_a_real_death(tmp_path: Path, code: str, cause: str, status: int) -> None:
    # SIGTERM's default action, whatever the test runner's shell left (set before arm, which chains it)
    preamble = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
    proc = run_py(preamble + ARM + code, str(tmp_path / "rings"), check=False)
    assert proc.returncode == status
    death = _death(tmp_path / "rings", tmp_path / "bundle")
    assert death["cause"] == cause, death
    assert death["evidence"] and death["time"]
    if cause != "clean_exit":
        assert death["step"] is not None
    summary = (tmp_path / "bundle" / "summary.md").read_text()
    assert f"Cause `{cause}`" in summary


@pytest.mark.slow
def test_kernel_oom_kill_is_host_oom_kill_with_growth_per_step(tmp_path: Path, memory_cgroup) -> None:  # type: ignore[no-untyped-def]
    cg = memory_cgroup(256 << 20)
    code = ARM + (
        "import time\nkept = []\n"
        "for step in range(1, 100000):\n"
        "    blackbox.step(step)\n"
        "    kept.append(bytearray(4 << 20))  # the leak: 4 MiB a step, touched\n"
        "    time.sleep(0.005)\n"
    )
    child = spawn_py(code, str(tmp_path / "rings"), preexec_fn=cg.join, stdout=subprocess.DEVNULL)
    assert child.wait(timeout=120) == -signal.SIGKILL
    death = _death(tmp_path / "rings", tmp_path / "bundle")
    assert death["cause"] == "host_oom_kill", death
    assert any("kernel log" in e or "oom_kill counter" in e for e in death["evidence"]), death["evidence"]
    growth = death["host_growth"]["rss_per_step"]
    assert 3 << 20 < growth < 5 << 20, f"about 4 MiB a step, measured {growth / (1 << 20):.2f} MiB"
    assert any("per step" in lever for lever in death["levers"])


STEPS_WITH_NOISE = ARM.replace("0.02)", "0.01)") + (
    """
import time
leak = int(sys.argv[2])
kept, cache = [], []
for step in range(1, 61):
    blackbox.step(step)
    if step == 3:
        cache.append(bytearray(48 << 20))  # a cache filled once, early: a warm-up, not a leak
    scratch = bytearray(16 << 20)  # a batch's temporaries, freed every step: noise
    if leak:
        kept.append(bytearray(leak))  # the planted leak, touched
    time.sleep(0.03)
    del scratch
    time.sleep(0.01)
"""
)


@pytest.mark.slow
@pytest.mark.parametrize("leak", [0, 3 << 20], ids=["no leak", "3 MiB a step"])
def test_growth_per_step_is_said_only_beyond_the_noise(tmp_path: Path, leak: int) -> None:
    # GIVEN a real job of 60 steps with a warm-up and per-step temporaries, leaking a known amount a step
    run_py(STEPS_WITH_NOISE, str(tmp_path / "rings"), str(leak))
    death = _death(tmp_path / "rings", tmp_path / "bundle")
    summary = (tmp_path / "bundle" / "summary.md").read_text()
    growth = death["host_growth"]
    per_step, error = growth["rss_per_step"], growth.get("rss_per_step_error")
    if not leak:
        # THEN a clean job claims no growth: the summary says it is within the noise, as its fit is
        assert "own memory grew" not in summary and "shows no growth per step beyond its noise" in summary
        assert not growth["rss_per_step_beyond_noise"] and abs(per_step) <= error, growth
    else:
        # THEN the leak is told, with an interval that holds the truth and is tight enough to mean something
        assert growth["rss_per_step_beyond_noise"] and abs(per_step - leak) <= error < leak / 4, growth
        assert f"The job's own memory grew {human_bytes(int(per_step))} ± {human_bytes(int(error))} per step" in summary


def test_gpu_oom_fragmentation_or_exhaustion() -> None:
    frag = gpu_oom_kind({"oom_requested": 2 << 30, "oom_reserved_unallocated": 6 << 30})
    assert frag is not None and frag["kind"] == "fragmentation" and "expandable_segments" in frag["levers"][0]
    full = gpu_oom_kind({"oom_requested": 2 << 30, "oom_reserved_unallocated": 100 << 20})
    assert full is not None and full["kind"] == "exhaustion" and len(full["levers"]) == 3
    assert gpu_oom_kind({"oom_requested": None, "oom_reserved_unallocated": None}) is None
    # PyTorch's CPU allocator gives a request too: host memory, never a device's exhaustion
    cpu = ("RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
           "memory: you tried to allocate 4503599627370496 bytes. Error code 12 (Cannot allocate memory)")  # fmt: skip
    assert gpu_oom_kind({"oom_requested": 1 << 52, "oom_reserved_unallocated": None, "label": cpu}) is None
    cuda = "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB"
    assert gpu_oom_kind({"oom_requested": 2 << 30, "oom_reserved_unallocated": None, "label": cuda}) is not None
    # the CUDA runtime's, cuBLAS's, NCCL's out-of-memory: a device's, with no figure; a host's ENOMEM is not one
    for label in ("RuntimeError: CUDA error: out of memory\nCUDA kernel errors might be asynchronously reported",
                  "RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`",
                  "DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error\n"
                  "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\nCuda failure 'out of memory'"):
        kind = gpu_oom_kind({"oom_requested": None, "oom_reserved_unallocated": None, "label": label})
        assert kind is not None and kind["kind"] == "outside_cache" and len(kind["levers"]) == 3, label
        assert is_oom_text(label), label
    assert gpu_oom_kind({"oom_requested": None, "label": "OSError: [Errno 12] Cannot allocate memory"}) is None


@pytest.mark.slow
def test_summary_names_the_module_that_grew_and_shows_the_last_seconds(tmp_path: Path) -> None:
    code = ARM.replace("sample_interval=0.02)", "sample_interval=0.01, modules=True)") + (
        "import time, torch\n"
        "class Leaky(torch.nn.Module):\n"
        "    kept = []\n"
        "    def forward(self, x):\n"
        "        self.kept.append(torch.ones(4 << 20))  # 16 MiB kept every call\n"
        "        return x\n"
        "model = torch.nn.Sequential(torch.nn.Linear(64, 64), Leaky(), torch.nn.Linear(64, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for _ in range(12):\n"
        "    model(torch.randn(8, 64)).sum().backward(); opt.step(); time.sleep(0.02)\n"
    )
    pytest.importorskip("torch")
    run_py(code, str(tmp_path / "rings"))
    blackbox.recover(tmp_path / "rings", tmp_path / "bundle")
    meta = json.loads((tmp_path / "bundle" / "metadata.json").read_text())
    top = meta["module_growth"][0]
    assert top["module"] == "Sequential.1" and top["calls"] == 12 and top["host_growth"] >= 12 * (15 << 20)
    assert top["gpu_growth"] is None, "no GPU: not measured, not zero"
    assert meta["last_step"] == 12 and len(meta["last_samples"]) == 10
    summary = (tmp_path / "bundle" / "summary.md").read_text()
    assert "## Modules whose own forward grew memory most" in summary and "| Sequential.1 | 12 |" in summary
    assert "## The last seconds" in summary


def test_a_child_read_after_its_death_keeps_its_last_living_rss() -> None:
    # GIVEN a worker sampled at 300 MiB, then read once more as a zombie (0 pages) before it was reaped
    from blackbox.recovery.facts import facts
    from blackbox.recovery.timeline import TIMELINE_SCHEMA

    rows = [{"seq": i, "time": t * 10**9, "kind": "child_sample", "label": "pt_data_worker", "child_pid": 77,
             "child_rss": rss} for i, (t, rss) in enumerate([(1, 100 << 20), (2, 300 << 20), (3, 0)])]  # fmt: skip
    table = pa.Table.from_pylist(
        [{c: r.get(c) for c in TIMELINE_SCHEMA.names} for r in rows], schema=TIMELINE_SCHEMA
    )  # fmt: skip
    worker = facts(table, {"wall_ns": 0, "monotonic_ns": 0}).children[77]
    # THEN its memory at the end is the last it had alive, and it grew (it did not lose 100 MiB)
    assert worker.at(3 * 10**9) == 300 << 20 and worker.growth == 200 << 20


def test_memory_that_fell_per_step_is_said_to_shrink() -> None:
    from blackbox.views.summary import ring_summary

    death = {"cause": "killed", "confidence": "strong", "evidence": [],
             "host_growth": {"rss_per_step": -261120.0, "rss_per_step_error": 1024.0,
                             "rss_per_step_beyond_noise": True}}  # fmt: skip
    meta = {"recovery": {"valid": 1, "slots_read": 1, "slots": 1, "first_seq": 0, "last_seq": 0, "overwritten": 0,
                         "torn": 0, "stale": 0, "holes": 0, "labels_lost": 0}, "death": death}  # fmt: skip
    text = ring_summary(meta)
    assert "The job's own memory shrank 255.0 KiB ± 1.0 KiB per step" in text and "grew -" not in text
