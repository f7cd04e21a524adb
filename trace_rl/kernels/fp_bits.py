"""Bit-level Triton helpers shared by the kernels: E2M1 / E4M3 / E8M0 encode and decode.

Rounding is done on integer bits, never through Triton's float casts to FP8 or BF16, so the same code is
bit-exact on the GPU and in Triton's CPU interpreter (whose casts to those types are not faithful).
Division is `tl.math.div_rn` (correctly rounded): Triton's `/` on float32 is approximate on the GPU.

Decoding packed E2M1 (`fp4x8_to_bf16`) has three modes, picked by the launcher:
- DECODE_PURE: Triton integer/float ops only; runs in the interpreter (CPU tests) and on the GPU.
- DECODE_ASM: inline PTX (sm_90): `prmt` byte-permute look-ups turn 8 nibbles into 8 bf16 values in
  ~16 instructions, then `mul.rn.bf16x2` applies the block scale (exact: a 2-bit E2M1 significand times
  a 4-bit E4M3 one fits bf16's 8 bits). Returns 4 bf16x2 words, split into halves in Triton (ptxas
  folds the split: returning 16-bit registers from the asm gave the same SASS, Triton 3.9, sm_90).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

DECODE_PURE = 0
DECODE_ASM = 1


def default_decode(device) -> int:
    """The E2M1 decode mode for tensors on `device`: the PTX path needs sm_90 (`mul.rn.bf16x2`)."""
    from trace_rl.kernels import interpreting

    if interpreting() or torch.cuda.get_device_capability(device) < (9, 0):
        return DECODE_PURE
    return DECODE_ASM

# The look-up: E2M1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6 are bf16 0x0000 0x3F00 0x3F80 0x3FC0 0x4000
# 0x4040 0x4080 0x40C0; `prmt` picks, per output byte, one of 8 table bytes by a 3-bit index. The low
# bytes table is 00 00 80 C0 00 40 80 C0, the high bytes 00 3F 3F 3F 40 40 40 40, the sign 00 or 80.
_FP4X8_BODY = """
    .reg .b32 sgn, sgn_lo, sgn_hi, mag, mag_hi, lo_a, lo_b, hi_a, hi_b, s_a, s_b, r0, r1, r2, r3;
    and.b32 sgn, $IN, 0x88888888;
    shr.u32 sgn_lo, sgn, 3;
    shr.u32 sgn_hi, sgn, 19;
    and.b32 mag, $IN, 0x77777777;
    shr.u32 mag_hi, mag, 16;
    prmt.b32 lo_a, 0xC0800000, 0xC0804000, mag;
    prmt.b32 lo_b, 0xC0800000, 0xC0804000, mag_hi;
    prmt.b32 hi_a, 0x3F3F3F00, 0x40404040, mag;
    prmt.b32 hi_b, 0x3F3F3F00, 0x40404040, mag_hi;
    prmt.b32 s_a, 0x00008000, 0, sgn_lo;
    prmt.b32 s_b, 0x00008000, 0, sgn_hi;
    or.b32 hi_a, hi_a, s_a;
    or.b32 hi_b, hi_b, s_b;
    prmt.b32 r0, lo_a, hi_a, 0x5140;
    prmt.b32 r1, lo_a, hi_a, 0x7362;
    prmt.b32 r2, lo_b, hi_b, 0x5140;
    prmt.b32 r3, lo_b, hi_b, 0x7362;
    mul.rn.bf16x2 $0, r0, $5;
    mul.rn.bf16x2 $1, r1, $5;
    mul.rn.bf16x2 $2, r2, $5;
    mul.rn.bf16x2 $3, r3, $5;
