"""Real CUDA tests: skipped without a CUDA device. Run on a GPU machine with ``pytest tests/gpu``."""

from __future__ import annotations

import json
import pickle
import signal
from pathlib import Path

import pyarrow.compute as pc
import pytest
from conftest import run_py

from blackbox.recovery.timeline import ring_table
from blackbox.ring.reader import find_rings, read_ring

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

ARM = "import sys, blackbox\nrec = blackbox.arm(sys.argv[1], capacity=1 << 16, sample_interval=0.02{extra})\n"
OOM = (
    "import torch, time\nx = torch.ones(1, device='cuda')\ntime.sleep(0.1)\n"
    "y = torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n"
)


def _table(ring_dir: Path):  # type: ignore[no-untyped-def]
    (path,) = find_rings([ring_dir])
    return path, ring_table(read_ring(path))


def test_uncaught_cuda_oom_gives_observer_and_exception_oom_events(tmp_path: Path) -> None:
    proc = run_py(ARM.format(extra="") + OOM, str(tmp_path), check=False)
    assert proc.returncode == 1 and "OutOfMemoryError" in proc.stderr
    _, table = _table(tmp_path)
    ooms = table.filter(pc.equal(table["kind"].cast("string"), "oom")).to_pylist()
    observed = [o for o in ooms if o["detail"] == "observer"]
    uncaught = [o for o in ooms if o["detail"] == "uncaught"]
    assert observed and observed[0]["value"] >= 1 << 50 and observed[0]["device_total"] > 0
    assert uncaught and uncaught[0]["oom_requested"] is not None and uncaught[0]["oom_capacity"] > 0
    gpu = table.filter(pc.equal(table["kind"].cast("string"), "gpu_sample")).to_pylist()
    assert gpu and gpu[-1]["gpu_allocated"] >= 4 and gpu[-1]["device_total"] > 0


def test_caught_cuda_oom_with_capture_oom(tmp_path: Path) -> None:
    code = ARM.format(extra="") + (
        "import torch\n"
        "try:\n"
        "    with blackbox.capture_oom('probe', batch=1):\n"
        "        torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n"
        "except torch.OutOfMemoryError:\n"
        "    print('caught')\n"
    )
    proc = run_py(code, str(tmp_path))
    assert "caught" in proc.stdout
    _, table = _table(tmp_path)
    details = table.filter(pc.equal(table["kind"].cast("string"), "oom"))["detail"].to_pylist()
    assert "capture_oom: probe batch=1" in details and "observer" in details


def test_allocator_history_drain_and_snapshot_for_memory_viz(tmp_path: Path) -> None:
    code = ARM.format(extra=", allocator_history=True") + (
        "import torch, time\n"
        "xs = [torch.empty(1 << 20, device='cuda') for _ in range(50)]\n"
        "del xs[::2]\n"
        "time.sleep(1.5)\n"  # a drain is due every second or so
        "torch.empty(1 << 50, dtype=torch.uint8, device='cuda')\n"
    )
    proc = run_py(code, str(tmp_path), check=False)
    assert proc.returncode == 1
    path, table = _table(tmp_path)
    kinds = table["kind"].cast("string").to_pylist()
    assert kinds.count("alloc") >= 50 and kinds.count("free") + kinds.count("free_requested") >= 25
    snapshot = Path(str(path) + ".oom-snapshot.pickle")
    with open(snapshot, "rb") as f:
        data = pickle.load(f)  # our own file, written by PyTorch in the test: trusted here
    from torch.cuda import _memory_viz

    html = _memory_viz.trace_plot(data)
    assert "<html" in html.lower() and len(html) > 1000


def test_sigkill_after_cuda_use_keeps_gpu_samples(tmp_path: Path) -> None:
    code = ARM.format(extra="") + (
        "import os, signal, time, torch\nx = torch.ones(1 << 28, device='cuda')\ntime.sleep(0.3)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = run_py(code, str(tmp_path), check=False)
    assert proc.returncode == -signal.SIGKILL
    _, table = _table(tmp_path)
    gpu = table.filter(pc.equal(table["kind"].cast("string"), "gpu_sample")).to_pylist()
    assert gpu and gpu[-1]["gpu_allocated"] >= 1 << 30
    print(json.dumps(gpu[-1], default=str))
