"""A tiny HF Trainer job: a 2-layer GPT-2 built from its config (no hub), random tokens, CPU.

    python hf_job.py OUT_DIR STEPS [--workers N --context spawn|forkserver] [--worker-leak MIB]
"""

from __future__ import annotations

import argparse
import multiprocessing

import torch
from torch.utils.data import Dataset, get_worker_info
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

KEPT: list[bytes] = []


class RandomTokens(Dataset):  # type: ignore[type-arg]
    def __init__(self, leak_mib: int) -> None:
        self.leak_mib = leak_mib

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        info = get_worker_info()
        if self.leak_mib and info is not None and info.id == 0:
            KEPT.append(b"\x01" * (self.leak_mib << 20))  # worker 0 leaks: the planted OOM victim
        ids = torch.randint(0, 256, (32,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("steps", type=int)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--context", default="spawn")
    p.add_argument("--worker-leak", type=int, default=0)
    a = p.parse_args()
    if a.workers:
        multiprocessing.set_start_method(a.context, force=True)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=2))
    args = TrainingArguments(
        output_dir=a.out, max_steps=a.steps, per_device_train_batch_size=8, logging_steps=5, save_steps=20,
        report_to=[], use_cpu=True, dataloader_num_workers=a.workers, learning_rate=1e-3, seed=0,
        disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=RandomTokens(a.worker_leak)).train()
    print("hf_job: done", flush=True)


if __name__ == "__main__":
    main()
