"""Triton decode of the Hopper FP4 layout (hopper_fp4.py) into wgmma's register A operand.

`decode_tile(words, s_even, s_odd, ...)` turns a program's tile of layout words into the bf16 weight tile
[BN, BK] = code value x 2**-126 x pre-biased scale, exactly. Two implementations of one function:
- DECODE_ASM (sm_90): inline PTX per word: one `and`, three rotations (`shf.r.wrap`) with masks, and four
  `mul.rn.bf16x2` by the scale pairs: 13 instructions per 8 weights. The scale pairs come from the
  pre-biased bytes with one `prmt` and one `mad` per byte (`scale_pairs`).
- DECODE_PURE: the same bits with Triton integer ops and float32 products (exact: the values are bf16
  values and the products are representable), for Triton's CPU interpreter (which cannot run inline PTX)
  and as the GPU fallback. The GPU tests check both against the torch reference over all codes and scales.
The join/permute that follows is a pure re-indexing: with the layout's word order Triton 3.6 resolves it
to register renaming (no shared-memory round trip; the compile gate in sass_gate.py checks that).
"""

from __future__ import annotations

import triton
import triton.language as tl

from trace_rl.kernels.fp_bits import bf16_halves

DECODE_PURE = 0
DECODE_ASM = 1

_DECODE_BODY = """{
.reg .b32 a, b, c, d, t0, t1;
and.b32 a, $4, 0x81C081C0;
shf.r.wrap.b32 b, $4, $4, 4;
and.b32 b, b, 0x81C081C0;
shf.r.wrap.b32 c, $4, $4, 10;
and.b32 c, c, 0x81C081C0;
shf.r.wrap.b32 t0, $4, $4, 6;
shf.r.wrap.b32 t1, $4, $4, 14;
and.b32 t0, t0, 0x81808180;
and.b32 t1, t1, 0x00400040;
or.b32 d, t0, t1;
mul.rn.bf16x2 $0, a, $5;
mul.rn.bf16x2 $1, b, $5;
mul.rn.bf16x2 $2, c, $6;
mul.rn.bf16x2 $3, d, $6;
}"""
DECODE_ASM_TEXT = tl.constexpr(_DECODE_BODY)

# 4 pre-biased scale bytes of a word -> 4 bf16x2 pairs (s, s). nvfp4: 0x7000 | byte << 4; mxfp4: byte << 7.
_NV_SCALE = """{
.reg .b32 t0, t1, t2, t3;
prmt.b32 t0, $4, 0, 0x4040;
prmt.b32 t1, $4, 0, 0x4141;
prmt.b32 t2, $4, 0, 0x4242;
prmt.b32 t3, $4, 0, 0x4343;
mad.lo.u32 $0, t0, 16, 0x70007000;
mad.lo.u32 $1, t1, 16, 0x70007000;
mad.lo.u32 $2, t2, 16, 0x70007000;
mad.lo.u32 $3, t3, 16, 0x70007000;
}"""
_MX_SCALE = _NV_SCALE.replace("mad.lo.u32 $0, t0, 16, 0x70007000", "shl.b32 $0, t0, 7").replace(
    "mad.lo.u32 $1, t1, 16, 0x70007000", "shl.b32 $1, t1, 7").replace(
    "mad.lo.u32 $2, t2, 16, 0x70007000", "shl.b32 $2, t2, 7").replace(
    "mad.lo.u32 $3, t3, 16, 0x70007000", "shl.b32 $3, t3, 7")
NV_SCALE_ASM = tl.constexpr(_NV_SCALE)
MX_SCALE_ASM = tl.constexpr(_MX_SCALE)


@triton.jit
def _rotr(x, r: tl.constexpr):
    u = x.to(tl.uint32, bitcast=True)
    return ((u >> r) | (u << (32 - r))).to(tl.int32, bitcast=True)


@triton.jit
def _byte(w, j: tl.constexpr):
    return (w >> (8 * j)) & 0xFF


@triton.jit
def _scale_bits(b, MX: tl.constexpr):
    """bf16 bits (int32, low half) of a pre-biased scale byte."""
    if MX:
        bits = b << 7
    else:
        bits = 0x7000 | (b << 4)
    return bits


@triton.jit
def scale_pairs(sw, MX: tl.constexpr, DECODE: tl.constexpr):
    """int32 words of 4 pre-biased scale bytes -> 4 tensors, one per byte: bf16x2 (s, s) bit pairs (ASM) or
    the float32 scale value x 2**-126 (PURE)."""
    if DECODE == 1:
        if MX:
            s0, s1, s2, s3 = tl.inline_asm_elementwise(MX_SCALE_ASM, "=r,=r,=r,=r,r", [sw],
                                                       dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                       is_pure=True, pack=1)
        else:
            s0, s1, s2, s3 = tl.inline_asm_elementwise(NV_SCALE_ASM, "=r,=r,=r,=r,r", [sw],
                                                       dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
                                                       is_pure=True, pack=1)
    else:   # the scale times 2**-126 (the PURE decode yields E2M1 values, not E2M1 x 2**-126)
        s0 = (_scale_bits(_byte(sw, 0), MX) << 16).to(tl.float32, bitcast=True) * 1.1754943508222875e-38
        s1 = (_scale_bits(_byte(sw, 1), MX) << 16).to(tl.float32, bitcast=True) * 1.1754943508222875e-38
        s2 = (_scale_bits(_byte(sw, 2), MX) << 16).to(tl.float32, bitcast=True) * 1.1754943508222875e-38
        s3 = (_scale_bits(_byte(sw, 3), MX) << 16).to(tl.float32, bitcast=True) * 1.1754943508222875e-38
    return s0, s1, s2, s3