"""
FP4X8_ASM = tl.constexpr("{" + _FP4X8_BODY.replace("$IN", "$4") + "}")


@triton.jit
def e2m1_index(mag):
    """Index 0..7 (int32) of the E2M1 magnitude nearest to float32 `mag` >= 0: ties to even, saturating.
    NaN gives 0 (its block's scale is NaN, so the block dequantizes to NaN anyway)."""
    idx = (mag > 0.25).to(tl.int32)
    idx += (mag >= 0.75).to(tl.int32)
    idx += (mag > 1.25).to(tl.int32)
    idx += (mag >= 1.75).to(tl.int32)
    idx += (mag > 2.5).to(tl.int32)
    idx += (mag >= 3.5).to(tl.int32)
    idx += (mag > 5.0).to(tl.int32)
    return idx


@triton.jit
def e2m1_encode(scaled):
    """E2M1 code (int32 0..15) of float32 `scaled`; the sign bit is the float's (so -0.0 gives code 8)."""
    sign = (scaled.to(tl.int32, bitcast=True) < 0).to(tl.int32) << 3
    return e2m1_index(tl.abs(scaled)) | sign


@triton.jit
def e2m1_code(scaled):
    """`e2m1_encode(scaled)` on the float's bits, ~12 instructions instead of ~20 compares and selects: with
    mag = min(|scaled|, 6), below 1 the index is round(2 mag) (ties to even), read off the bits of mag + 2**22
    (whose ulp is 0.5); from 1 up it is 2 * exponent + the first significand bit, rounded to nearest even
    on the bits (a carry into the exponent is the right result), minus 252 (1.0 -> 2, 6.0 -> 7). The sign
    bit is the float's. Same codes on every finite float32 and on +-Inf (tests/kernels/test_quantize_fast_div.py
    checks every float near each rounding boundary); NaN gives 7 or 15 (its block's scale is NaN)."""
    mag = tl.minimum(tl.abs(scaled), 6.0)
    small = (mag + 4194304.0).to(tl.int32, bitcast=True) - 0x4A800000
    bits = mag.to(tl.int32, bitcast=True)
    # (bits + round) >> 22 minus 252, with the 252 << 22 = 0x3F000000 taken off before the shift (exact: bits >=
    # 0x3F800000 here), one IADD3 with an immediate: ptxas made the after-shift subtraction an IMAD.HI against a
    # 64-bit constant pair, two register moves per element (sm_90, Triton 3.6)
    big = (bits + ((bits >> 22) & 1) + (0x1FFFFF - 0x3F000000)) >> 22
    idx = tl.where(mag < 1.0, small, big)
    return idx | ((scaled.to(tl.int32, bitcast=True) >> 28) & 8)


@triton.jit
def e2m1_round(scaled):
    """`e2m1_value(e2m1_encode(scaled))` (float32 -> the nearest E2M1 value, ties to even, saturating at 6,
    keeping the sign, so -0.0 and tiny negatives give -0.0) in ~8 instructions instead of ~20: below 1 the
    grid is multiples of 0.5, which (m + 2**22) - 2**22 rounds to (the ulp of 2**22 is 0.5); from 1 up it
    is one significand bit, rounded to nearest even on the float's bits (a carry into the exponent is the
    correct result). Identical on every float32 (tests/kernels/test_quantize.py checks every float near
    each rounding boundary; both sides are monotone step functions). NaN in, NaN or 6 out: only in blocks
    whose scale is NaN, which dequantize to NaN either way."""
    mag = tl.abs(scaled)
    small = (mag + 4194304.0) - 4194304.0
    bits = mag.to(tl.int32, bitcast=True)
    big = ((bits + 0x1FFFFF + ((bits >> 22) & 1)) & -4194304).to(tl.float32, bitcast=True)   # 0xFFC00000
    r = tl.where(mag < 1.0, small, tl.minimum(big, 6.0))
    sign = scaled.to(tl.int32, bitcast=True) & -2147483648                                   # 0x80000000
    return (r.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def div_rn_by_reciprocal(x, b):
    """x / b correctly rounded (= tl.math.div_rn) for b in [2**-80, 2**100], x finite, from y = RN(1/b)
    (one div_rn per block, broadcast): q1 = x*y + (x - b*(x*y))*y is within an ulp of x/b, and one more
    correction with the exact FMA residual r = x - b*q1 gives RN(x/b) (Markstein's theorem: y within half
    an ulp of 1/b and q1 within an ulp of x/b => RN(q1 + r*y) = RN(x/b); the residuals are exact FMAs since
    the range keeps them clear of underflow). The sign is x's (x = -0.0 would otherwise come back +0.0).
    4 FMA-pipe instructions per element instead of div_rn's MUFU.RCP + 5 FFMA + FCHK + branch."""
    return div_by_reciprocal(x, b, tl.math.div_rn(1.0, b))


@triton.jit
def div_by_reciprocal(x, b, y):
    """`div_rn_by_reciprocal` with y = RN(1/b) given (one per block). y = 0, b = 1 gives x * 0.0 (+-0 with x's
    sign; x finite): the quantizers' zero block step without a per-element select."""
    q0 = x * y
    q1 = tl.fma(tl.fma(-b, q0, x), y, q0)
    q2 = tl.fma(tl.fma(-b, q1, x), y, q1)
    sign = x.to(tl.int32, bitcast=True) & -2147483648
    return ((q2.to(tl.int32, bitcast=True) & 0x7FFFFFFF) | sign).to(tl.float32, bitcast=True)


@triton.jit
def fast_div_ok(amax):
    """True where `div_rn_by_reciprocal` may divide by the nvfp4 block scales of a global scale amax / 2688:
    amax 0 (every scale 1 x a zero block step) or in [2**-58, 2**99], so each nonzero block scale lies in
    [2**-80, 2**100] (>= 2**-9, the least E4M3, x amax / 2688; <= 448 x amax / 2688 = amax / 6)."""
    return (amax == 0) | ((amax >= 3.469446951953614e-18) & (amax <= 6.338253001141147e29))


@triton.jit
def e2m1_value(code):
    """float32 value of E2M1 codes (int32 0..15)."""
    idx = code & 7
    mag = tl.where(idx < 4, idx.to(tl.float32) * 0.5, tl.where(idx == 7, 6.0, (idx - 2).to(tl.float32)))
    return tl.where(code >= 8, -mag, mag)


@triton.jit
def e4m3_round(v):
    """Round float32 v in [0, 448] to E4M3 (nearest, ties to even). Returns (code int32 0..126, value f32).

    Normal range (v >= 2**-6): round the float32 significand to 3 bits on the integer bits (a carry into
    the exponent is the correct result). Subnormal range: the quantum is 2**-9, and (v + 2**14) - 2**14
    rounds v to it in one correctly rounded float32 add (the ulp of 2**14 is 2**-9)."""
    bits = v.to(tl.int32, bitcast=True)
    rounded = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576          # -1048576 == 0xFFF00000
    normal_code = (((rounded >> 23) - 120) << 3) | ((rounded >> 20) & 7)
    sub_value = (v + 16384.0) - 16384.0
    sub_code = (sub_value * 512.0).to(tl.int32)
    is_normal = v >= 0.015625
    code = tl.where(is_normal, normal_code, sub_code)
    value = tl.where(is_normal, rounded.to(tl.float32, bitcast=True), sub_value)
    return code, value


@triton.jit
def e4m3_to_float(code):
    """float32 value of E4M3 (fn) codes given as int32 0..255; 0x7F/0xFF are NaN.

    Normal codes: the exponent/mantissa bits shifted into float32's, exponent rebiased (+120). A
    subnormal m * 2**-9 is decoded as if its exponent field were 1, (1 + m/8) * 2**-6, minus 2**-6
    (exact): no int -> float conversion."""
    code = code.to(tl.int32)
    mag = code & 127
    sub = mag < 8
    value = (((mag | tl.where(sub, 8, 0)) << 20) + (120 << 23)).to(tl.float32, bitcast=True)
    value = tl.where(sub, value - 0.015625, value)
    value = tl.where(mag == 127, float("nan"), value)
    return tl.where(code >= 128, -value, value)


@triton.jit
def e8m0_to_float(code):
    """float32 value 2**(code - 127) of E8M0 codes (int32 0..255); 255 is NaN, 0 is 2**-127 (subnormal)."""
    code = code.to(tl.int32)
    value = tl.where(code == 0, 0x00400000, code << 23).to(tl.float32, bitcast=True)
    return tl.where(code == 255, float("nan"), value)


@triton.jit
def finite_abs(x):
    """(|x| with NaN/Inf as 0, the finite mask): amaxes skip non-finite elements (their block becomes NaN)."""
    xa = tl.abs(x)
    finite = xa < float("inf")  # False for NaN too
    return tl.where(finite, xa, 0.0), finite


@triton.jit
def e8m0_scale_code(block_amax):
    """MX block scale (biased E8M0 exponent) of a block whose finite amax is `block_amax` (float32):
    floor(log2(amax)) - 2 read off the float's exponent bits, 0 (2**-127) for a zero or subnormal amax."""
    biased = (block_amax.to(tl.int32, bitcast=True) >> 23) & 0xFF
    return tl.minimum(tl.maximum(biased - 2, 0), 254)


@triton.jit
def e8m0_inverse(code):
    """1 / 2**(code - 127) as float32 bits (exact, no division) for codes 0..253; 0.0 for code 254."""
    return ((254 - code) << 23).to(tl.float32, bitcast=True)


@triton.jit
def interleave8(v0, v1, v2, v3, v4, v5, v6, v7):
    """[R, C] x 8 -> [R, 8C] with out[r, 8c + k] = vk[r, c] (register-level joins, then a reshape)."""
    even = tl.join(tl.join(v0, v4), tl.join(v2, v6))
    odd = tl.join(tl.join(v1, v5), tl.join(v3, v7))
    full = tl.join(even, odd)
    return tl.reshape(full, [v0.shape[0], v0.shape[1] * 8])


@triton.jit
def bf16_halves(pair):
    """The two bf16 values packed in each int32 word (low half first)."""
    lo = (pair & 0xFFFF).to(tl.int16).to(tl.bfloat16, bitcast=True)
    hi = (pair >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
    return lo, hi


@triton.jit
def fp4x8_to_bf16(words, scale, MODE: tl.constexpr):
    """Dequantize packed E2M1: `words` int32 [R, C] holds 8 codes each (element 8c+k in bits 4k..4k+3,
    i.e. the little-endian view of the nibble-packed bytes); `scale` float32 [R, C] is each word's block
    scale (exactly representable in bf16). Returns bf16 [R, 8C] = code value * scale, exact."""
    if MODE == 0:
        v0 = (e2m1_value(words & 15) * scale).to(tl.bfloat16)
        v1 = (e2m1_value((words >> 4) & 15) * scale).to(tl.bfloat16)
        v2 = (e2m1_value((words >> 8) & 15) * scale).to(tl.bfloat16)
        v3 = (e2m1_value((words >> 12) & 15) * scale).to(tl.bfloat16)
        v4 = (e2m1_value((words >> 16) & 15) * scale).to(tl.bfloat16)
        v5 = (e2m1_value((words >> 20) & 15) * scale).to(tl.bfloat16)
        v6 = (e2m1_value((words >> 24) & 15) * scale).to(tl.bfloat16)
        v7 = (e2m1_value((words >> 28) & 15) * scale).to(tl.bfloat16)
    else:
        s16 = (scale.to(tl.int32, bitcast=True) >> 16) & 0xFFFF          # bf16 bits of the scale
        s2 = s16 | (s16 << 16)
        p0, p1, p2, p3 = tl.inline_asm_elementwise(
            FP4X8_ASM, "=r,=r,=r,=r,r,r", [words, s2], dtype=(tl.int32, tl.int32, tl.int32, tl.int32),
            is_pure=True, pack=1)
        v0, v1 = bf16_halves(p0)
        v2, v3 = bf16_halves(p1)
        v4, v5 = bf16_halves(p2)
        v6, v7 = bf16_halves(p3)
    return interleave8(v0, v1, v2, v3, v4, v5, v6, v7)


@triton.jit
def dot_acc(a, b, acc, IN_F32: tl.constexpr):
    """acc + a @ b. IN_F32 (set under the interpreter, whose bf16 `tl.dot` returns garbage in Triton 3.9)
    upcasts the bf16 operands first: same products (bf16 values are exact in float32)."""
    if IN_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc)
    return tl.dot(a, b, acc)


@triton.jit
def scale_per_word(sw, G: tl.constexpr, E8M0: tl.constexpr):
    """Block scales loaded as int32 words (4 scale bytes each, little-endian: the uint8 scale tensor
    viewed as int32, so the load is 16-byte wide and Triton pipelines it; byte loads were not, and
    stalled every K step) -> float32 scale of each packed code word (8 elements): [R, C] -> [R, C*G/2].
    Decoded once per scale, then repeated with register-level joins."""
    b0, b1, b2, b3 = sw & 0xFF, (sw >> 8) & 0xFF, (sw >> 16) & 0xFF, (sw >> 24) & 0xFF
    if E8M0:
        f0, f1, f2, f3 = e8m0_to_float(b0), e8m0_to_float(b1), e8m0_to_float(b2), e8m0_to_float(b3)
    else:
        f0, f1, f2, f3 = e4m3_to_float(b0), e4m3_to_float(b1), e4m3_to_float(b2), e4m3_to_float(b3)
    s = tl.reshape(tl.join(tl.join(f0, f2), tl.join(f1, f3)), [sw.shape[0], sw.shape[1] * 4])   # per scale
    s = tl.join(s, s)                                   # G = 16: 2 code words per scale
    if G == 32:
        s = tl.join(s, s)                               # G = 32: 4 code words per scale
    return tl.reshape(s, [sw.shape[0], sw.shape[1] * G // 2])
