"""Weight quantization with the Hopper re-layout fused into its store (the weight sync's path once a layer's layout
exists, `FP4Backend.quantize_into`: `quantize_relayout(w, fmt, out=layout, q=qtensor)`, nvfp4 and mxfp4): one pass
over the weight writes the QTensor's codes and scales and the Hopper layout's words (hopper_fp4.py), instead of
`relayout(quantize(w, fmt, fast=True), out=layout)`, which reads the codes and scales back. Same bits as that
pair, and so as the default path (tests/kernels/test_quantize_relayout.py).

A program owns a 16-row x 256-column tile (two layout blocks; the grid covers rows and K, so an 8B k_proj,
1024 x 4096, is 1024 programs: the first version walked K in one program per 16 rows, 64 programs for it, and
was latency-bound: 27 ms for the 8B sync against 26.5 for quantize + separate re-layout). Tile row m of a
program is (layout row 0..15, 128-column chunk, i = 32-column window 0..3); the thread holding it loads the
window's four 8-column quarters (r, c) = column 16 r + 8 c as four separate [M, 8] tensors: all four get the
same register layout (one thread per tile row, 8 contiguous elements: 16-byte loads), so a layout word, which
takes element 2t + e of each quarter (t = 0..3, e = 0..1; hopper_fp4.py's slots A..D = (r, c)), is built in
the thread's registers without a shared-memory round trip or shuffle. Blocks: nvfp4 (16) = quarters (r, 0)
and (r, 1) joined, mxfp4 (32) = all four; the block amax is a reduction inside the thread.

The layout's nvfp4 scale-sign / zero-scale folds (`fp4_relayout._nv_encode`'s flip and zero) are no-ops on
the quantizer's own output (its scales are never negative, and a zero-scale block's codes are +-0 already),
so they are not computed. mxfp4's layout scales need the row's largest block exponent: the K-split programs
cannot know it, so a second, small launch (`fp4_relayout._mx_layout_scales_kernel`) derives the layout scales
and row factor from the QTensor's scales (1/16 of the code bytes). The bit placement (`fp4_relayout._words`)
and the mxfp4 scales are the re-layout kernel's own.

sm_90 SASS per element (Triton 3.6, compile-only, whole kernel; row_quantize_gate.py holds the gate cases):
nvfp4 33.7 on the fast-division path (50.8 counting the div_rn fallback too; the first version's K loop: 66.2,
both), mxfp4 22.3 (+ the scales launch); what separate kernels took: quantize 52.5 / 24.9 + re-layout 22.1 /
15.75. Estimated issue time for the 8B weights (6.95 G elements, 132 SMs x 4 x 32 lanes x 1.98 GHz, at full
issue): nvfp4 ~7 ms + the amax read (~3.3 ms), mxfp4 ~4.6 ms against its ~5 ms of memory traffic.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats import QTensor
from trace_rl.kernels.fp4_relayout import (
    NV_FACTOR_SCALE,
    _mx_layout_scales_kernel,
    _nv_encode,
    _store_words,
    _words,
)
from trace_rl.kernels.fp_bits import fast_div_ok
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4, block_size
from trace_rl.kernels.weight_quantize import fp4_block_codes, nvfp4_tensor_scale, weight_amax_bits

KC = 2          # 128-column chunks per program (M = 64 KC tile rows, one per thread of 2 KC warps)


@triton.jit
def _quarter(x_ptr, row_off, col, ok):
    """Columns col .. col + 8 of each tile row (row_off = row * K) as float32 [M, 8] (0 where not ok)."""
    return tl.load(x_ptr + row_off[:, None] + col[:, None] + tl.arange(0, 8)[None, :],
                   mask=ok[:, None], other=0.0).to(tl.float32)


@triton.jit
def _bytes(codes):
    """[M, 8] codes (0..15) of a quarter, element 2t + e -> int32 [M, 4] (t): the QTensor's byte of each column
    pair, code e = 0 in the low nibble. The fields are disjoint, so + is |: one LEA per pair."""
    a, b = tl.split(tl.reshape(codes, [codes.shape[0], 4, 2]))
    return a + (b << 4)


@triton.jit
def _word(byt):
    """[M, 4] bytes -> int32 [M]: byte t in bits 8t..8t+7 (8 codes of the QTensor, little-endian)."""
    a, b = tl.split(tl.reshape(byt, [byt.shape[0], 2, 2]))
    q = a + (b << 8)
    a, b = tl.split(q)
    return a + (b << 16)


@triton.jit
def _quantize_relayout_kernel(x_ptr, codes_ptr, scales_ptr, gscale_ptr, amax_ptr, values_ptr, out_scales_ptr,
                              rf_ptr, N, K, KP, stride_v, stride_os, MX: tl.constexpr, KC: tl.constexpr,
                              FAST_ONLY: tl.constexpr = False):
    """Rows pid0 * 16 .. + 16, columns pid1 * 128 KC .. + 128 KC (tile row m: row m // 4KC, chunk m // 4 % KC,
    window i = m % 4). codes_ptr: the QTensor's codes as int32 (8 codes each). nvfp4: the tensor amax as
    float32 bits in amax_ptr; program (0, 0) stores the global scale, programs (., 0) the row factors.
    FAST_ONLY: compile-only analysis (the SASS of the fast-division path alone)."""
    M: tl.constexpr = 64 * KC
    pid0 = tl.program_id(0)
    pid1 = tl.program_id(1)
    m = tl.arange(0, M)
    row16 = m // (4 * KC)
    row = (pid0 * 16 + row16).to(tl.int64)
    chunk = pid1 * KC + (m // 4) % KC
    i = m % 4
    col = chunk * 128 + 32 * i                              # the window's first column
    rok = row < N
    ok0 = rok & (col < K)                                   # K % G == 0: a block is all in or all out
    ok1 = rok & (col + 16 < K)
    xr = row * K
    x00 = _quarter(x_ptr, xr, col, ok0)
    x01 = _quarter(x_ptr, xr, col + 8, ok0)
    x10 = _quarter(x_ptr, xr, col + 16, ok1)
    x11 = _quarter(x_ptr, xr, col + 24, ok1)
    if MX:
        xb = tl.reshape(tl.join(tl.join(x00, x01), tl.join(x10, x11)), [M, 32])     # [m, k, c, r]
        codes, sc = fp4_block_codes(xb, 1.0, False, True)
        cr0, cr1 = tl.split(tl.reshape(codes, [M, 8, 2, 2]))
        c00, c01 = tl.split(cr0)
        c10, c11 = tl.split(cr1)
        tl.store(scales_ptr + row * (K // 32) + col // 32, sc.to(tl.uint8), mask=ok0)
    else:
        t_amax, g = nvfp4_tensor_scale(amax_ptr)
        if (pid0 == 0) & (pid1 == 0):
            tl.store(gscale_ptr, g)
        fast_div = fast_div_ok(t_amax)
        if FAST_ONLY:
            fast_div = True
        codes0, sc0 = fp4_block_codes(tl.reshape(tl.join(x00, x01), [M, 16]), g, fast_div, False)
        codes1, sc1 = fp4_block_codes(tl.reshape(tl.join(x10, x11), [M, 16]), g, fast_div, False)
        c00, c01 = tl.split(tl.reshape(codes0, [M, 8, 2]))
        c10, c11 = tl.split(tl.reshape(codes1, [M, 8, 2]))
        sp = scales_ptr + row * (K // 16) + col // 16
        tl.store(sp, sc0.to(tl.uint8), mask=ok0)
        tl.store(sp + 1, sc1.to(tl.uint8), mask=ok1)
        # layout scales: padding blocks were loaded as zeros, so their scale code is 0 -> byte 0
        in_kp = chunk * 128 < KP
        op = out_scales_ptr + row * stride_os + col // 16
        b0, _, _ = _nv_encode(sc0)
        b1, _, _ = _nv_encode(sc1)
        tl.store(op, b0.to(tl.uint8), mask=in_kp)
        tl.store(op + 1, b1.to(tl.uint8), mask=in_kp)
        if pid1 == 0:
            rows = pid0 * 16 + tl.arange(0, 16)
            tl.store(rf_ptr + rows, tl.where(rows < N, g * NV_FACTOR_SCALE, 1.0))
    b00, b01, b10, b11 = _bytes(c00), _bytes(c01), _bytes(c10), _bytes(c11)
    cp = codes_ptr + row * (K // 8) + col // 8
    tl.store(cp, _word(b00), mask=ok0)
    tl.store(cp + 1, _word(b01), mask=ok0)
    tl.store(cp + 2, _word(b10), mask=ok1)
    tl.store(cp + 3, _word(b11), mask=ok1)
    _store_words(values_ptr, _words(b00, b01, b10, b11), pid0.to(tl.int64) * stride_v, chunk, row16, i, KP)


def _empty_q(fmt: str, n: int, k: int, w: torch.Tensor) -> QTensor:
    G = block_size(fmt)
    scales = torch.empty(n, k // G, device=w.device, dtype=torch.uint8)
    return QTensor(torch.empty(n, k // 2, device=w.device, dtype=torch.uint8),
                   scales.view(torch.float8_e4m3fn) if fmt == "nvfp4" else scales,
                   torch.ones((), device=w.device, dtype=torch.float32) if fmt == "nvfp4" else None,
                   (n, k), w.dtype, fmt)


def quantize_relayout(w: torch.Tensor, fmt: str, out: HopperFP4 | None = None, q: QTensor | None = None,
                      amax_bits: torch.Tensor | None = None) -> tuple[QTensor, HopperFP4]:
    """(`quantize(w, fmt)`, its Hopper layout) for fmt "nvfp4" or "mxfp4", w [N, K], in one pass over w: the
    same bits as `relayout(quantize(w, fmt), out)`. `out` / `q`: written in place when given (weight sync: the
    PackedWeight's layout and QTensor buffers, so captured CUDA graphs stay valid). Launches: nvfp4 the tensor
    amax and the fused kernel; mxfp4 the fused kernel and the layout scales. `amax_bits` (nvfp4): w's tensor amax
    already computed (int32 [1], `weight_quantize.weights_amax_bits` of many weights in one launch)."""
    if fmt not in ("nvfp4", "mxfp4"):
        raise ValueError(f"quantize_relayout takes nvfp4 or mxfp4, not {fmt!r}")
    G = block_size(fmt)
    if w.dim() != 2 or w.shape[1] % G:
        raise ValueError(f"quantize_relayout takes a 2-D weight with K a multiple of {G}, got {tuple(w.shape)}")
    n, k = w.shape
    w = w.contiguous()
    out = HopperFP4.empty(fmt, n, k, w.device) if out is None else out
    if (out.fmt, out.n, out.k) != (fmt, n, k) or out.values.dim() != 2:
        raise ValueError(f"quantize_relayout: {fmt} {n}x{k} into a {out.fmt} {out.n}x{out.k} layout")
    if q is None:
        q = _empty_q(fmt, n, k, w)
    elif q.format != fmt or tuple(q.shape) != (n, k) or not (q.codes.is_contiguous() and q.scales.is_contiguous()):
        raise ValueError(f"quantize_relayout: q must be a contiguous {fmt} {n}x{k} QTensor, got {q.format} "
                         f"{tuple(q.shape)}")
    np_, kp = out.padded
    if not (n and k):
        return q, out
    mx = fmt == "mxfp4"
    scales = q.scales.view(torch.uint8)
    if mx:
        amax = gscale = out.row_factor          # unused
    else:
        amax = weight_amax_bits(w) if amax_bits is None else amax_bits
        gscale = q.global_scale
    _quantize_relayout_kernel[(np_ // ROWS, triton.cdiv(kp, COLS * KC))](
        w, q.codes.view(torch.int32), scales, gscale, amax, out.values, out.scales, out.row_factor, n, k, kp,
        out.values.stride(0), out.scales.stride(0), MX=mx, KC=KC, num_warps=2 * KC)
    if mx:
        _mx_layout_scales_kernel[(np_ // ROWS, 1)](scales, out.scales, out.row_factor, n, k // G, kp // G, k // G,
                                                   out.scales.stride(0), 0, 0, 0, num_warps=4)
    return q, out


assert ROWS == 16 and COLS == 128
