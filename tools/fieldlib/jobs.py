"""The jobs of the field matrix: real third-party training code, its data made here, no internet.

Each job's command runs its script through ``fieldrun.py`` (unchanged file, runpy), so the modes differ
only by arming. ``long`` asks for a run that outlasts a time-based death (``timeout``).
"""

from __future__ import annotations

import pickle
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIELDRUN = HERE / "fieldrun.py"


@dataclass
class Env:
    """Where things are: the prepared venvs, the unpacked third-party sources, the data made once."""

    venv: Path  # torch 2.13.0 CPU, transformers, lightning
    venv_tv: Path  # torch 2.14.1 + torchvision 0.29.1 (pytorch/examples mnist)
    src: Path  # nanoGPT/ and examples/mnist/ unpacked by field_setup.sh
    data: Path  # data made here (mnist files)


@dataclass
class Job:
    name: str
    python: Callable[[Env], Path]
    script: Callable[[Env], Path]
    args: Callable[[Env, Path, bool], list[str]]  # (env, run folder, long) -> the script's arguments
    cwd: Callable[[Env, Path], Path]
    ranks: int = 1  # >1: torchrun --nproc-per-node ranks (or accelerate launch's --num_processes)
    launcher: str = "torchrun"  # of several ranks: torchrun, or accelerate (`accelerate launch --multi_gpu`)
    worker_args: bool = False  # takes --workers/--context/--worker-leak
    worker_leak_mib: int = 1  # the planted leak per item in DataLoader worker 0
    leak_mib: int = 24  # the planted leak per optimizer step (main process or one rank)
    leak_rank: int = 0
    kill_rank: int = 0  # whose SIGKILL is "the main process"
    timeout_s: int = 5
    progress: str = ""  # its per-step log lines: how many made it out before a kill is timing, not a change
    sigterm_status: int = 143  # how its main process ends on SIGTERM where the field cannot see it (torchrun)
    deaths: list[str] = field(default_factory=list)  # its deaths in the default matrix (any may be asked for)
    prepare: Callable[[Env], None] = lambda env: None

    def command(self, env: Env, run: Path, armed: bool, long: bool) -> list[str]:
        """The job's command line (`--arm`: fieldrun calls blackbox.arm() first)."""
        inner = [str(FIELDRUN), *(["--arm"] if armed else []), str(self.script(env)), *self.args(env, run, long)]
        if self.ranks > 1 and self.launcher == "accelerate":  # torchrun's agent inside accelerate's process
            accelerate = str(self.python(env).parent / "accelerate")
            return [accelerate, "launch", "--multi_gpu", f"--num_processes={self.ranks}", "--num_machines=1",
                    "--mixed_precision=no", "--dynamo_backend=no", f"--main_process_port={_free_port()}", *inner]
        if self.ranks > 1:
            torchrun = str(self.python(env).parent / "torchrun")
            return [torchrun, "--standalone", f"--nproc-per-node={self.ranks}", *inner]
        return [str(self.python(env)), *inner]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _venv(env: Env) -> Path:
    return env.venv / "bin" / "python"


def _venv_tv(env: Env) -> Path:
    return env.venv_tv / "bin" / "python"


def _idx(path: Path, magic: int, dims: tuple[int, ...], payload: bytes) -> None:
    path.write_bytes(struct.pack(">i", magic) + b"".join(struct.pack(">i", d) for d in dims) + payload)


def prepare_mnist(env: Env) -> None:
    """MNIST's own file format (idx, uncompressed) in data/mnist/MNIST/raw, so its download is skipped."""
    import numpy as np

    raw = env.data / "mnist" / "MNIST" / "raw"
    if (raw / "t10k-labels-idx1-ubyte").exists():
        return
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 3200), ("t10k", 640)):
        labels = rng.integers(0, 10, n, dtype=np.uint8)
        images = rng.integers(0, 40, (n, 28, 28), dtype=np.uint8)
        for k in range(10):  # a bright bar per digit: something to learn
            images[labels == k, 2 * k + 2 : 2 * k + 5, 4:24] = 255
        _idx(raw / f"{prefix}-images-idx3-ubyte", 2051, (n, 28, 28), images.tobytes())
        _idx(raw / f"{prefix}-labels-idx1-ubyte", 2049, (n,), labels.tobytes())


def _mnist_args(env: Env, run: Path, long: bool) -> list[str]:
    data = run / "data"
    if not data.exists():
        data.symlink_to(env.data / "mnist")
    return ["--epochs", "40" if long else "2", "--log-interval", "10", "--no-accel", "--save-model"]


def _mnist_cwd(env: Env, run: Path) -> Path:
    work = run / "work"  # its '../data' is run/data; mnist_cnn.pt lands here
    work.mkdir(exist_ok=True)
    return work


