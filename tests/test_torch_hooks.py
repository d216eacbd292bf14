"""The torch hooks on real torch: the backward phase is recorded around every ``loss.backward()`` and adds
nothing of blackbox's to the job's tracebacks or stacks (an error inside backward prints as it does unarmed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from blackbox.recovery.kinds import of_kind
from blackbox.recovery.timeline import py_rows, ring_table
from blackbox.ring.reader import find_rings, read_ring
from blackbox.ring.writer import built_module

pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(built_module() is None, reason="the backward phase is the C extension's PhaseCall")

JOB = """
import sys, time
import torch
if sys.argv[1] == "arm":
    import blackbox
    blackbox.arm(sys.argv[2] + "/", sample_interval=0.02)

class Planted(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        time.sleep(0.3)  # long enough for the sampler to sample the main thread inside backward
        if int(sys.argv[3]):
            raise RuntimeError("planted failure inside backward")
        return grad * 2

w = torch.ones(4, requires_grad=True)
for step in range(3):
    Planted.apply(w).sum().backward()
torch.autograd.backward(Planted.apply(w).sum())
print("grad", w.grad.tolist(), flush=True)
"""


def _run(tmp_path: Path, mode: str, fail: bool) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    return subprocess.run([sys.executable, str(script), mode, str(tmp_path / "rings"), str(int(fail))],
                          capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)),
                          cwd=tmp_path)  # fmt: skip


def test_an_error_inside_backward_prints_the_same_traceback_armed_as_unarmed(tmp_path: Path) -> None:
    # GIVEN a job whose backward raises, run unarmed and armed
    unarmed, armed = _run(tmp_path, "no", True), _run(tmp_path, "arm", True)
    # THEN the job's traceback is the same, line for line: no frame of blackbox's in it
    assert armed.returncode == unarmed.returncode == 1
    assert "planted failure inside backward" in unarmed.stderr
    assert armed.stderr == unarmed.stderr, armed.stderr
    # AND the ring still closed the phase the error cut short
    rows = py_rows(ring_table(read_ring(next(iter(find_rings([tmp_path / "rings"]))))))
    phases = [(r["kind"], r["label"]) for r in rows if r["kind"] in ("phase_begin", "phase_end")]
    assert phases == [("phase_begin", "backward"), ("phase_end", "backward")], phases


def test_every_backward_is_a_phase_and_stacks_inside_it_are_the_jobs_own(tmp_path: Path) -> None:
    # GIVEN a job that calls backward four times (three loss.backward(), one torch.autograd.backward()), armed
    unarmed, armed = _run(tmp_path, "no", False), _run(tmp_path, "arm", False)
    assert armed.returncode == 0 and armed.stdout == unarmed.stdout == "grad [8.0, 8.0, 8.0, 8.0]\n", armed.stderr
    table = ring_table(read_ring(next(iter(find_rings([tmp_path / "rings"])))))
    rows = py_rows(table)
    # THEN each is one backward phase, begin and end, the end carrying its duration (the planted 0.3 s and more)
    phases = [r for r in rows if r["kind"] in ("phase_begin", "phase_end") and r["label"] == "backward"]
    assert [r["kind"] for r in phases] == ["phase_begin", "phase_end"] * 4
    assert all(0.3e9 <= r["value"] < 30e9 for r in phases if r["kind"] == "phase_end"), phases
    # AND the main thread sampled inside backward shows the job's frames down to torch's, none of blackbox's
    inside = [r["detail"] for r in py_rows(of_kind(table, "stack_sample")) if "Planted.backward" in (r["detail"] or "")]
    assert inside, "the sampler caught the main thread inside backward"
    assert all("torch_hooks" not in s and "blackbox" not in s for s in inside), inside[0]
    assert all("Tensor.backward" in s or ";backward " in s for s in inside), inside[0]
