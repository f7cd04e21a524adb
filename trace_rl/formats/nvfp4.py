"""NVFP4: E2M1 elements in blocks of 16, one E4M3 scale per block, one float32 global scale.

The global scale covers the whole tensor (`nvfp4`, weights) or each row along the last dim
(`nvfp4:row`: activations per token and the KV cache per token and head). Row-global scales make a
token's codes independent of which other tokens share its batch, which a KV cache (whose future amax
is unknown) and batch-invariant trainer/rollout agreement both need.

The reference below is the spec; kernels match it bit for bit on codes and scales. All arithmetic is
float32 with correctly rounded operations, in this order:

    amax         = max |x| over the finite elements of the tensor (or of the row, for nvfp4:row)
    global_scale = amax / 2688            (2688 = 6 * 448; 1.0 when amax == 0)
    block_amax   = max |x| over the finite elements of the block
    scale        = e4m3_rne(min((block_amax / 6) / global_scale, 448))
    step         = float32(scale) * global_scale
    code         = e2m1_encode(x / step)  (ties to even, saturating at 6; x * 0 when step == 0,
                                           so a zero block, or one whose scale underflows, is all zeros)
    dequantized  = e2m1_value(code) * step

Non-finite input: a block holding NaN or +-Inf gets the E4M3 NaN scale, so every element of that block
dequantizes to NaN (a NaN is never turned into a finite value); other blocks are unaffected.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_rl.formats.base import Format, check_block_divisible
from trace_rl.formats.e2m1 import E2M1_MAX, e2m1_decode, e2m1_encode, pack_nibbles, unpack_nibbles
from trace_rl.formats.qtensor import QTensor

E4M3_MAX = 448.0
NVFP4_GLOBAL_DIVISOR = E2M1_MAX * E4M3_MAX  # 2688


def nvfp4_global_scale(x: torch.Tensor, per_row: bool = False) -> torch.Tensor:
    """float32 amax over finite elements / 2688 (1.0 where that amax is 0): a scalar, or [..., 1] per row."""
    xf = x.float().abs()
    xf = torch.where(torch.isfinite(xf), xf, 0.0)
    if per_row:
        amax = xf.amax(dim=-1, keepdim=True)
    else:
        amax = xf.amax() if xf.numel() else xf.new_zeros(())
    # Divide by a tensor, not a Python float: CUDA turns division by a Python scalar into multiplication
    # by its reciprocal, which is not correctly rounded and would differ from the CPU by an ulp.
    return torch.where(amax > 0, amax / torch.full_like(amax, NVFP4_GLOBAL_DIVISOR), torch.ones_like(amax))


@dataclass(frozen=True)
class NVFP4(Format):
    global_scaling: str = "tensor"   # "tensor" | "row"
    block_size: int = 16

    def __post_init__(self):
        if self.global_scaling not in ("tensor", "row"):
            raise ValueError(f"nvfp4 global_scaling must be 'tensor' or 'row', got {self.global_scaling!r}")

    @property
    def name(self) -> str:  # type: ignore[override]
        return "nvfp4" if self.global_scaling == "tensor" else "nvfp4:row"

    @property
    def bits_per_value(self) -> float:
        return 4 + 8 / self.block_size

    def quantize(self, x: torch.Tensor, global_scale: torch.Tensor | None = None) -> QTensor:
        """`global_scale` may be given (float32, broadcastable to [..., 1]) to reuse a known scale."""
        check_block_divisible(x, self.block_size, self.name)
        xf = x.float()
        blocks = xf.reshape(*xf.shape[:-1], xf.shape[-1] // self.block_size, self.block_size)
        finite = torch.isfinite(blocks)
        bad_block = ~finite.all(dim=-1)
        per_row = self.global_scaling == "row"
        gs = nvfp4_global_scale(xf, per_row) if global_scale is None else global_scale.float()
        gs_b = gs if gs.dim() == 0 else gs.expand(*xf.shape[:-1], 1)   # broadcast over the row's blocks
        block_amax = torch.where(finite, blocks.abs(), 0.0).amax(dim=-1)
        scale = ((block_amax / torch.full_like(block_amax, E2M1_MAX)) / gs_b).clamp(max=E4M3_MAX)
        scale = scale.to(torch.float8_e4m3fn)
        scale = torch.where(bad_block, torch.full_like(scale, float("nan")), scale)
        step = (scale.float() * gs_b).unsqueeze(-1)
        scaled = torch.where(step == 0, blocks * 0, blocks / step)
        codes = e2m1_encode(scaled).reshape(xf.shape)
        return QTensor(pack_nibbles(codes), scale, gs_b.clone(), tuple(x.shape), x.dtype, self.name)

    def dequantize(self, q: QTensor) -> torch.Tensor:
        self._check_q(q)
        values = e2m1_decode(unpack_nibbles(q.codes))
        blocks = values.reshape(*values.shape[:-1], -1, self.block_size)
        step = (q.scales.float() * q.global_scale).unsqueeze(-1)
        return (blocks * step).reshape(q.shape)
