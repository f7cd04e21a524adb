"""Triton kernel deriving the Hopper FP4 layout (hopper_fp4.py) from a reference QTensor on the GPU, in place:
graph-capturable (weight sync re-derives into the same tensors). Bit-exact with the torch reference
`hopper_fp4.to_hopper` (tests/kernels/test_hopper_fp4.py).

A program owns a 16-row x 256-column tile (the grid splits rows, experts and K; the first version, one program
per 16 rows walking K, left the H200 mostly idle: 64 programs for an 8B k_proj, ~0.8 TB/s). Tile row m is (layout
row, 128-column chunk, 32-column window i); its thread loads the window's 16 code bytes as four 4-byte quarters
(r, c) = columns 16 r + 8 c, byte t = columns 2t, 2t + 1: the four [M, 4] tensors share one register layout, and
each layout word takes byte t of every quarter (hopper_fp4.py's slots A..D = (r, c)), so the re-layout is a
permutation done in registers: nvfp4 scale signs / zero scales folded into the bytes (one LOP3 per byte), each
slot's code pair spread to its bits by two multiplies, rotated, OR-ed (`_words`). nvfp4 scales are re-encoded in
the same program; mxfp4 layout scales (relative to the row's largest exponent, which a K-split program cannot
see) and row factors come from a second small launch over the QTensor scales (`_mx_layout_scales_kernel`).
sm_90 SASS per element (Triton 3.6, compile-only): nvfp4 22.2 (the K loop's body) -> 10.5 (whole kernel), mxfp4
15.5 -> 6.75 (+ the scales launch, 5.6 per scale byte, 1/32 of the codes); the code bytes as 4-byte loads
(`tl.multiple_of`: byte loads, 16 a thread, took nvfp4 to 15.9).
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
def _slot_pair(byt):
    """Bytes [M, 4] of one quarter (byte t: code e = 0 low nibble, e = 1 high) -> the slot's two codes of each
    layout word before the slot's rotation (hopper_fp4._place_bits): e = 0 sign -> bit 15, index -> bits 8..6, e = 1
    the same + 16. By two multiplies: (b & 0x77) * (2**6 + 2**18) puts index 0 at 6..8 and index 1 at 22..24,
    (b & 0x88) * (2**12 + 2**24) the signs at 15 and 31; the other copies land on bits the mask drops, and none
    overlap (no carries). 5 instructions per code pair; from separate codes (two shifts, a LOP3 per code and a
    LEA per pair) it took 7."""
    return (((byt & 0x77) * 0x40040) | ((byt & 0x88) * 0x1001000)) & -2118090304       # 0x81C081C0


@triton.jit
def _words(b00, b01, b10, b11):
    """Layout words [M, 4] (t) from the bytes of the four quarters: slots A (0, 0), B (0, 1), C (1, 0),
    D (1, 1) rotated into place (hopper_fp4.SLOT_ROTATIONS; D's mantissa bit by 14). = hopper_fp4._place_bits."""
    d = _slot_pair(b11)
    w = _slot_pair(b00) | _rotl(_slot_pair(b01), 4) | _rotl(_slot_pair(b10), 10)
    return w | _rotl(d & -2122284672, 6) | _rotl(d & 0x00400040, 14)       # -2122284672 == 0x81808180


@triton.jit
def _store_words(values_ptr, w, block_row, chunk, row16, i, KP):
    """Words [M, 4] (t) of tile rows (row16, chunk, i): word (h, g, t, i) of layout block (block_row, chunk) is
    at h * 128 + (4 g + t) * 4 + i, row16 = 8 h + g; chunks past KP are not stored. (Triton stages them through
    shared memory into 16-byte stores.)"""
    wp = values_ptr + block_row + chunk * 256 + (row16 // 8) * 128 + (row16 % 8) * 16 + i
    tl.store(wp[:, None] + 4 * tl.arange(0, 4)[None, :], w, mask=(chunk * 128 < KP)[:, None])


@triton.jit
def _relayout_kernel(codes_ptr, scales_ptr, glob_ptr, values_ptr, out_scales_ptr, rf_ptr,
                     N, K, stride_c, stride_s, stride_v, stride_os, KP,
                     stride_ce, stride_se, stride_ge, stride_ve, stride_ose, stride_rfe,
                     MX: tl.constexpr, G: tl.constexpr, GLOBAL_PER_ROW: tl.constexpr, KC: tl.constexpr):
    """Rows pid0 * 16 .. + 16 of expert pid1, columns pid2 * 128 KC .. + 128 KC (tile row m: row m // 4KC,
    chunk m // 4 % KC, window i = m % 4). nvfp4 also the layout scales and (programs (., ., 0)) the row factors;
    mxfp4 only the words (`_mx_layout_scales_kernel` does the rest)."""
    M: tl.constexpr = 64 * KC
    pid = tl.program_id(0)
    ex = tl.program_id(1).to(tl.int64)          # expert (stacked layouts); 0 for a plain weight
    codes_ptr += ex * stride_ce
    scales_ptr += ex * stride_se
    values_ptr += ex * stride_ve
    out_scales_ptr += ex * stride_ose
    m = tl.arange(0, M)
    row16 = m // (4 * KC)
    row = (pid * 16 + row16).to(tl.int64)
    chunk = tl.program_id(2) * KC + (m // 4) % KC
    i = m % 4
    col = chunk * 128 + 32 * i                              # the window's first column
    rok = row < N
    ok0 = rok & (col < K)                                   # K % 16 == 0: a half window is all in or all out
    ok1 = rok & (col + 16 < K)
    cp = tl.multiple_of(codes_ptr + row * stride_c + col // 2, 4)    # relayout(): 4-byte aligned rows
    b00 = tl.load(cp[:, None] + tl.arange(0, 4)[None, :], mask=ok0[:, None], other=0).to(tl.int32)
    b01 = tl.load(cp[:, None] + 4 + tl.arange(0, 4)[None, :], mask=ok0[:, None], other=0).to(tl.int32)
    b10 = tl.load(cp[:, None] + 8 + tl.arange(0, 4)[None, :], mask=ok1[:, None], other=0).to(tl.int32)
    b11 = tl.load(cp[:, None] + 12 + tl.arange(0, 4)[None, :], mask=ok1[:, None], other=0).to(tl.int32)
    if not MX:
        # scale signs flip the block's code signs, zero scales keep only them (one LOP3 per byte); padding
        # blocks: byte 0 -> code 0 under layout scale byte 0
        sp = scales_ptr + row * stride_s + col // 16
        s0 = tl.load(sp, mask=ok0, other=0).to(tl.int32) & 0xFF
        s1 = tl.load(sp + 1, mask=ok1, other=0).to(tl.int32) & 0xFF
        o0, f0, z0 = _nv_encode(s0)
        o1, f1, z1 = _nv_encode(s1)
        zm0 = tl.where(z0, 0x88, 0xFF)[:, None]
        zm1 = tl.where(z1, 0x88, 0xFF)[:, None]
        b00 = (b00 & zm0) ^ (f0 * 0x11)[:, None]
        b01 = (b01 & zm0) ^ (f0 * 0x11)[:, None]
        b10 = (b10 & zm1) ^ (f1 * 0x11)[:, None]
        b11 = (b11 & zm1) ^ (f1 * 0x11)[:, None]
        in_kp = chunk * 128 < KP
        op = out_scales_ptr + row * stride_os + col // 16
        tl.store(op, o0.to(tl.uint8), mask=in_kp)
        tl.store(op + 1, o1.to(tl.uint8), mask=in_kp)
    _store_words(values_ptr, _words(b00, b01, b10, b11), pid.to(tl.int64) * stride_v, chunk, row16, i, KP)
    if not MX:
        if tl.program_id(2) == 0:   # the row factors: once per row
            glob_ptr += ex * stride_ge
            rf_ptr += ex * stride_rfe
            rows = pid * 16 + tl.arange(0, 16)
            row_ok = rows < N
            if GLOBAL_PER_ROW:
                g = tl.load(glob_ptr + rows, mask=row_ok, other=1.0)
            else:
                g = tl.load(glob_ptr) + tl.zeros([16], dtype=tl.float32)
            tl.store(rf_ptr + rows, tl.where(row_ok, g * NV_FACTOR_SCALE, 1.0))


@triton.jit
def _mx_layout_scales_kernel(scales_ptr, out_scales_ptr, rf_ptr, N, NBK, NBKP, stride_s, stride_os,
                             stride_se, stride_ose, stride_rfe):
    """mxfp4 layout scales and row factors of rows pid0 * 16 .. + 16 of expert pid1 from the QTensor's E8M0
    scales [N, NBK] (NBKP = KP / 32 layout columns): each row's largest non-NaN exponent (MX_TOP for none), the
    scales re-biased to it, the row factor 2**c (a NaN keeping c for a row holding a NaN block)."""
    ex = tl.program_id(1).to(tl.int64)
    scales_ptr += ex * stride_se
    out_scales_ptr += ex * stride_ose
    rf_ptr += ex * stride_rfe
    rows = tl.program_id(0) * 16 + tl.arange(0, 16)
    row_ok = rows < N
    top = tl.full([16], -1, tl.int32)
    for k0 in range(0, NBK, 32):
        sc = k0 + tl.arange(0, 32)
        e = tl.load(scales_ptr + rows[:, None].to(tl.int64) * stride_s + sc[None, :],
                    mask=row_ok[:, None] & (sc < NBK)[None, :], other=255).to(tl.int32)   # 255: not an exponent
        top = tl.maximum(top, tl.max(tl.where(e == 255, -1, e), axis=1))
    top = tl.where(top < 0, MX_TOP, top)
    has_nan = tl.zeros([16], dtype=tl.int32)
    for k0 in range(0, NBKP, 32):
        sc = k0 + tl.arange(0, 32)
        s_ok = row_ok[:, None] & (sc < NBK)[None, :]
        sb = tl.load(scales_ptr + rows[:, None].to(tl.int64) * stride_s + sc[None, :], mask=s_ok,
                     other=0).to(tl.int32) & 0xFF
        nan = sb == 255
        has_nan = tl.maximum(has_nan, tl.max(nan.to(tl.int32), axis=1))
        out_b = tl.where(s_ok, tl.where(nan, 255, sb + (254 - top[:, None])), 0)
        tl.store(out_scales_ptr + rows[:, None].to(tl.int64) * stride_os + sc[None, :], out_b.to(tl.uint8),
                 mask=(sc < NBKP)[None, :])
    c_row = top - MX_TOP
    factor = tl.where(c_row >= -126, (c_row + 127) << 23, 1 << tl.maximum(149 + c_row, 0))   # 2**c
    factor = tl.where(has_nan > 0, 0x7FC00000 | (c_row + 256), factor)
    factor = tl.where(row_ok, factor, 0x3F800000)                                            # padding: 1.0
    tl.store(rf_ptr + rows, factor.to(tl.float32, bitcast=True))


KC = 2   # 128-column chunks per program (M = 64 KC tile rows, one per thread of 2 KC warps)


def relayout(q, out: HopperFP4 | None = None) -> HopperFP4:
    """The Hopper layout of QTensor `q` ([N, K], or experts [E, N, K] stacked), nvfp4 or mxfp4, written into
    `out` when given. One launch (mxfp4: two)."""
    G = block_size(q.format)
    experts = q.shape[0] if len(q.shape) == 3 else None
    n, k = q.shape[-2:]
    out = HopperFP4.empty(q.format, n, k, q.codes.device, experts) if out is None else out
    if (out.fmt, out.n, out.k) != (q.format, n, k) or (out.values.dim() == 3) != (experts is not None):
        raise ValueError(f"relayout: {q.format} {tuple(q.shape)} into a {out.fmt} {out.n}x{out.k} layout")
    e = experts or 1
    np_, kp = out.padded
    codes = q.codes.reshape(e, n, k // 2)
    if codes.data_ptr() % 4 or codes.stride(0) % 4 or codes.stride(1) % 4:   # the kernel loads 4-byte words
        # a fresh, aligned copy (contiguous() would hand back a contiguous view at an odd offset as it is)
        codes = codes.clone(memory_format=torch.contiguous_format)
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
    if not (np_ and kp):
        return out
    mx = q.format == "mxfp4"
    _relayout_kernel[(np_ // ROWS, e, triton.cdiv(kp, COLS * KC))](
        codes, scales, glob, values, oscales, rf, n, k, codes.stride(1), scales.stride(1), values.stride(1),
        oscales.stride(1), kp, codes.stride(0), scales.stride(0), n if per_row else (1 if per_expert else 0),
        values.stride(0), oscales.stride(0), rf.stride(0), MX=mx, G=G, GLOBAL_PER_ROW=per_row, KC=KC,
        num_warps=2 * KC)
    if mx:
        _mx_layout_scales_kernel[(np_ // ROWS, e)](
            scales, oscales, rf, n, k // G, kp // G, scales.stride(1), oscales.stride(1), scales.stride(0),
            oscales.stride(0), rf.stride(0), num_warps=4)
    return out


assert COLS == 128


def sass_gate_cases():
    """Compile-only cases (no MMA): the re-layout must build for sm_90 with the GPU's Triton. Loop-free: the whole
    kernel counts, per code a thread places (32); budgets ~10% over Triton 3.6's count (see the module doc)."""
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(codes_ptr="*u8", scales_ptr="*u8", glob_ptr="*fp32", values_ptr="*i32", out_scales_ptr="*u8",
               rf_ptr="*fp32", N="i32", K="i32", stride_c="i32", stride_s="i32", stride_v="i32", stride_os="i32",
               KP="i32", stride_ce="i32", stride_se="i32", stride_ge="i32", stride_ve="i32", stride_ose="i32",
               stride_rfe="i32")
    div = ("codes_ptr", "scales_ptr", "values_ptr", "out_scales_ptr", "K", "KP", "stride_c", "stride_s", "stride_v",
           "stride_os")
    return [GateCase(f"relayout {fmt}", _relayout_kernel, sig,
                     dict(MX=fmt == "mxfp4", G=g, GLOBAL_PER_ROW=False, KC=KC), 2 * KC, 1, 32, budget,
                     divisible=div, register_a=False, forbid=(), whole_kernel=True)
            for fmt, g, budget in (("nvfp4", 16, 11.6), ("mxfp4", 32, 7.5))]
