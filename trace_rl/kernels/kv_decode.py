"""Triton decode of the KV-cache words laid out by trace_rl/formats/kv_layout.py into bf16 MMA operands.

Each function takes int32 words (4 bytes of the cache) and returns the bf16 values they hold, as
separate tensors of the words' shape; the kernel joins and permutes them into the MMA fragment order
(a register renaming on sm_90: the layouts are built so that no data moves between threads).

Two modes (the launcher picks): DECODE_ASM, inline PTX for sm_90 (shifts, masks and `mul.rn.bf16x2`;
one asm call per word, so its meaning does not depend on how Triton lays the tensor out), and
DECODE_PURE, the same bit operations in Triton integer ops with float32 products, which run in the CPU
interpreter (it cannot run inline asm) and are exactly equal: every product here is exact in bf16.

Costs per 8 FP4 values (sm_90 SASS, Triton 3.6): 10-11 LOP3/SHF for the codes, 4 HMUL2 for the block
scale (nvfp4), 4 more for the 2**125 bias (mxfp4, whose scale range does not fit one bf16 factor).
"""

from __future__ import annotations

import triton
import triton.language as tl

DECODE_PURE = 0
DECODE_ASM = 1

_FP4_CODES = """
    .reg .b32 t0, t1, t2, o0, o1, o2, o3;
    and.b32 o0, $8, 0x81C081C0;
    shl.b32 t1, $8, 3;
    and.b32 o1, t1, 0x81C081C0;
    shl.b32 t2, $8, 6;
    and.b32 o2, t2, 0x81C081C0;
    shl.b32 t0, $8, 1;
    and.b32 t0, t0, 0x80008000;
    shr.b32 t1, $8, 3;
    and.b32 t1, t1, 0x01800180;
    or.b32 t0, t0, t1;
    shr.b32 t2, $8, 7;
    and.b32 t2, t2, 0x00400040;
    or.b32 o3, t0, t2;
"""
_BIAS_MX = """
    .reg .b32 bias;
    mov.b32 bias, 0x7E007E00;
    mul.rn.bf16x2 o0, o0, bias;
    mul.rn.bf16x2 o1, o1, bias;
    mul.rn.bf16x2 o2, o2, bias;
    mul.rn.bf16x2 o3, o3, bias;
"""
_SCALE_OUT = """
    mul.rn.bf16x2 o0, o0, $9;
    mul.rn.bf16x2 o1, o1, $9;
    mul.rn.bf16x2 o2, o2, $9;
    mul.rn.bf16x2 o3, o3, $9;
    mov.b32 {$0, $1}, o0;
    mov.b32 {$2, $3}, o1;
    mov.b32 {$4, $5}, o2;
    mov.b32 {$6, $7}, o3;
"""
FP4_NV_ASM = tl.constexpr("{" + _FP4_CODES + _SCALE_OUT + "}")
FP4_MX_ASM = tl.constexpr("{" + _FP4_CODES + _BIAS_MX + _SCALE_OUT + "}")
FP8_ASM = tl.constexpr("""{
    .reg .b32 a, b, m, bias;
    mov.b32 bias, 0x7B807B80;
    shl.b32 m, $4, 4;
    and.b32 m, m, 0x07F007F0;
    shl.b32 a, $4, 8;
    and.b32 a, a, 0x80008000;
    or.b32 a, a, m;
    mul.rn.bf16x2 a, a, bias;
    shr.b32 m, $4, 4;
    and.b32 m, m, 0x07F007F0;
    and.b32 b, $4, 0x80008000;
    or.b32 b, b, m;
    mul.rn.bf16x2 b, b, bias;
    mov.b32 {$0, $1}, a;
    mov.b32 {$2, $3}, b;
}""")


@triton.jit
def _lo(x):
    """float32 value of the bf16 in the low half of int32 x."""
    return (x << 16).to(tl.float32, bitcast=True)


