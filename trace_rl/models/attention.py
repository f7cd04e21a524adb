"""Grouped-query attention with optional QK-norm, and its K/V path through the precision plan.

Two ways to run, over the same projections:

- trainer (`kv is None`): causal attention over the whole sequence. When the trainer is aligned with a
  quantized KV cache (`kv_fake_fmt` set by `Decoder.apply_plan`), K and V are quantize-dequantized per
  token and head with the cache's format (straight-through gradient), exactly what the rollout reads
  back from its cache.
- rollout (`kv` given): `kv.attend(layer_idx, q, k, v)` writes K/V into the engine's paged cache and
  attends over what the cache holds (see `trace_rl.kv.KVStep`). The model knows nothing of
  pages, slots or kernels; any object with that `attend` method works.

K is stored after RoPE (and after QK-norm), as every paged cache does.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from trace_rl.backends import backend_for_format
from trace_rl.kv.causal import causal_attention
from trace_rl.models.config import ModelConfig
from trace_rl.models.linear import Linear, shared_input
from trace_rl.models.norm import RMSNorm
from trace_rl.models.rope import apply_rope
from trace_rl.op_ranges import op_range


class KVAttend(Protocol):
    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, T, Hq, D], k/v [B, T, Hkv, D] (new tokens) -> attention output [B, T, Hq, D]."""


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int):
        super().__init__()
        c = config
        self.layer_idx = layer_idx
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_heads, c.num_kv_heads, c.head_dim
        self.scale = c.head_dim ** -0.5
        self.q_proj = Linear(c.hidden_size, c.num_heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = Linear(c.num_heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.kv_fake_fmt: str | None = None   # trainer aligned/guided with a quantized KV cache
        # TRACE hook point for K/V (as Linear.activation_hook for inputs): called `kv_hook(self, k, v)` where
        # K/V are quantized; the rollout records there, the guided trainer gets (k_record, v_record) back.
        self.kv_hook = None
        self.qkv_proj: Linear | None = None    # rollout only: q/k/v stacked (Decoder.to_rollout(fuse=True))

    def input_projections(self) -> list[Linear]:
        """The layers that read this block's input: [qkv_proj] once stacked, else [q_proj, k_proj, v_proj]."""
        return [self.qkv_proj] if self.qkv_proj is not None else [self.q_proj, self.k_proj, self.v_proj]

    def forward(self, x: torch.Tensor | None, cos: torch.Tensor, sin: torch.Tensor,
                kv: KVAttend | None = None, xq=None) -> torch.Tensor:
        """`xq`: x already quantized for `input_projections()` by the norm before (models/norm_input.py); x may
        then be None (not written: no activation hook)."""
        b, t = (x.shape if x is not None else xq.shape)[:2]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if self.qkv_proj is not None:
            qkv = self.qkv_proj(x) if xq is None else shared_input([self.qkv_proj], x, xq)[0]
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        else:
            q, k, v = shared_input([self.q_proj, self.k_proj, self.v_proj], x, xq)
        q, k, v = q.view(b, t, hq, d), k.view(b, t, hkv, d), v.view(b, t, hkv, d)
        if kv is not None and self.kv_hook is None and getattr(kv, "fuses_prologue", None) and kv.fuses_prologue(q):
            qn = self.q_norm.weight if self.q_norm is not None else None
            kn = self.k_norm.weight if self.k_norm is not None else None
            eps = self.q_norm.eps if self.q_norm is not None else 0.0
            out = kv.attend_prologue(self.layer_idx, q, k, v, cos, sin, qn, kn, eps)
            return self.o_proj(out.reshape(b, t, hq * d))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        with op_range("rope"):
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv is not None:
            if self.kv_hook is not None:
                self.kv_hook(self, k, v)
            out = kv.attend(self.layer_idx, q, k, v)
        else:
            if self.kv_fake_fmt is not None:   # per token and head; TRACE: the rollout's records if given
                guidance = (self.kv_hook(self, k, v) if self.kv_hook is not None else None) or (None, None)
                backend = backend_for_format(self.kv_fake_fmt)
                k = backend.fake_quantize(k, self.kv_fake_fmt, guidance[0])
                v = backend.fake_quantize(v, self.kv_fake_fmt, guidance[1])
            out = causal_attention(q, k, v, self.scale)
        return self.o_proj(out.reshape(b, t, hq * d))
