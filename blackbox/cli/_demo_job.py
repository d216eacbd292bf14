"""The demo's training job: a small MLP on CPU that leaks activations each step.

Run as ``python -m blackbox.cli._demo_job RING_DIR``. Uses torch when it is
installed, numpy otherwise. Prints ``leak BYTES LINE`` first (the planted truth: the bytes
kept each step and the line that keeps them), then ``step N`` after each step so a parent can
kill it mid-run.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import blackbox


def _planted(kept_bytes: int, code: str) -> None:
    """Tell the parent what this job leaks and where: the line of ``code`` marked ``# the leak``."""
    lines = Path(__file__).read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.strip() == f"{code}  # the leak")
    print(f"leak {kept_bytes} {line}", flush=True)


def train_torch(steps: int) -> None:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    kept = []  # the bug: activations kept across steps
    _planted(256 * 1024 * 4, "kept.append(hidden.detach().clone())")  # one float32 hidden activation a step
    for i in range(steps):
        blackbox.step(i)
        x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
        with blackbox.phase("forward"):
            hidden = model[1](model[0](x))
            loss = torch.nn.functional.cross_entropy(model[2](hidden), y)
        kept.append(hidden.detach().clone())  # the leak
        with blackbox.phase("backward"):
            loss.backward()  # type: ignore[no-untyped-call]
        with blackbox.phase("optimizer"):
            opt.step()
            opt.zero_grad()
        blackbox.mark("loss_milli", int(loss.item() * 1000))
        print(f"step {i}", flush=True)


def train_numpy(steps: int) -> None:
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((256, 1024)) * 0.05, rng.standard_normal((1024, 10)) * 0.05
    kept = []
    _planted(256 * 1024 * 8, "kept.append(hidden.copy())")  # one float64 hidden activation a step
    for i in range(steps):
        blackbox.step(i)
        x = rng.standard_normal((256, 256))
        with blackbox.phase("forward"):
            hidden = np.maximum(x @ w1, 0)
            out = hidden @ w2
        kept.append(hidden.copy())  # the leak
        with blackbox.phase("backward"):
            grad_out = out / len(out)
            grad_w2 = hidden.T @ grad_out
            grad_w1 = x.T @ ((grad_out @ w2.T) * (hidden > 0))
        with blackbox.phase("optimizer"):
            w1 -= 0.01 * grad_w1
            w2 -= 0.01 * grad_w2
        blackbox.mark("loss_milli", int(float((out**2).mean()) * 1000))
        print(f"step {i}", flush=True)


def main() -> int:
    ring_dir = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
    blackbox.arm(ring_dir, capacity=1 << 14, sample_interval=0.05, allocations=True)
    try:
        import torch  # noqa: F401
    except ImportError:
        train_numpy(steps)
    else:
        train_torch(steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