@triton.jit
def _hi(x):
    return (x & -65536).to(tl.float32, bitcast=True)


@triton.jit
def fp4_scale_pair(lo, hi, MX: tl.constexpr):
    """Stored scale bytes (int32 0..255) of the two halves -> the bf16x2 word `mul.bf16x2` takes."""
    if MX:
        pair = (lo | (hi << 16)) << 7
    else:
        pair = (lo | (hi << 16)) * 16 + 0x76807680      # + (237 << 7) in each half
    return pair


_NV_PAIRS = tl.constexpr("""{
    .reg .b32 a, b;
    and.b32 a, $2, 0x00FF00FF;
    mad.lo.u32 $0, a, 16, 0x76807680;
    and.b32 b, $2, 0xFF00FF00;
    mad.hi.u32 $1, b, 0x10000000, 0x76807680;
}""")


@triton.jit
def fp4_scale_word_pairs(sw, MX: tl.constexpr, MODE: tl.constexpr):
    """A word of 4 stored scale bytes [b0 b1 b2 b3] -> the pairs (b0, b2) and (b1, b3) (2 ops each on sm_90:
    a mask and one integer multiply-add; `mad.hi` by 2**28 is the shift right by 4)."""
    if MODE == 1 and not MX:
        p02, p13 = tl.inline_asm_elementwise(_NV_PAIRS, "=r,=r,r", [sw], dtype=(tl.int32, tl.int32),
                                             is_pure=True, pack=1)
    else:
        p02 = fp4_scale_pair(sw & 255, (sw >> 16) & 255, MX)
        p13 = fp4_scale_pair((sw >> 8) & 255, (sw >> 24) & 255, MX)
    return p02, p13


@triton.jit
def fp4_words(x, pair, MX: tl.constexpr, MODE: tl.constexpr):
    """int32 words of 8 twiddled E2M1 codes and their scale pairs -> 8 values (slot 0 lo, slot 0 hi, ..,
    slot 3 hi): bf16 (ASM) or float32 (PURE), code * scale (nvfp4: * 2**-7)."""
    if MODE == 1:
        if MX:
            v = tl.inline_asm_elementwise(FP4_MX_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [x, pair],
                                          dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
        else:
            v = tl.inline_asm_elementwise(FP4_NV_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [x, pair],
                                          dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        o0 = x & -2118090304                                  # 0x81C081C0
        o1 = (x << 3) & -2118090304
        o2 = (x << 6) & -2118090304
        o3 = ((x << 1) & -2147450880) | ((x >> 3) & 0x01800180) | ((x >> 7) & 0x00400040)   # 0x80008000
        s_lo, s_hi = _lo(pair), _hi(pair)
        bias = 4.253529586511731e+37 if MX else 1.0           # 2**125
        v = (_lo(o0) * bias * s_lo, _hi(o0) * bias * s_hi, _lo(o1) * bias * s_lo, _hi(o1) * bias * s_hi,
             _lo(o2) * bias * s_lo, _hi(o2) * bias * s_hi, _lo(o3) * bias * s_lo, _hi(o3) * bias * s_hi)
    return v


@triton.jit
def fp8_words(x, MODE: tl.constexpr):
    """int32 words of 4 E4M3 codes [b0 b1 b2 b3] -> (b0, b2, b1, b3) values (bf16 ASM / float32 PURE)."""
    if MODE == 1:
        v = tl.inline_asm_elementwise(FP8_ASM, "=h,=h,=h,=h,r", [x], dtype=(tl.bfloat16,) * 4, is_pure=True, pack=1)
    else:
        a = ((x << 8) & -2147450880) | ((x << 4) & 0x07F007F0)
        b = (x & -2147450880) | ((x >> 4) & 0x07F007F0)
        bias = 1.329227995784916e+36                          # 2**120
        v = (_lo(a) * bias, _hi(a) * bias, _lo(b) * bias, _hi(b) * bias)
    return v