CPU_DDP_PATCH = [  # nanoGPT's DDP path assumes CUDA; the same two lines for every mode
    ("    device = f'cuda:{ddp_local_rank}'\n    torch.cuda.set_device(device)\n",
     "    if device.startswith('cuda'):\n        device = f'cuda:{ddp_local_rank}'\n"
     "        torch.cuda.set_device(device)\n"),
    ("model = DDP(model, device_ids=[ddp_local_rank])",
     "model = DDP(model, device_ids=[ddp_local_rank] if device.startswith('cuda') else None)"),
]  # fmt: skip


def prepare_nanogpt(env: Env) -> None:
    """A char dataset in nanoGPT's format (uint16 train.bin/val.bin, meta.pkl) and its CPU DDP patch."""
    root = env.src / "nanoGPT"
    train = root / "train.py"
    text = train.read_text()
    for old, new in CPU_DDP_PATCH:
        if old in text:
            text = text.replace(old, new)
        elif new not in text:
            raise SystemExit(f"field: nanoGPT's train.py has changed; expected {old!r}")
    train.write_text(text)
    data = root / "data" / "field"
    if (data / "meta.pkl").exists():
        return
    data.mkdir(parents=True, exist_ok=True)
    corpus = "".join(p.read_text() for p in sorted(root.glob("*.py"))) * 4
    chars = sorted(set(corpus))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = [stoi[c] for c in corpus]
    cut = len(ids) * 9 // 10
    (data / "train.bin").write_bytes(struct.pack(f"<{cut}H", *ids[:cut]))
    (data / "val.bin").write_bytes(struct.pack(f"<{len(ids) - cut}H", *ids[cut:]))
    with open(data / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}, f)


def _nanogpt_args(env: Env, run: Path, long: bool) -> list[str]:
    return [
        "--dataset=field", "--backend=gloo", "--device=cpu", "--compile=False", "--dtype=float32",
        "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64", "--batch_size=8",
        "--gradient_accumulation_steps=3", f"--max_iters={100000 if long else 60}", "--lr_decay_iters=60",
        "--warmup_iters=5", "--eval_interval=25", "--eval_iters=2", "--log_interval=1", f"--out_dir={run / 'out'}",
    ]  # fmt: skip


def _own(name: str) -> Callable[[Env, Path, bool], list[str]]:
    def args(env: Env, run: Path, long: bool) -> list[str]:
        return [str(run / "out"), "1000000" if long else "60"]

    return args


JOBS = {
    "mnist": Job(
        "mnist", _venv_tv, lambda e: e.src / "examples" / "mnist" / "main.py", _mnist_args, _mnist_cwd,
        leak_mib=32, timeout_s=12, prepare=prepare_mnist, progress=r"^Train Epoch: ",
        deaths=["sigkill", "oom", "ctrlc", "systemexit2", "timeout", "exit-hang", "segv", "rerun", "container"],
    ),
    "nanogpt": Job(
        "nanogpt", _venv, lambda e: e.src / "nanoGPT" / "train.py", _nanogpt_args, lambda e, r: e.src / "nanoGPT",
        ranks=3, leak_mib=24, leak_rank=1, timeout_s=25, prepare=prepare_nanogpt, progress=r"^iter \d+: loss",
        deaths=["sigkill", "oom", "exit3", "slurm", "timeout", "exit-hang", "segv"],
    ),
    # the same nanoGPT ranks launched by `accelerate launch --multi_gpu` (nanoGPT reads torchrun's variables)
    "nanogpt-accel": Job(
        "nanogpt-accel", _venv, lambda e: e.src / "nanoGPT" / "train.py", _nanogpt_args, lambda e, r: e.src / "nanoGPT",
        ranks=3, launcher="accelerate", leak_mib=24, leak_rank=1, timeout_s=25, prepare=prepare_nanogpt,
        progress=r"^iter \d+: loss", deaths=["sigkill", "oom", "exit3", "timeout", "segv"],
    ),
    "hf": Job(
        "hf", _venv, lambda e: HERE / "hf_job.py", _own("hf"), lambda e, r: r, worker_args=True, timeout_s=20,
        worker_leak_mib=4, progress=r"^\{'loss': ",
        deaths=["sigkill", "oom", "workers-spawn", "ctrlc", "slurm", "pod", "container", "exit-hang", "segv"],
    ),
    "lightning": Job(
        "lightning", _venv, lambda e: HERE / "lightning_job.py", _own("lightning"), lambda e, r: r,
        worker_args=True, timeout_s=12, sigterm_status=0,  # (its own handler takes SIGTERM; 2.6.6 then exits 0)
        deaths=["sigkill", "oom", "workers-forkserver", "ctrlc", "exit3", "slurm", "pod", "container", "exit-hang",
                "segv", "rerun"],
    ),
}  # fmt: skip
