"""The GPU check's seven claims as tests on a real CUDA device (tools/gpu_check.py; skipped without one).
Run on a GPU machine: ``pytest tests/gpu``. Each check runs in its own process under its own timeout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

CHECKS = ["oom", "history", "snapshot", "sigkill", "gpu_leak", "cost", "unchanged"]


@pytest.mark.parametrize("check", CHECKS)
def test_gpu_check_holds(tmp_path: Path, check: str) -> None:
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "gpu_check.py"), "--out", str(tmp_path),
                           "--only", check], capture_output=True, text=True, timeout=600)  # fmt: skip
    (result,) = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert result.get("ok"), json.dumps(result, default=str)[:4000] + proc.stdout[-1000:]
