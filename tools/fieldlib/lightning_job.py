"""A small Lightning job: an MLP on random data, CPU, checkpoints and a CSV log in OUT_DIR.

    python lightning_job.py OUT_DIR STEPS [--workers N --context spawn|forkserver] [--worker-leak MIB]
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, Dataset, get_worker_info

KEPT: list[bytes] = []


class RandomRows(Dataset):  # type: ignore[type-arg]
    def __init__(self, leak_mib: int) -> None:
        self.leak_mib = leak_mib

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        info = get_worker_info()
        if self.leak_mib and info is not None and info.id == 0:
            KEPT.append(b"\x01" * (self.leak_mib << 20))  # worker 0 leaks: the planted OOM victim
        g = torch.Generator().manual_seed(i)
        return torch.randn(64, generator=g), torch.randn(1, generator=g)


class Regressor(L.LightningModule):  # type: ignore[misc]  # lightning is optional: untyped (Any) where it is absent
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], index: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("steps", type=int)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--context", default="spawn")
    p.add_argument("--worker-leak", type=int, default=0)
    a = p.parse_args()
    L.seed_everything(0)
    loader = DataLoader(RandomRows(a.worker_leak), batch_size=32, num_workers=a.workers,
                        multiprocessing_context=a.context if a.workers else None)  # fmt: skip
    trainer = L.Trainer(
        max_steps=a.steps, accelerator="cpu", devices=1, default_root_dir=a.out, log_every_n_steps=5,
        logger=CSVLogger(a.out), enable_progress_bar=False, enable_model_summary=True,
        callbacks=[ModelCheckpoint(dirpath=f"{a.out}/ckpt", every_n_train_steps=20, save_top_k=-1)],
    )  # fmt: skip
    trainer.fit(Regressor(), loader)
    print("lightning_job: done", flush=True)


if __name__ == "__main__":
    main()
