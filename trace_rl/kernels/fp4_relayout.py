"""Triton kernel deriving the Hopper FP4 layout (hopper_fp4.py) from a reference QTensor on the GPU, in place:
one launch per weight, graph-capturable (weight sync re-derives into the same tensors). Bit-exact with the
torch reference `hopper_fp4.to_hopper` (tests/kernels/test_hopper_fp4.py).

A program owns 16 rows x 128 KCH columns (the grid splits K too): for mxfp4 it first takes the rows' largest
non-NaN scale exponent (over the whole row), then walks its columns in 128-column blocks: nibbles -> codes,
nvfp4 scale signs / zero scales folded into the codes, the scales re-encoded, and the 8 codes of each word
placed at their bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.kernels import hopper_fp4
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4, block_size

MX_TOP = tl.constexpr(hopper_fp4.MX_TOP)
NV_EXP_OFFSET = tl.constexpr(hopper_fp4.NV_EXP_OFFSET)
NV_FACTOR_SCALE = tl.constexpr(float(2 ** hopper_fp4.NV_FACTOR_EXP))


@triton.jit
def _rotl(v, r: tl.constexpr):
    if r == 0:
        out = v
    else:
        u = v.to(tl.uint32, bitcast=True)
        out = ((u << r) | (u >> (32 - r))).to(tl.int32, bitcast=True)
    return out


@triton.jit
def _place(code, ROT: tl.constexpr, E: tl.constexpr):
    """Code (int32 0..15) of slot A, B or C in half E: sign -> bit 15, index -> bits 8..6, rotated into place."""
    return _rotl(((code & 8) << 12) | ((code & 7) << 6), ROT + 16 * E)


@triton.jit
def _place_d(code, E: tl.constexpr):
    """Slot D: sign, e1, e0 rotated by 6, the mantissa bit by 14 (hopper_fp4.SLOT_ROTATIONS)."""
    return _rotl(((code & 8) << 12) | ((code & 6) << 6), 6 + 16 * E) | _rotl((code & 1) << 6, 14 + 16 * E)


@triton.jit
def _pack_word(c):
    """[..., 8] codes in slot order (r, c, e) -> int32 words (hopper_fp4._place_bits)."""
    lo, hi = tl.split(tl.reshape(c, [c.shape[0], c.shape[1], c.shape[2], c.shape[3], 4, 2]))   # e
    a0, b0 = tl.split(tl.reshape(lo, [lo.shape[0], lo.shape[1], lo.shape[2], lo.shape[3], 2, 2]))   # c
    a1, b1 = tl.split(tl.reshape(hi, [hi.shape[0], hi.shape[1], hi.shape[2], hi.shape[3], 2, 2]))
    A0, C0 = tl.split(a0)    # r: slots A (r=0, c=0) and C (r=1, c=0), half 0
    B0, D0 = tl.split(b0)
    A1, C1 = tl.split(a1)
    B1, D1 = tl.split(b1)
    w = _place(A0, 0, 0) | _place(A1, 0, 1) | _place(B0, 4, 0) | _place(B1, 4, 1)
    w = w | _place(C0, 10, 0) | _place(C1, 10, 1) | _place_d(D0, 0) | _place_d(D1, 1)
    return w


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
                     MX: tl.constexpr, G: tl.constexpr, GLOBAL_PER_ROW: tl.constexpr, KCH: tl.constexpr):
    """Rows pid0 * 16 .. + 16 of expert pid1, columns pid2 * 128 KCH .. + 128 KCH."""
    pid = tl.program_id(0)
    kbeg = tl.program_id(2) * (128 * KCH)
    kend = tl.minimum(kbeg + 128 * KCH, KP)
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
    if MX:   # the rows' largest non-NaN exponent (and NaN flag), over the whole row: the programs split K
        top = tl.full([16], -1, tl.int32)
        has_nan = tl.zeros([16], dtype=tl.int32)
        for k0 in range(0, K // G, 32):
            sc = k0 + tl.arange(0, 32)
            valid = row_ok[:, None] & (sc < K // G)[None, :]
            e = tl.load(scales_ptr + rows[:, None].to(tl.int64) * stride_s + sc[None, :], mask=valid,
                        other=255).to(tl.int32)                     # 255: not an exponent (an all-NaN row: MX_TOP)
            top = tl.maximum(top, tl.max(tl.where(e == 255, -1, e), axis=1))
            has_nan = tl.maximum(has_nan, tl.max((valid & (e == 255)).to(tl.int32), axis=1))
        top = tl.where(top < 0, MX_TOP, top)
    for k0 in range(kbeg, kend, 128):
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
            out_b = tl.where(nan, 255, sb + (254 - top[:, None]))
            out_b = tl.where(s_ok, out_b, 0)
        else:
            out_b, flip, zero = _nv_encode(sb)
            blocks = tl.where(zero[:, :, None], blocks & 8, blocks) ^ flip[:, :, None]
        tl.store(out_scales_ptr + rows[:, None].to(tl.int64) * stride_os + sc[None, :], out_b.to(tl.uint8))
        c = tl.reshape(blocks, [2, 8, 4, 2, 2, 4, 2])                           # h g i r c t e
        c = tl.permute(c, (0, 1, 5, 2, 3, 4, 6))                                # h g t i r c e
        word = tl.reshape(_pack_word(tl.reshape(c, [2, 8, 4, 4, 8])), [256])
        tl.store(values_ptr + pid.to(tl.int64) * stride_v + (k0 // 128) * 256 + tl.arange(0, 256), word)
    if tl.program_id(2) == 0:   # the row factors: once per row
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
            tl.store(rf_ptr + rows, tl.where(row_ok, g * NV_FACTOR_SCALE, 1.0))


# 128-column chunks per program: the grid splits K too (one program per 16 rows walking the whole of K left the
# H200 mostly idle: 64 programs for an 8B k_proj, the 8B sync's re-layout at ~0.8 TB/s, 9.8 ms nvfp4 / 11.2 mxfp4);
# mxfp4 programs each re-read their rows' scales for the row exponent (1/16 of the code bytes per 128 columns)
KCH = 4


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
    _relayout_kernel[(np_ // ROWS, e, triton.cdiv(kp, COLS * KCH))](
        codes, scales, glob, values, oscales, rf, n, k, codes.stride(1), scales.stride(1), values.stride(1),
        oscales.stride(1), kp, codes.stride(0), scales.stride(0), n if per_row else (1 if per_expert else 0),
        values.stride(0), oscales.stride(0), rf.stride(0), MX=q.format == "mxfp4", G=G, GLOBAL_PER_ROW=per_row,
        KCH=KCH, num_warps=4)
    return out


assert COLS == 128


def sass_gate_cases():
    """Compile-only cases (no MMA): the re-layout must build for sm_90 with the GPU's Triton."""
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(codes_ptr="*u8", scales_ptr="*u8", glob_ptr="*fp32", values_ptr="*i32", out_scales_ptr="*u8",
               rf_ptr="*fp32", N="i32", K="i32", stride_c="i32", stride_s="i32", stride_v="i32", stride_os="i32",
               KP="i32", stride_ce="i32", stride_se="i32", stride_ge="i32", stride_ve="i32", stride_ose="i32",
               stride_rfe="i32")
    return [GateCase(f"relayout {fmt}", _relayout_kernel, sig,
                     dict(MX=fmt == "mxfp4", G=g, GLOBAL_PER_ROW=False, KCH=KCH),
                     4, 1, 16 * 128 / 128, 1000.0, register_a=False, forbid=())
            for fmt, g in (("nvfp4", 16), ("mxfp4", 32))]
