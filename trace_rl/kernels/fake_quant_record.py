"""The rollout's side of TRACE guidance: quantize rows and write their record (block scales, nvfp4's row
global scale, one mantissa bit per element) into a packed per-token byte buffer, in one kernel.

`record_rows(x, fmt, buf, dest, heads, offsets)`: x [tokens * heads, K] (a Linear input, or K/V rows of
one token's heads), `buf` uint8 [slots, bytes_per_token]; row i's record goes to token row `dest[i // heads]`
of `buf`, head `i % heads`, at the site's byte offsets (scales, global, bits; 4-aligned). The destination
index is read on the device, so a captured CUDA graph records each step into the slots and positions its
static buffers name, with no Python in the loop.

Bit-exact with `correction.guided.record_guidance` (scales, global scale; mantissa bits of every block
whose elements are finite: a NaN/Inf block gets the NaN scale, its bits are unspecified as its codes are).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.kernels.fake_quant import FMT_MXFP4, FMT_NVFP4_ROW, _e2m1_nearest, tiles
from trace_rl.kernels.fp_bits import e4m3_round, e8m0_inverse, e8m0_scale_code


@triton.jit
def _record_kernel(
    x_ptr, dest_ptr, sc_ptr, gs_ptr, bits_ptr,
    n_rows, K, stride_x, heads, tok_bytes, scale_off, global_off, bits_off,
    FMT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr,
):
    """sc_ptr / gs_ptr / bits_ptr: the same byte buffer as uint8 / float32 / int16 (G = 16) or int32 (G = 32),
    so that a block's G bits are one store."""
    NB: tl.constexpr = BLOCK_K // G
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    cols = tl.arange(0, BLOCK_K)
    mask = row_mask[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    blocks = tl.reshape(x, [BLOCK_M, NB, G])
    xa = tl.abs(blocks)
    finite = xa < float("inf")
    block_amax = tl.max(tl.where(finite, xa, 0.0), axis=2)
    bad = tl.max(tl.where(finite, 0, 1), axis=2) > 0
    if FMT == 2:      # MXFP4: E8M0 exponent from the amax's exponent bits
        scale_code = e8m0_scale_code(block_amax)
        a = xa * e8m0_inverse(scale_code)[:, :, None]
        scale_code = tl.where(bad, 255, scale_code)
    else:             # NVFP4 per row: global = row amax / 2688, E4M3 block scales
        amax = tl.max(block_amax, axis=1)
        gscale = tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)
        scale_code, scale_val = e4m3_round(tl.minimum(tl.math.div_rn(tl.math.div_rn(block_amax, 6.0),
                                                                     gscale[:, None]), 448.0))
        scale_code = tl.where(bad, 0x7F, scale_code)
        step = scale_val * gscale[:, None]
        a = tl.math.div_rn(xa, tl.where(step == 0, float("inf"), step)[:, :, None])
    mag = _e2m1_nearest(a)
    # mantissa bit = parity of the E2M1 index: 0 .5 1 1.5 2 3 4 6 -> 0 1 0 1 0 1 0 1
    p = tl.where(mag < 2.0, mag * 2.0, tl.where(mag == 6.0, 1.0, mag))
    bit = (p + 8388608.0).to(tl.int32, bitcast=True) & 1
    word = tl.sum(bit << tl.arange(0, G)[None, None, :], axis=2)           # [M, NB]: G bits per block

    token = tl.load(dest_ptr + rows // heads, mask=row_mask, other=0)
    base = token.to(tl.int64) * tok_bytes                                   # byte offset of the token's row
    head = (rows % heads).to(tl.int64)
    bcols = tl.arange(0, NB)
    bmask = row_mask[:, None] & (bcols < K // G)[None, :]
    tl.store(sc_ptr + (base + scale_off + head * (K // G))[:, None] + bcols[None, :], scale_code.to(tl.uint8),
             mask=bmask)
    if G == 16:
        tl.store(bits_ptr + ((base + bits_off + head * (K // 8)) // 2)[:, None] + bcols[None, :],
                 word.to(tl.int16), mask=bmask)
    else:
        tl.store(bits_ptr + ((base + bits_off + head * (K // 8)) // 4)[:, None] + bcols[None, :], word, mask=bmask)
    if FMT == 1:
        tl.store(gs_ptr + (base + global_off) // 4 + head, gscale, mask=row_mask)


def record_rows(x: torch.Tensor, fmt: str, buf: torch.Tensor, dest: torch.Tensor, heads: int,
                scale_off: int, global_off: int | None, bits_off: int) -> None:
    """Write the guidance record of x [..., K] (rows = tokens x heads) into `buf` (uint8 [N, bytes], bytes a
    multiple of 4) at token rows `dest` (int64 [tokens]) and the given byte offsets (multiples of 4)."""
    fmt_id = {"nvfp4:row": FMT_NVFP4_ROW, "mxfp4": FMT_MXFP4}.get(fmt)
    if fmt_id is None:
        raise ValueError(f"guidance records are for nvfp4:row or mxfp4 activations, not {fmt!r}")
    K = x.shape[-1]
    G = 16 if fmt_id == FMT_NVFP4_ROW else 32
    if K % G or buf.dtype != torch.uint8 or buf.shape[-1] % 4 or buf.stride(-1) != 1:
        raise ValueError(f"record_rows: K={K} must be a multiple of {G}; buf must be uint8 rows of a multiple "
                         f"of 4 bytes (got {buf.dtype}, {tuple(buf.shape)})")
    if any(o is not None and o % 4 for o in (scale_off, global_off, bits_off)):
        raise ValueError("record_rows: byte offsets must be multiples of 4")
    x2 = x.reshape(-1, K)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    n_rows = x2.shape[0]
    if n_rows == 0:
        return
    if n_rows != dest.numel() * heads:
        raise ValueError(f"record_rows: {n_rows} rows for {dest.numel()} tokens x {heads} heads")
    block_m, block_k, warps = tiles(n_rows, K)
    flat = buf.view(-1)
    _record_kernel[(triton.cdiv(n_rows, block_m),)](
        x2, dest, flat, flat.view(torch.float32), flat.view(torch.int16 if G == 16 else torch.int32),
        n_rows, K, x2.stride(0), heads, buf.stride(0), scale_off, global_off or 0, bits_off,
        FMT=fmt_id, BLOCK_M=block_m, BLOCK_K=block_k, G=G, num_warps=warps)
