"""Residual add + RMSNorm + the W4A4 per-token activation quantization in one launch (issue 16 item 3).

`add_rms_norm_quantize(x, residual, weight, eps, fmt)` returns what `rmsnorm.add_rms_norm` and then
`row_quantize.quantize_dequant_bf16(h, fmt)` return, bit for bit: (h, new_residual, xq, row_scale) with xq the bf16
code value x block scale of h quantized per token (`fmt` "nvfp4:row" or "mxfp4") and row_scale the nvfp4:row
float32 global scale per row (None for mxfp4). A decoder layer's norm feeds a W4A4 q/k/v or gate/up group; run
apart, the quantizer reads back the [rows, N] h the norm just wrote (a second launch and a second pass over the
activation); here it quantizes h from registers.

Same bits, by construction: the norm part is `_add_rms_norm_kernel`'s code on the same [BLOCK_M, BLOCK_N] tile
(`rmsnorm._tiles`, same warps), so the float32 sum of squares reduces in the same layout and order; the quantizer
reads the bf16-rounded h (as the separate quantizer loads it), viewed as `fp4_block_tiles`' [rows * blocks, G]
block tile (a reshape of the row tile: blocks are contiguous), and runs that file's `_block_stats`,
`_row_global_scales` (the separate kernel's nvfp4:row scale step) and `_dequant_blocks`: block and row amaxes are
maxima (exact in any order), the rest is element-wise, so the tile shape does not change a bit. NaN/Inf go through
the same ops (a NaN/Inf row normalises to NaN where the separate kernel's does, and a block holding one emits NaN).

`store_h=False` skips writing h (8 KB per 4096-wide bf16 row) where nothing reads it. Torch reference:
`add_rms_norm_quantize_reference` (the composition of the two kernels' references).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats import get_format
from trace_rl.kernels.fp4_block_tiles import (
    _block_stats,
    _dequant_blocks,
    _e4m3_blocks,
    _row_e4m3_top,
    _row_global_scales,
    _store_blocks,
)
from trace_rl.kernels.rmsnorm import _add_rms_norm_rows, _tiles, add_rms_norm_reference

W4A4_ROW_FORMATS = {"nvfp4:row": 16, "mxfp4": 32}   # per-token activation format -> elements per scale block


@triton.jit
def _add_rms_norm_quantize_kernel(x_ptr, r_ptr, w_ptr, h_ptr, r_out_ptr, q_ptr, gscale_ptr, n_rows, N, eps,
                                  stride_x, stride_r, stride_h, stride_ro, stride_q,
                                  HAS_RESIDUAL: tl.constexpr, STORE_H: tl.constexpr, MX: tl.constexpr,
                                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, E4M3: tl.constexpr = False):
    # -- `_add_rms_norm_kernel`'s tile (the same helper: the same float ops in the same layout) --
    rows, rows64, cols, mask, hb = _add_rms_norm_rows(x_ptr, r_ptr, w_ptr, r_out_ptr, n_rows, N, eps, stride_x,
                                                      stride_r, stride_ro, h_ptr.dtype.element_ty, HAS_RESIDUAL,
                                                      BLOCK_M, BLOCK_N)        # h as the norm stores it
    if STORE_H:
        tl.store(h_ptr + rows64 * stride_h + cols[None, :], hb, mask=mask)
    # -- `_quantize_dequant_rows_kernel` on the stored h: one scale block per tile row --
    G: tl.constexpr = 32 if MX else 16
    NB: tl.constexpr = BLOCK_N // G
    hq = tl.reshape(hb.to(tl.float32), [BLOCK_M * NB, G])        # padding columns / rows are 0: amax unchanged
    block_amax, bad, amax = _block_stats(hq, BLOCK_M, NB)
    row0 = tl.program_id(0) * BLOCK_M
    if E4M3:    # mxfp4 for the FP8 operand cache: E4M3 bytes and the row scale (fp4_block_tiles._e4m3_blocks)
        top = _row_e4m3_top(amax, row0, n_rows, gscale_ptr, BLOCK_M, NB)
        _store_blocks(q_ptr, _e4m3_blocks(hq, block_amax, bad, top), row0, n_rows, 0, N, stride_q, BLOCK_M, NB, G)
    else:
        gs, fast_div = _row_global_scales(amax, row0, n_rows, gscale_ptr, MX, BLOCK_M, NB)
        _store_blocks(q_ptr, _dequant_blocks(hq, block_amax, bad, gs, fast_div, MX), row0, n_rows, 0, N, stride_q,
                      BLOCK_M, NB, G)


def fuses(n: int, fmt_name: str) -> bool:
    """Whether rows of n features in `fmt_name` (per token) fit the kernel: whole blocks, one tile (<= 16384)."""
    block = W4A4_ROW_FORMATS.get(get_format(fmt_name).name)
    return block is not None and n % block == 0 and 0 < n <= 16384


def _check(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, fmt_name: str) -> str:
    name = get_format(fmt_name).name
    if name not in W4A4_ROW_FORMATS:
        raise ValueError(f"add_rms_norm_quantize: W4A4 activations are quantized per token to "
                         f"{' or '.join(W4A4_ROW_FORMATS)}, not {fmt_name!r} (pass per_token(act_fmt))")
    n = x.shape[-1]
    if weight.shape != (n,):
        raise ValueError(f"add_rms_norm_quantize: weight {tuple(weight.shape)} does not match rows of {n}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(f"add_rms_norm_quantize: residual {tuple(residual.shape)} {residual.dtype} must match x "
                         f"{tuple(x.shape)} {x.dtype}")
    if n % W4A4_ROW_FORMATS[name]:
        raise ValueError(f"add_rms_norm_quantize: rows of {n} are not whole {name} blocks of "
                         f"{W4A4_ROW_FORMATS[name]}")
    if n > 16384:
        raise ValueError(f"add_rms_norm_quantize: rows of {n} elements exceed the one-tile kernel (16384); run "
                         f"add_rms_norm then quantize_dequant_bf16")
    return name


def add_rms_norm_quantize(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                          fmt_name: str, store_h: bool = True, num_warps: int | None = None, e4m3: bool = False):
    """(h or None, new_residual, xq [rows, N] bf16, row_scale [rows] float32 or None): `add_rms_norm(x, residual,
    weight, eps)` then `quantize_dequant_bf16(h.reshape(-1, N), fmt_name)` in one launch, the same bits.
    `residual=None`: plain RMSNorm (new_residual is x). `store_h=False`: h is not written (returned as None).
    `num_warps` (benchmarks only): None is the norm kernel's count, the only one that keeps its bits (another count
    reduces the sum of squares in another order; benchmarks/norm_quant.py times 8 warps to see what it would buy).
    `e4m3` (mxfp4): xq as float8_e4m3fn and row_scale the float32 row scale, as `quantize_dequant_e4m3` emits them
    for the FP8 operand cache (operand_cache_fp8.py)."""
    name = _check(x, residual, weight, fmt_name)
    if e4m3 and name != "mxfp4":
        raise ValueError(f"add_rms_norm_quantize(e4m3=True): E4M3 rows are mxfp4's (the FP8 operand cache), not {name}")
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    dev = x.device
    h = torch.empty(x2.shape, device=dev, dtype=x.dtype) if store_h else None
    xq = torch.empty(rows, n, device=dev, dtype=torch.float8_e4m3fn if e4m3 else torch.bfloat16)
    row_scale = torch.empty(rows, device=dev, dtype=torch.float32) if name == "nvfp4:row" or e4m3 else None
    if residual is None:
        r2, r_out = x2, x2
    else:
        r2 = residual.reshape(-1, n)
        r2 = r2 if r2.stride(-1) == 1 else r2.contiguous()
        r_out = torch.empty_like(x2)
    if rows:
        block_m, block_n, warps = _tiles(rows, n)       # the norm kernel's tile: its reduction order
        warps = warps if num_warps is None else num_warps
        h_arg = h if h is not None else x2              # only its dtype is read when store_h is False
        _add_rms_norm_quantize_kernel[(triton.cdiv(rows, block_m),)](
            x2, r2, weight, h_arg, r_out, xq.view(torch.uint8) if e4m3 else xq,
            row_scale if row_scale is not None else xq, rows, n, eps,
            x2.stride(0), r2.stride(0), h_arg.stride(0), r_out.stride(0), xq.stride(0),
            HAS_RESIDUAL=residual is not None, STORE_H=store_h, MX=name == "mxfp4", BLOCK_M=block_m,
            BLOCK_N=block_n, E4M3=bool(e4m3), num_warps=warps)
    h_out = None if h is None else h.view(x.shape)
    return h_out, (x if residual is None else r_out.view(x.shape)), xq, row_scale


def quantize_dequant_reference(h2: torch.Tensor, fmt_name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """What `quantize_dequant_bf16(h2, fmt)` emits, from the format's reference QTensor: bf16 code value x block
    step (NaN for a block holding NaN/Inf), and the nvfp4:row global scale per row (None for mxfp4)."""
    from trace_rl.formats import unpack_nibbles
    from trace_rl.formats.e2m1 import e2m1_decode
    from trace_rl.formats.mxfp4 import e8m0_to_float

    name = get_format(fmt_name).name
    q = get_format(name).quantize(h2)
    block = W4A4_ROW_FORMATS[name]
    values = e2m1_decode(unpack_nibbles(q.codes)).reshape(h2.shape[0], -1, block)
    step = e8m0_to_float(q.scales) if name == "mxfp4" else q.scales.float()
    out = (values * step.unsqueeze(-1)).reshape(h2.shape).to(torch.bfloat16)
    return out, None if q.global_scale is None else q.global_scale.reshape(-1).float()


def add_rms_norm_quantize_reference(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor,
                                    eps: float, fmt_name: str):
    """The torch spec: `add_rms_norm_reference` then `quantize_dequant_reference` of its h (as rows)."""
    _check(x, residual, weight, fmt_name)
    h, r = add_rms_norm_reference(x, residual, weight, eps)
    xq, row_scale = quantize_dequant_reference(h.reshape(-1, x.shape[-1]), fmt_name)
    return h, r, xq, row_scale


def sass_gate_cases():
    """The sm_90 compile gate (sass_gate.py): the launch at Qwen3-8B's hidden size (one 4096-wide bf16 row a
    program, 4 warps: 32 elements per thread), residual in, h not written (the decoder's call), both formats.
    Loop-free: the whole kernel counts (up to the last EXIT). Budgets ~10% over Triton 3.6's count (CPU compile,
    2026-12-02): nvfp4:row 2013 SASS / 32 elements = 62.9 per element, mxfp4 1094 / 32 = 34.2 (Triton 3.9: 67.1,
    35.3)."""
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(x_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16", h_ptr="*bf16", r_out_ptr="*bf16", q_ptr="*bf16",
               gscale_ptr="*fp32", n_rows="i32", N="i32", eps="fp32", stride_x="i32", stride_r="i32", stride_h="i32",
               stride_ro="i32", stride_q="i32")
    divisible = ("x_ptr", "r_ptr", "w_ptr", "h_ptr", "r_out_ptr", "q_ptr", "gscale_ptr", "N", "stride_x", "stride_r",
                 "stride_h", "stride_ro", "stride_q")
    block_m, block_n, warps = _tiles(4096, 4096)
    return [GateCase(f"add_rms_norm_quantize {name} 4096", _add_rms_norm_quantize_kernel, sig,
                     dict(HAS_RESIDUAL=True, STORE_H=False, MX=mx, BLOCK_M=block_m, BLOCK_N=block_n), warps, 1,
                     block_m * block_n / (32 * warps), budget, divisible=divisible, register_a=False, forbid=(),
                     whole_kernel=True)
            for name, mx, budget in (("nvfp4:row", False, 69.0), ("mxfp4", True, 38.0))]
