"""A decoder norm whose output is the input of a W4A4 projection group: the norm and that group's activation
quantization as one step (issue 16 item 3).

In the rollout, `DecoderLayer` carries the residual stream through `RMSNorm.add` and the next projections quantize
its output per token (`shared_input`: one quantize launch for q/k/v; `Linear.forward` for a stacked qkv_proj).
When those projections are one `w4a4_group`, `norm_into_group` asks their backend for both at once
(`Backend.norm_quantize_input`: the fp4 backend's one fused kernel on the GPU, same bits) and hands the quantized
input on (`shared_input(parts, h, xq)`). The norm knows nothing of the projections and the projections nothing of
the norm; the parent layer, which holds both, connects them, and the backend (the plan's formats) decides whether
it fuses. h is written only when a projection has an activation hook (the hook must see it).

`FUSE_NORM_QUANTIZE = False` runs the norm and the quantization apart (the A/B switch of the engine test and the
`normquant` GPU check; the same bits either way).
"""

from __future__ import annotations

import torch

from trace_rl.models.linear import Linear, w4a4_group
from trace_rl.models.norm import RMSNorm
from trace_rl.op_ranges import op_range

FUSE_NORM_QUANTIZE = True


def norm_into_group(norm: RMSNorm, x: torch.Tensor, residual: torch.Tensor | None,
                    parts: list[Linear]) -> tuple[torch.Tensor | None, torch.Tensor, object | None]:
    """`norm.add(x, residual)` for a norm that feeds `parts` -> (h, x + residual, xq): xq the parts' quantized input
    (pass it to `shared_input(parts, h, xq)`) where their backend fused the quantization into the norm, else None
    (h is then always there). h is None when fused and no part has an activation hook."""
    first = w4a4_group(parts) if FUSE_NORM_QUANTIZE and norm.fused else None
    if first is not None:
        keep_h = any(p.activation_hook is not None for p in parts)
        with op_range("norm"):
            out = first.backend.norm_quantize_input(x, residual, norm.weight, norm.eps, first.packed, first.act_fmt,
                                                    keep_h)
        if out is not None:
            return out
    h, residual = norm.add(x, residual)
    return h, residual, None
