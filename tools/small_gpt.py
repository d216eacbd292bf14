"""A realistic training step for the overhead benchmarks: a small GPT on the CPU, one thread.

    from small_gpt import gpt_step
    step = gpt_step()          # builds the model and its AdamW; returns one training step
    step()                     # forward, loss, backward, optimizer step

``mlp_step()`` is the lighter step the benchmarks also use (an MLP of 8 layers of 256, batch 64).

4 blocks of d=128 with 4 heads, a 512-token vocabulary, sequences of 64 tokens,
batch 16: about 1 M parameters, 20 to 100 ms a step on one core of the 2-vCPU VM
(the issue's realistic step). Each step allocates and frees a few thousand
blocks (activations, gradients, attention's temporaries) through torch's CPU
allocator and Python objects through pymalloc, as a real loop does.
"""

from __future__ import annotations

from collections.abc import Callable


def gpt_step(*, batch: int = 16, blocks: int = 4, width: int = 128, seq: int = 64) -> Callable[[], None]:
    import torch
    from torch import nn

    torch.set_num_threads(1)
    torch.manual_seed(0)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
            self.att = nn.MultiheadAttention(width, 4, batch_first=True)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            a = self.ln1(x)
            x = x + self.att(a, a, a, attn_mask=mask, need_weights=False)[0]
            mlp: torch.Tensor = self.mlp(self.ln2(x))
            return x + mlp

    class GPT(nn.Module):
        def __init__(self, vocab: int = 512) -> None:
            super().__init__()
            self.tok, self.pos = nn.Embedding(vocab, width), nn.Embedding(seq, width)
            self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
            self.ln, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)
            self.register_buffer("mask", torch.triu(torch.ones(seq, seq, dtype=torch.bool), 1))

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x, self.mask)
            return self.head(self.ln(x))  # type: ignore[no-any-return]

    model = GPT()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def step() -> None:
        idx = torch.randint(0, 512, (batch, seq))
        loss = nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten())
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        opt.step()

    return step


def mlp_step() -> Callable[[], None]:
    """One training step of an MLP (8 Linear(256, 256) + ReLU, then Linear(256, 10), AdamW), batch 64."""
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(8):
        layers += [torch.nn.Linear(256, 256), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(256, 10))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(64, 256), torch.randint(0, 10, (64,))

    def step() -> None:
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()  # type: ignore[no-untyped-call]  # torch leaves Tensor.backward unannotated
        opt.step()

    return step
