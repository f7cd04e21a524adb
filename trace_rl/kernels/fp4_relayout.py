"""Triton kernel deriving the Hopper FP4 layout (hopper_fp4.py) from a reference QTensor on the GPU, in place:
one launch per weight, graph-capturable (weight sync re-derives into the same tensors). Bit-exact with the
torch reference `hopper_fp4.to_hopper` (tests/kernels/test_hopper_fp4.py).

A program owns 16 rows: for mxfp4 it first takes the rows' largest non-NaN scale exponent, then walks K in
128-column blocks: nibbles -> codes, nvfp4 scale signs / zero scales folded into the codes, the scales
re-encoded, and the 8 codes of each word placed at their bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.kernels.hopper_fp4 import COLS, MX_TOP, NV_EXP_OFFSET, NV_FACTOR_EXP, ROWS, HopperFP4, block_size


@triton.jit
def _bit_positions():
    """[8 slots (r, c, e), 4 bits (s, e1, e0, m)] word bit of each code bit (hopper_fp4.SLOT_ROTATIONS)."""
    j = tl.arange(0, 8)[:, None]
    b = tl.arange(0, 4)[None, :]
    slot = j // 2
    e = j % 2
    out = tl.where(b == 0, 15, tl.where(b == 1, 8, tl.where(b == 2, 7, 6)))
    rot = tl.where(slot == 0, 0, tl.where(slot == 1, 4, tl.where(slot == 2, 10, tl.where(b == 3, 14, 6))))
    return (out + 16 * e + rot) % 32


@triton.jit
def _nv_encode(sb):
    """E4M3 scale bytes (int32) -> (pre-biased byte, code sign flip 0/8, zero scale)."""
    mag = sb & 0x7F
    nan = mag == 0x7F
    exp_field = mag >> 3
    mant = mag & 7
    # subnormal m x 2**-9: normalise (m = 1: 2**-9; 2, 3: 1.x x 2**-8; 4..7: 1.xx x 2**-7)
    sub_e = tl.where(mant >= 4, -7, tl.where(mant >= 2, -8, -9))
    sub_m = tl.where(mant >= 4, (mant - 4) << 1, tl.where(mant >= 2, (mant - 2) << 2, 0))
    e = tl.where(exp_field == 0, sub_e, exp_field - 7)
    m = tl.where(exp_field == 0, sub_m, mant)
    byte = ((e + NV_EXP_OFFSET) << 3) | m
    zero = mag == 0
    byte = tl.where(zero, 0, tl.where(nan, 0xFF, byte))
    flip = tl.where((sb >= 0x80) & (~nan), 8, 0)
    return byte, flip, zero


@triton.jit
def _relayout_kernel(codes_ptr, scales_ptr, glob_ptr, values_ptr, out_scales_ptr, rf_ptr,
                     N, K, stride_c, stride_s, stride_v, stride_os, KP,
                     stride_ce, stride_se, stride_ge, stride_ve, stride_ose, stride_rfe,
                     MX: tl.constexpr, G: tl.constexpr, GLOBAL_PER_ROW: tl.constexpr):
    pid = tl.program_id(0)
    ex = tl.program_id(1).to(tl.int64)          # expert (stacked layouts); 0 for a plain weight
    codes_ptr += ex * stride_ce
    scales_ptr += ex * stride_se
    glob_ptr += ex * stride_ge
    values_ptr += ex * stride_ve
    out_scales_ptr += ex * stride_ose
    rf_ptr += ex * stride_rfe
    rows = pid * 16 + tl.arange(0, 16)
    row_ok = rows < N
    NB: tl.constexpr = 128 // G
    if MX:   # the rows' largest non-NaN exponent
        top = tl.full([16], -1, tl.int32)
        for k0 in range(0, K, 128):
            sc = k0 // G + tl.arange(0, NB)
            e = tl.load(scales_ptr + rows[:, None].to(tl.int64) * stride_s + sc[None, :],
                        mask=row_ok[:, None] & (sc < K // G)[None, :], other=0).to(tl.int32)
            top = tl.maximum(top, tl.max(tl.where(e == 255, -1, e), axis=1))
        has_nan = tl.zeros([16], dtype=tl.int32)
        top = tl.where(top < 0, MX_TOP, top)
    pos = _bit_positions()
    for k0 in range(0, KP, 128):
        bcol = k0 // 2 + tl.arange(0, 64)
        byte = tl.load(codes_ptr + rows[:, None].to(tl.int64) * stride_c + bcol[None, :],
                       mask=row_ok[:, None] & (bcol < K // 2)[None, :], other=0).to(tl.int32)
        codes = tl.reshape(tl.join(byte & 15, byte >> 4), [16, 128])          # column k = 2j + (high nibble)
        sc = k0 // G + tl.arange(0, NB)
        s_ok = row_ok[:, None] & (sc < K // G)[None, :]
        sb = tl.load(scales_ptr + rows[:, None].to(tl.int64) * stride_s + sc[None, :], mask=s_ok, other=0)
        sb = sb.to(tl.int32) & 0xFF
        blocks = tl.reshape(codes, [16, NB, G])
        if MX:
            nan = sb == 255
            has_nan = tl.maximum(has_nan, tl.max(nan.to(tl.int32), axis=1))
            out_b = tl.where(nan, 255, sb + (254 - top[:, None]))
            out_b = tl.where(s_ok, out_b, 0)
        else:
            out_b, flip, zero = _nv_encode(sb)
            blocks = tl.where(zero[:, :, None], blocks & 8, blocks) ^ flip[:, :, None]
        tl.store(out_scales_ptr + rows[:, None].to(tl.int64) * stride_os + sc[None, :], out_b.to(tl.uint8))
        c = tl.reshape(blocks, [2, 8, 4, 2, 2, 4, 2])                           # h g i r c t e
        c = tl.permute(c, (0, 1, 5, 2, 3, 4, 6))                                # h g t i r c e
        c = tl.reshape(c, [2, 8, 4, 4, 8, 1])
        bits = ((c >> (3 - tl.arange(0, 4)[None, None, None, None, None, :])) & 1) << pos[None, None, None, None]
        word = tl.sum(tl.sum(bits, axis=5), axis=4)                             # [2, 8, 4, 4] (disjoint bits)
        word = tl.reshape(word, [256])
        tl.store(values_ptr + pid.to(tl.int64) * stride_v + (k0 // 128) * 256 + tl.arange(0, 256), word)
    if MX:
        c_row = top - MX_TOP
        factor = tl.where(c_row >= -126, (c_row + 127) << 23, 1 << tl.maximum(149 + c_row, 0))   # 2**c
        factor = tl.where(has_nan > 0, 0x7FC00000 | (c_row + 256), factor)
        factor = tl.where(row_ok, factor, 0x3F800000)                       # padding rows: 1.0
        tl.store(rf_ptr + rows, factor.to(tl.float32, bitcast=True))
    else:
        if GLOBAL_PER_ROW:
            g = tl.load(glob_ptr + rows, mask=row_ok, other=1.0)
        else:
            g = tl.load(glob_ptr) + tl.zeros([16], dtype=tl.float32)
        tl.store(rf_ptr + rows, tl.where(row_ok, g * (2.0 ** NV_FACTOR_EXP), 1.0))


def relayout(q, out: HopperFP4 | None = None) -> HopperFP4:
    """The Hopper layout of QTensor `q` ([N, K], or experts [E, N, K] stacked), nvfp4 or mxfp4, written into
    `out` when given. One launch."""
    G = block_size(q.format)
    experts = q.shape[0] if len(q.shape) == 3 else None
    n, k = q.shape[-2:]
    out = HopperFP4.empty(q.format, n, k, q.codes.device, experts) if out is None else out
    if (out.fmt, out.n, out.k) != (q.format, n, k) or (out.values.dim() == 3) != (experts is not None):
        raise ValueError(f"relayout: {q.format} {tuple(q.shape)} into a {out.fmt} {out.n}x{out.k} layout")
    e = experts or 1
    np_, kp = out.padded
    codes = q.codes.reshape(e, n, k // 2)
    scales = q.scales.reshape(e, n, k // G).view(torch.uint8)
    if q.global_scale is not None:
        glob = q.global_scale.reshape(-1).float()
        per_expert = glob.numel() == e and e > 1
        per_row = glob.numel() == e * n and n > 1
        glob = glob.contiguous()
    else:
        glob, per_expert, per_row = out.row_factor, False, False
    values = out.values.reshape(e, *out.values.shape[-2:])
    oscales = out.scales.reshape(e, *out.scales.shape[-2:])
    rf = out.row_factor.reshape(e, np_)
    _relayout_kernel[(np_ // ROWS, e)](
        codes, scales, glob, values, oscales, rf, n, k, codes.stride(1), scales.stride(1), values.stride(1),
        oscales.stride(1), kp, codes.stride(0), scales.stride(0), n if per_row else (1 if per_expert else 0),
        values.stride(0), oscales.stride(0), rf.stride(0), MX=q.format == "mxfp4", G=G, GLOBAL_PER_ROW=per_row,
        num_warps=4)
    return out


assert COLS == 128
