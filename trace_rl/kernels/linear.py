"""`fp4_linear`: the fp4 backend's GPU linear (W4A16 or W4A4) on a `PackedWeight`, through the FP4 GEMM."""

from __future__ import annotations

import torch

from trace_rl.formats import per_token
from trace_rl.kernels.fp4_gemm import GemmConfig, fp4_matmul
from trace_rl.kernels.row_quantize import quantize_dequant_bf16


def weight_layout(packed) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(int32 words [N, K/8], uint8 scales [N, K/G], float32 [1] global or None): views of `packed.q`,
    cached in `packed.layout` (QuantLinear clears it on weight sync; the views are re-derived then)."""
    q = packed.q
    cached = packed.layout.get("fp4_gemm")
    if cached is not None and cached[0].data_ptr() == q.codes.data_ptr():
        return cached
    codes = q.codes if q.codes.is_contiguous() else q.codes.contiguous()
    scales = q.scales.contiguous().view(torch.uint8)
    glob = None if q.global_scale is None else q.global_scale.reshape(1).float()
    layout = (codes.view(torch.int32), scales, glob)
    packed.layout["fp4_gemm"] = layout
    return layout


def fp4_linear(x: torch.Tensor, packed, act_fmt: str = "bf16", bias: torch.Tensor | None = None,
               config: GemmConfig | None = None) -> torch.Tensor:
    """y [..., N] = act(x) @ dequant(W)^T + bias in x.dtype. act_fmt "bf16" (W4A16) or packed.fmt (W4A4:
    x quantized per token to `per_token(packed.fmt)`, i.e. nvfp4:row or mxfp4)."""
    if packed.fmt not in ("nvfp4", "mxfp4") or packed.q is None:
        raise ValueError(f"fp4_linear takes an nvfp4 or mxfp4 PackedWeight, got format {packed.fmt!r}")
    if act_fmt not in ("bf16", packed.fmt):
        raise ValueError(f"fp4_linear: activations in {act_fmt!r} with {packed.fmt!r} weights is not supported; "
                         f"use 'bf16' (W4A16) or {packed.fmt!r} (W4A4)")
    K, N = packed.in_features, packed.out_features
    if x.shape[-1] != K:
        raise ValueError(f"fp4_linear: x has {x.shape[-1]} features, the weight expects {K}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, K)
    words, scales, glob = weight_layout(packed)
    row_scale = None
    if act_fmt == "bf16":
        xb = x2.to(torch.bfloat16)
        xb = xb if xb.stride(-1) == 1 else xb.contiguous()
    else:
        xb, row_scale = quantize_dequant_bf16(x2 if x2.stride(-1) == 1 else x2.contiguous(), per_token(act_fmt))
    if xb.shape[0] == 0:
        return x.new_empty(*lead, N)
    y = fp4_matmul(xb, words, scales, glob, packed.fmt == "mxfp4", row_scale, bias, out_dtype=x.dtype,
                   config=config)
    return y.reshape(*lead, N)
