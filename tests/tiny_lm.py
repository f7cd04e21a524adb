"""A tiny causal language model for tests: token ids [B, T] -> logits [B, T, V], no downloaded weights.

Embedding -> one causal self-attention layer (with learned positions) -> MLP -> vocabulary logits.
Causal, so right padding after the real tokens never changes the logits at real positions, which is
what the engines and the trainer's log-prob recomputation rely on.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int = 16, hidden: int = 16, max_len: int = 64, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.vocab_size = vocab_size
        self.embed = nn.Embedding(vocab_size, hidden)
        self.pos = nn.Embedding(max_len, hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 2 * hidden), nn.Tanh(), nn.Linear(2 * hidden, hidden))
        self.head = nn.Linear(hidden, vocab_size)
        with torch.no_grad():  # deterministic init independent of the global RNG
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(t, device=tokens.device))
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        causal = torch.ones(t, t, dtype=torch.bool, device=tokens.device).tril()
        att = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        att = att.masked_fill(~causal, -torch.inf).softmax(-1)
        x = x + att @ v
        x = x + self.mlp(x)
        return self.head(x)
