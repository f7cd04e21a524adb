"""RMSNorm as transformers computes it: normalise in float32, cast back, then scale (weight in its dtype).

float64 inputs stay float64 (CPU tests compare code paths in float64 so that quantization rounding
boundaries are never crossed by float32 noise).

`add(x, residual)` is the decoder's residual stream: (norm(x + residual), x + residual). In a rollout
model on a GPU (`fused = True`, set by `Decoder.to_rollout`) both the plain and the residual form run as
one Triton kernel (`trace_rl.kernels.add_rms_norm`, same rounding sequence); elsewhere, and always in
the trainer, they are the torch ops below.
"""

from __future__ import annotations

import torch
from torch import nn

from trace_rl.op_ranges import op_range


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps
        self.fused = False          # rollout on a GPU: one kernel per norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fused and x.is_cuda:
            from trace_rl import kernels

            with op_range("norm"):
                return kernels.add_rms_norm(x, None, self.weight, self.eps)[0]
        dtype = x.dtype
        h = x if dtype == torch.float64 else x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)

    def add(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual); residual None: (norm(x), x)."""
        if residual is None:
            return self(x), x
        if self.fused and x.is_cuda:
            from trace_rl import kernels

            with op_range("norm"):
                return kernels.add_rms_norm(x, residual, self.weight, self.eps)
        with op_range("norm"):
            residual = x + residual
        return self(residual), residual

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
