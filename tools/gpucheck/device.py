"""The device a GPU-check job runs on: a real CUDA device through the job's torch, or the fake one.

Jobs (job.py) are written once against this small surface, so ``--dry-run`` drives the same code
paths as the real run: initialise the device, allocate and free device buffers, read PyTorch's own
``memory_stats()``, and take training steps (a small GPT in bf16 on a GPU; numpy work and fake
allocations on the fake device).
"""

from __future__ import annotations

import time
from typing import Any


class Device:
    """``fake``: the stand-in backend (fake_cuda.py) installed as ``torch``; else the real torch on CUDA."""

    def __init__(self, fake: bool) -> None:
        self.fake = fake
        if fake:
            from fake_cuda import install

            self.torch = install()
        else:
            import torch

            self.torch = torch
        self.OOM: type[BaseException] = self.torch.OutOfMemoryError

    def init(self) -> None:
        """Initialise CUDA, as a job does at its first device tensor."""
        if self.fake:
            import fake_cuda

            for call, _ in self.torch.cuda._queued_calls:  # what torch.cuda._lazy_init runs, in its order
                call()
            fake_cuda.STATE["initialised"] = True
        else:
            self.torch.ones(1, device="cuda")
            self.torch.cuda.synchronize()

    def empty(self, nbytes: int) -> Any:
        """A device buffer of ``nbytes`` (uninitialised, as ``torch.empty``): freed with its last reference."""
        if self.fake:
            import fake_cuda

            return fake_cuda.Tensor(nbytes)
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device="cuda")

    def stats(self) -> dict[str, Any]:
        """PyTorch's flat ``torch.cuda.memory_stats()``, the figures users compare with."""
        return {k: v for k, v in self.torch.cuda.memory_stats().items() if isinstance(v, (int, float))}

    def mem_get_info(self) -> tuple[int, int]:
        free, total = self.torch.cuda.mem_get_info()
        return int(free), int(total)

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def name(self) -> str:
        return str(self.torch.cuda.get_device_name(0))

    def optimizer(self) -> Any:
        """A training job's optimizer (its first use imports torch._dynamo, and so torch._inductor)."""
        if self.fake:
            return self.torch.optim.SGD([self.empty(4096)], lr=0.1)
        return self.torch.optim.SGD([self.torch.zeros(1024, device="cuda", requires_grad=True)], lr=0.1)

    def inductor_imported_by(self) -> str | None:
        """On the fake device, the thread that imported torch._inductor (None on a real one: not known)."""
        if self.fake:
            import fake_cuda

            return fake_cuda.STATE["inductor_imported_by"]  # type: ignore[no-any-return]
        return None

    def trainer(self, batch: int = 16) -> Trainer:
        return FakeTrainer(batch) if self.fake else GptTrainer(self.torch, batch)


class Trainer:
    """One training step at a time; ``step()`` returns its time in seconds (the device synchronised)."""

    batch: int

    def set_batch(self, batch: int) -> None:
        """Train on batches of ``batch`` from the next step on."""
        raise NotImplementedError

    def step(self) -> float:
        raise NotImplementedError


class GptTrainer(Trainer):
    """A small GPT (8 layers, width 768, 512 tokens, vocabulary 8192) in bf16 with AdamW: a real
    forward, backward and optimizer step, 5-50 ms on an H100/H200 at the batch sizes used here."""

    def __init__(self, torch: Any, batch: int) -> None:
        nn, F = torch.nn, torch.nn.functional
        self.torch, self.batch = torch, batch
        width, heads, layers, self.tokens, self.vocab = 768, 12, 8, 512, 8192

        class Block(nn.Module):  # type: ignore[misc,name-defined]  # nn: the torch passed in (Any)
            def __init__(self) -> None:
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
                self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
                self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

            def forward(self, x: Any) -> Any:
                b, t, c = x.shape
                q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
                q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
                x = x + self.proj(y)
                return x + self.down(F.gelu(self.up(self.ln2(x))))

        class Gpt(nn.Module):  # type: ignore[misc,name-defined]  # nn: the torch passed in (Any)
            def __init__(self, vocab: int, tokens: int) -> None:
                super().__init__()
                self.emb, self.pos = nn.Embedding(vocab, width), nn.Embedding(tokens, width)
                self.blocks = nn.ModuleList(Block() for _ in range(layers))
                self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab, bias=False)

            def forward(self, idx: Any) -> Any:
                x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
                for block in self.blocks:
                    x = block(x)
                return self.head(self.ln(x))

        torch.manual_seed(0)
        self.model = Gpt(self.vocab, self.tokens).to(device="cuda", dtype=torch.bfloat16)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.set_batch(batch)

    def set_batch(self, batch: int) -> None:
        self.batch = batch
        g = self.torch.Generator(device="cuda").manual_seed(1)
        self.x = self.torch.randint(0, self.vocab, (batch, self.tokens), device="cuda", generator=g)
        self.y = self.torch.randint(0, self.vocab, (batch, self.tokens), device="cuda", generator=g)

    def step(self) -> float:
        torch = self.torch
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        logits = self.model(self.x)
        loss = torch.nn.functional.cross_entropy(logits.view(-1, self.vocab).float(), self.y.view(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        torch.cuda.synchronize()
        return time.perf_counter() - t0


class FakeTrainer(Trainer):
    """CPU work of a few milliseconds, fake device buffers made and freed, and the optimizer's hooks."""

    def __init__(self, batch: int) -> None:
        import numpy as np

        self.np, self.batch = np, batch
        self.a = np.random.default_rng(0).standard_normal((192, 192))
        self.params = [self._buffer(4 << 20) for _ in range(4)]
        import fake_cuda

        self.opt = fake_cuda.Optimizer(self.params)

    def _buffer(self, nbytes: int) -> Any:
        import fake_cuda

        return fake_cuda.Tensor(nbytes)

    def set_batch(self, batch: int) -> None:
        self.batch = batch

    def step(self) -> float:
        import fake_cuda

        t0 = time.perf_counter()
        activations = [self._buffer((1 << 20) * (1 + i % 4)) for i in range(self.batch)]
        x = self.a
        for _ in range(self.batch // 4 + 1):
            x = self.np.tanh(x @ self.a)
        del activations
        fake_cuda.optimizer_step(self)
        return time.perf_counter() - t0
