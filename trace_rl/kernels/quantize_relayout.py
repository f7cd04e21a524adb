"""nvfp4 weight quantization with the Hopper re-layout fused into its store (opt-in, the weight sync's
`quantize_relayout(w, "nvfp4", out=layout)`): one pass over the weight writes the QTensor's codes and scales
and the Hopper layout (hopper_fp4.py), instead of `relayout(quantize(w, "nvfp4", fast=True), out=layout)`,
which reads the codes and scales back. Same bits as that pair (tests/kernels/test_quantize_relayout.py).

A program owns 16 rows (one layout block row) and walks K in 128-column steps, as `fp4_relayout`'s kernel
does; each step loads the [16, 128] chunk as 128 blocks of 16 (one per tile row), quantizes them with
`weight_quantize.fp4_block_codes`, stores codes and scales, then folds scale signs / zero scales into the
codes, re-encodes the scales and places the codes' bits with `fp4_relayout`'s helpers. mxfp4 is not fused
(its layout scales need the row's largest block exponent before the first store: a second pass over the
row); use `relayout(quantize(w, "mxfp4", fast=True))` for it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats import QTensor
from trace_rl.kernels.fp4_relayout import NV_FACTOR_SCALE, _nv_encode, _pack_word
from trace_rl.kernels.fp_bits import fast_div_ok
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4
from trace_rl.kernels.row_quantize import tensor_amax_bits
from trace_rl.kernels.weight_quantize import fp4_block_codes, nvfp4_tensor_scale


@triton.jit
def _quantize_relayout_kernel(x_ptr, codes_ptr, scales_ptr, gscale_ptr, amax_ptr, values_ptr, out_scales_ptr,
                              rf_ptr, N, K, KP, stride_v, stride_os):
    pid = tl.program_id(0)
    rows = pid * 16 + tl.arange(0, 16)
    row_ok = rows < N
    t_amax, g = nvfp4_tensor_scale(amax_ptr)
    fast_div = fast_div_ok(t_amax)
    if pid == 0:
        tl.store(gscale_ptr, g)
    j = tl.arange(0, 128)                      # tile row j: row j // 8 of the program, block j % 8 of the step
    r = (pid * 16 + j // 8).to(tl.int64)
    for k0 in range(0, KP, 128):
        cb = k0 // 16 + j % 8
        ok = (r < N) & (cb < K // 16)
        xb = tl.load(x_ptr + r[:, None] * K + cb[:, None] * 16 + tl.arange(0, 16)[None, :], mask=ok[:, None],
                     other=0.0).to(tl.float32)
        codes, sc = fp4_block_codes(xb, g, fast_div, False)
        lo, hi = tl.split(tl.reshape(codes, [128, 8, 2]))
        tl.store(codes_ptr + r[:, None] * (K // 2) + cb[:, None] * 8 + tl.arange(0, 8)[None, :],
                 (lo | (hi << 4)).to(tl.uint8), mask=ok[:, None])
        tl.store(scales_ptr + r * (K // 16) + cb, sc.to(tl.uint8), mask=ok)
        # the re-layout (fp4_relayout._relayout_kernel, nvfp4): padding blocks are code 0 under scale byte 0
        codes = tl.where(ok[:, None], codes, 0)
        out_b, flip, zero = _nv_encode(tl.where(ok, sc, 0))
        blocks = tl.where(zero[:, None], codes & 8, codes) ^ flip[:, None]
        sc_cols = k0 // 16 + tl.arange(0, 8)
        tl.store(out_scales_ptr + rows[:, None].to(tl.int64) * stride_os + sc_cols[None, :],
                 tl.reshape(out_b, [16, 8]).to(tl.uint8))
        c = tl.reshape(blocks, [2, 8, 4, 2, 2, 4, 2])                           # h g i r c t e
        c = tl.permute(c, (0, 1, 5, 2, 3, 4, 6))                                # h g t i r c e
        word = tl.reshape(_pack_word(tl.reshape(c, [2, 8, 4, 4, 8])), [256])
        tl.store(values_ptr + pid.to(tl.int64) * stride_v + (k0 // 128) * 256 + tl.arange(0, 256), word)
    tl.store(rf_ptr + rows, tl.where(row_ok, g * NV_FACTOR_SCALE, 1.0))


def quantize_relayout(w: torch.Tensor, fmt: str, out: HopperFP4 | None = None,
                      q: QTensor | None = None) -> tuple[QTensor, HopperFP4]:
    """(`quantize(w, "nvfp4")`, its Hopper layout) in one pass over w [N, K]: the same bits as
    `relayout(quantize(w, "nvfp4"), out)`. `out` / `q`: written in place when given (weight sync: the
    PackedWeight's layout and QTensor buffers, so captured CUDA graphs stay valid)."""
    if fmt != "nvfp4":
        raise ValueError(f"quantize_relayout fuses nvfp4 only, not {fmt!r}; for mxfp4 use "
                         f"relayout(quantize(w, 'mxfp4', fast=True), out)")
    if w.dim() != 2 or w.shape[1] % 16:
        raise ValueError(f"quantize_relayout takes a 2-D weight with K a multiple of 16, got {tuple(w.shape)}")
    n, k = w.shape
    w = w.contiguous()
    out = HopperFP4.empty("nvfp4", n, k, w.device) if out is None else out
    if (out.fmt, out.n, out.k) != ("nvfp4", n, k) or out.values.dim() != 2:
        raise ValueError(f"quantize_relayout: nvfp4 {n}x{k} into a {out.fmt} {out.n}x{out.k} layout")
    if q is None:
        q = QTensor(torch.empty(n, k // 2, device=w.device, dtype=torch.uint8),
                    torch.empty(n, k // 16, device=w.device, dtype=torch.float8_e4m3fn),
                    torch.ones((), device=w.device, dtype=torch.float32), (n, k), w.dtype, "nvfp4")
    elif q.format != "nvfp4" or tuple(q.shape) != (n, k) or not (q.codes.is_contiguous() and q.scales.is_contiguous()):
        raise ValueError(f"quantize_relayout: q must be a contiguous nvfp4 {n}x{k} QTensor, got {q.format} "
                         f"{tuple(q.shape)}")
    np_, kp = out.padded
    amax = tensor_amax_bits(w) if n else torch.zeros(1, device=w.device, dtype=torch.int32)
    _quantize_relayout_kernel[(np_ // ROWS,)](
        w, q.codes, q.scales.view(torch.uint8), q.global_scale, amax, out.values, out.scales, out.row_factor,
        n, k, kp, out.values.stride(0), out.scales.stride(0), num_warps=4)
    return q, out


assert ROWS == 16 and COLS == 128