@triton.jit
def tile_scales(sw, BN: tl.constexpr, BK: tl.constexpr, MX: tl.constexpr, DECODE: tl.constexpr):
    """A program's scale words -> (s_even, s_odd) [BN/16, BK/128, 2, 8, 1, 4], broadcastable against its
    layout words: the scales of K-slices 2i and 2i+1 of each (row, 128 columns), i on the last axis.
    nvfp4: `sw` is [BN, BK/64] (byte j of word w: K-slice 4w + j); mxfp4: [BN, BK/128] (byte i: K-slices
    2i, 2i+1)."""
    s0, s1, s2, s3 = scale_pairs(sw, MX, DECODE)
    if MX:
        se = tl.join(tl.join(s0, s2), tl.join(s1, s3))         # [BN, BK/128, i // 2, i % 2]
        so = se
    else:
        se = tl.join(s0, s2)                                   # [BN, BK/64, i % 2]: slices 4w, 4w + 2
        so = tl.join(s1, s3)
    se = tl.permute(tl.reshape(se, [BN // 16, 2, 8, BK // 128, 4]), (0, 3, 1, 2, 4))
    so = tl.permute(tl.reshape(so, [BN // 16, 2, 8, BK // 128, 4]), (0, 3, 1, 2, 4))
    return tl.expand_dims(se, 4), tl.expand_dims(so, 4)


@triton.jit
def _e2m1_from_bf16_bits(h):
    """The E2M1 value (float32, normal) of a 16-bit decoded pattern `s.......ee m......` whose bf16 value
    is E2M1 x 2**-126, built from its bits (no subnormal float operand, whatever the GPU's denormal mode)."""
    e = (h >> 7) & 3
    m = (h >> 6) & 1
    bits = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))
    return (bits | ((h & 0x8000) << 16)).to(tl.float32, bitcast=True)


@triton.jit
def _halves_f32(bits, scale, OUT_F32: tl.constexpr):
    """bf16 bit pair (int32) -> the two E2M1 values x (scale x 2**-126), exact; float32 or bf16."""
    lo = _e2m1_from_bf16_bits(bits & 0xFFFF) * scale
    hi = _e2m1_from_bf16_bits((bits >> 16) & 0xFFFF) * scale
    if not OUT_F32:
        lo = lo.to(tl.bfloat16)
        hi = hi.to(tl.bfloat16)
    return lo, hi


@triton.jit
def decode_tile(words, s_even, s_odd, BN: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr,
                OUT_F32: tl.constexpr):
    """words int32 [BN/16, BK/128, 2, 8, 4, 4] (n16, kc, h, g, t, i) -> weight tile [BN, BK] (bf16, or
    float32 with OUT_F32, which only the PURE decode provides: the interpreter's bf16 dot is broken)."""
    se = tl.broadcast_to(s_even, words.shape)
    so = tl.broadcast_to(s_odd, words.shape)
    if DECODE == 1:
        a, b, c, d = tl.inline_asm_elementwise(DECODE_ASM_TEXT, "=r,=r,=r,=r,r,r,r", [words, se, so],
                                               dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True,
                                               pack=1)
        a0, a1 = bf16_halves(a)
        b0, b1 = bf16_halves(b)
        c0, c1 = bf16_halves(c)
        d0, d1 = bf16_halves(d)
    else:
        mask = -2118090304                                     # 0x81C081C0
        a = words & mask
        b = _rotr(words, 4) & mask
        c = _rotr(words, 10) & mask
        d = (_rotr(words, 6) & -2122219136) | (_rotr(words, 14) & 0x00400040)   # 0x81808180
        a0, a1 = _halves_f32(a, se, OUT_F32)
        b0, b1 = _halves_f32(b, se, OUT_F32)
        c0, c1 = _halves_f32(c, so, OUT_F32)
        d0, d1 = _halves_f32(d, so, OUT_F32)
    r0 = tl.join(tl.join(a0, a1), tl.join(b0, b1))             # [..., e, c]
    r1 = tl.join(tl.join(c0, c1), tl.join(d0, d1))
    v = tl.join(r0, r1)                                        # [n16, kc, h, g, t, i, e, c, r]
    v = tl.permute(v, (0, 2, 3, 1, 5, 8, 7, 4, 6))             # [n16, h, g, kc, i, r, c, t, e]
    return tl.reshape(v, [BN, BK])
