"""The K / V tile decode of the Gluon FP4-KV paged decode attention (paged_attention_gluon_tiles.py's `_tile` runs
it, one 128-token tile per call; issue 15): one slot of the TMA ring (shared memory, written unswizzled) to the bf16
wgmma A operands, K [T, D] in MMA column order (`_k_decode`) and V^T [DV, T] in MMA row order (`_vt_decode`).
A thread loads its words (one LDS.128 for K), builds one bf16x2 scale pair per FP4 block from the scale bytes, and
turns 8 codes per word into 8 bf16 values with the shipped shift/mask PTX (kv_decode's; `_fp4_values`, `_join8`).

The constexpr MX picks how an mxfp4 E8M0 scale becomes a pair (nvfp4, MX 0: kv_decode's _NV_PAIRS): 1 exact,
through kv_decode's 2**125 bias multiply; 2 folded (MX_FOLD: the bias in the pair, exact for a scale window);
3 folded with a 2**5 offset and checked (MX_CHK: exact inside its window, loudly non-finite outside it, for the
launcher's exact REDO). The constants below state each fold's contract; the consumer applies their output factors
(MX_OUT, MX_CHK_OUT) and the window check's reduction.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from trace_rl.kernels.kv_decode import _BIAS_MX, _FP4_CODES, _NV_PAIRS, _SCALE_OUT

FP4_NV_ASM = gl.constexpr("{" + _FP4_CODES + _SCALE_OUT + "}")
FP4_MX_ASM = gl.constexpr("{" + _FP4_CODES + _BIAS_MX + _SCALE_OUT + "}")
# mxfp4 with the 2**125 bias folded (MX = 2, GluonAttentionConfig.mx_fold): the scale pair is 2**(e - 1 - MX_FOLD)
# (bf16 exponent field min(stored, MX_CLAMP) + MX_ADD, stored = e + 1), so one HMUL2 per pair of elements gives
# code x scale x 2**-MX_FOLD, and 2**MX_FOLD goes into the float32 score factor and the output. Exact for scales
# 2**-70 .. 2**63 (E8M0 codes 57..190): smaller blocks round towards zero in bf16 (|x| < 2**-67), larger ones give
# +-Inf; a NaN block (stored 255) still decodes to NaN (Inf x its zero codes).
MX_FOLD = 62
MX_CLAMP, MX_ADD, MX_OUT = gl.constexpr(192), gl.constexpr(63), gl.constexpr(2.0 ** MX_FOLD)
_MX_PAIRS = gl.constexpr("""{
    .reg .b32 a, b, c;
    mov.b32 c, 0x00C000C0;
    and.b32 a, $2, 0x00FF00FF;
    min.u16x2 a, a, c;
    mad.lo.u32 $0, a, 128, 0x1F801F80;
    shr.b32 b, $2, 8;
    and.b32 b, b, 0x00FF00FF;
    min.u16x2 b, b, c;
    mad.lo.u32 $1, b, 128, 0x1F801F80;
}""")                                                # (min(b, 192) + 63) << 7 per 16-bit half: 0x1F80 = 63 << 7
# mxfp4 checked (MX = 3, GluonAttentionConfig.mx_checked): the scale folded with an offset of 2**MX_CHK, so one HMUL2
# per pair gives code x scale x 2**-MX_CHK (2**MX_CHK goes into the float32 score factor and the output, as MX_FOLD
# does). The pair is 2**(stored - 7) (bf16 exponent field stored + MX_CHK_ADD), a code's bits are code x 2**-126, so
# their product is code x 2**(stored - 133) = code x scale x 2**-5: the exact kernel's element times 2**-5, exactly,
# for stored bytes MX_CHK_LO..134 (134 + 120 = 254, the largest finite exponent). The window's low end keeps every
# folded element far from the subnormals: the smallest nonzero one is 0.5 x 2**(MX_CHK_LO - 133) = 2**-70, so a
# product with a q element or a probability of magnitude >= 2**-51 is a normal float32 in both kernels (>= 2**-121,
# 2**5 above the float32 subnormals after the fold's 2**-5), and the scores and the output before their float32
# factors are the exact kernel's times 2**-5: bit-identical (probabilities below 2**-51 are flushed to 0 in every
# mxfp4 path, _tile; the residual condition, q elements below 2**-51, is in docs/kernels.md).
# In-window bytes 1..63 (scales 2**-127 .. 2**-65, which the writer gives only to blocks of
# amax < 2**-62, zero blocks included: stored 1) are out of the window here. Outside it the launch is made to fail
# loudly instead of rounding: a V pair clamps to +Inf (stored - MX_CHK_LO wraps below the window, so one signed 16-bit
# min clamps both ends: _MX_CHK_PAIRS), so its block's values are +-Inf / NaN and every output column of those head
# dims is non-finite (a token past the sequence has its V^T zeroed first); a K pair is not clamped (a wrong finite
# value, or +Inf, whose products could all share one sign and give a -Inf score: a token silently dropped), instead
# every thread keeps the largest stored - MX_CHK_LO (unsigned: a byte below the window wraps to ~2**32) of the K
# blocks it decoded (2 integer max per tile; tokens past the sequence count as in-window) and one reduction after the
# tile loop makes the row sums l NaN when any is >= 135 - MX_CHK_LO: the whole (sequence, kv head) output NaN.
# decode_attention_gluon then relaunches the exact kernel (MX = 1) over exactly the items whose output is not finite
# (REDO), which also keeps a NaN block (stored 255) NaN as the exact kernel makes it. Stored byte 0 (code 254, which
# no writer produces) is below the window, so it is caught too.
MX_CHK = 5
MX_CHK_LO_BYTE = 64           # the window's low end (stored byte; python int for the host-side tests)
MX_CHK_ADD, MX_CHK_TOP, MX_CHK_OUT = gl.constexpr(120), gl.constexpr(135), gl.constexpr(2.0 ** MX_CHK)
MX_CHK_LO = gl.constexpr(MX_CHK_LO_BYTE)
# per 16-bit half of a (bytes 0, 2 of the word; then 1, 3): x = b + 0x8000 - LO (no carry between halves) is, as a
# signed 16-bit value, -0x8000 + (b - LO) inside and above the window and positive below it, so min.s16x2 with
# 0x8000 + 135 - LO clamps both ends to 135 - LO; then (x - 0x8000 + LO + 120) << 7 per half is one mad: the low
# half's 0x8000 << 7 spills into the high half (0x00400000, taken out of the constant), the high half's out of the
# word (mod 2**32), and the packed result is exact because each half's exponent field (<= 255) fits
_MX_CHK_PAIRS = gl.constexpr(f"""{{
    .reg .b32 a, b, c, d;
    mov.b32 c, {(0x8000 + 135 - MX_CHK_LO_BYTE) * 0x00010001:#010x};
    mov.b32 d, 0;
    prmt.b32 a, $2, d, 0x4240;
    add.u32 a, a, {(0x8000 - MX_CHK_LO_BYTE) * 0x00010001:#010x};
    min.s16x2 a, a, c;
    mad.lo.u32 $0, a, 128, {(((MX_CHK_LO_BYTE + 120 - 0x8000) * 128 * 0x00010001) % 2**32):#010x};
    prmt.b32 b, $2, d, 0x4341;
    add.u32 b, b, {(0x8000 - MX_CHK_LO_BYTE) * 0x00010001:#010x};
    min.s16x2 b, b, c;
    mad.lo.u32 $1, b, 128, {(((MX_CHK_LO_BYTE + 120 - 0x8000) * 128 * 0x00010001) % 2**32):#010x};
}}""")                # (clamp(b) + 120) << 7 per 16-bit half; +Inf (255 << 7) for b < LO or b >= 135



@gluon.jit
def _fp4_values(x, pair, MX: gl.constexpr):
    """8 bf16 values per word (slot 0 lo, slot 0 hi, .., slot 3 hi): nvfp4 code x scale / 2**7
    (kv_decode.FP4_NV_ASM); mxfp4 (MX 1) code x scale, through the 2**125 bias multiply (kv_decode.FP4_MX_ASM:
    E8M0's whole range does not fit one bf16 factor); MX 2: code x scale x 2**-MX_FOLD, the bias in the pair."""
    if MX == 1:
        v = gl.inline_asm_elementwise(FP4_MX_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [x, pair],
                                      dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    else:
        v = gl.inline_asm_elementwise(FP4_NV_ASM, "=h,=h,=h,=h,=h,=h,=h,=h,r,r", [x, pair],
                                      dtype=(gl.bfloat16,) * 8, is_pure=True, pack=1)
    return v


@gluon.jit
def _join8(x, pair, MX: gl.constexpr):
    """The 8 values of each word joined as three trailing dims [.., half, i & 1, i >> 1] (attention_tiles._k_fp4's
    joins: a join's new dim is minor, so the outer join's selector comes last)."""
    o0l, o0h, o1l, o1h, o2l, o2h, o3l, o3h = _fp4_values(x, pair, MX)
    return gl.join(gl.join(gl.join(o0l, o0h), gl.join(o1l, o1h)), gl.join(gl.join(o2l, o2h), gl.join(o3l, o3h)))


@gluon.constexpr_function
def _ks_layout(nw):
    """K scales [T/16, g, tq] (16-bit halves, mxfp4; words, nvfp4): the rows of warp w's MMA fragment in warp w."""
    return gl.BlockedLayout([1, 1, 1], [1, 8, 4], [nw, 1, 1], [2, 1, 0])


@gluon.jit
def _k_decode(kw_s, ksw_s, live, A_LAYOUT: gl.constexpr, T: gl.constexpr, D: gl.constexpr, NW: gl.constexpr,
              MX: gl.constexpr, MASKED: gl.constexpr):
    """K [T, D] in MMA column order from the slot's words [T/16, hr, g, tq, jw] (row 16 n16 + 8 hr + g, word
    tq D/32 + jw: a thread's four words are one LDS.128) and scales [T/16, g, tq]: nvfp4 words, the bytes
    (block 2tq, hr), (2tq+1, hr) of rows g, g + 8 (kv_layout's [rg, g, block, hr] with 8 blocks); mxfp4 16-bit
    halves, the bytes (block tq, hr) (4 blocks: a thread's row is one block, so both halves of its pair are it).
    MX 3 also returns the largest stored byte - MX_CHK_LO (unsigned) of the thread's blocks; MASKED: of its rows
    < live (the tile's tokens in the sequence), a stale row counting as 0 (it is masked out of the scores)."""
    KW: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, D // 32], [1, 1, 8, 4, 1], [NW, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    KS: gl.constexpr = _ks_layout(NW)
    w = gl.permute(kw_s.load(KW), (0, 2, 3, 4, 1))                       # [T/16, g, tq, jw, hr]
    if MX == 1:       # bf16x2 (2**(e-126), 2**(e-126)) = stored byte << 7 in each half (kv_decode.fp4_scale_pair)
        hw = ksw_s.load(KS).to(gl.int32) & 0xFFFF
        p02 = (hw & 255) * 0x00800080
        p13 = (hw >> 8) * 0x00800080
    elif MX == 2:     # the same with the exponent field min(stored, MX_CLAMP) + MX_ADD
        hw = ksw_s.load(KS).to(gl.int32) & 0xFFFF
        p02 = (gl.minimum(hw & 255, MX_CLAMP) + MX_ADD) * 0x00800080
        p13 = (gl.minimum(hw >> 8, MX_CLAMP) + MX_ADD) * 0x00800080
    elif MX == 3:     # checked: the exponent field stored + MX_CHK_ADD (garbage past the window: flagged below)
        hw = ksw_s.load(KS).to(gl.int32) & 0xFFFF
        lo = (hw & 255) - MX_CHK_LO                                      # stored - LO: < 0 below the window
        hi = (hw >> 8) - MX_CHK_LO
        p02 = lo * 0x00800080 + (MX_CHK_ADD + MX_CHK_LO) * 0x00800080
        p13 = hi * 0x00800080 + (MX_CHK_ADD + MX_CHK_LO) * 0x00800080
    else:
        p02, p13 = gl.inline_asm_elementwise(_NV_PAIRS, "=r,=r,r", [ksw_s.load(KS)], dtype=(gl.int32, gl.int32),
                                             is_pure=True, pack=1)
    pair = gl.reshape(gl.join(p02, p13), [T // 16, 8, 4, 1, 2])          # [T/16, g, tq, -, hr]
    pair = gl.convert_layout(pair, w.type.layout, assert_trivial=True)
    pair = gl.broadcast(pair, w)[0]
    y = _join8(w, pair, MX)                      # n16 0, g 1, tq 2, jw 3, hr 4, half 5, b 6 (i&1), a 7 (i>>1)
    # row 16 n16 + 8 hr + g; column 32 jw + 16 a + 8 b + 2 tq + half (attention_tiles._k_fp4's permutation)
    y = gl.permute(y, (0, 4, 1, 3, 7, 6, 2, 5))
    k = gl.convert_layout(gl.reshape(y, [T, D]), A_LAYOUT, assert_trivial=True)
    kb = 0
    if MX == 3:       # and the largest stored byte - LO of the thread's blocks, unsigned (the caller's window check)
        lo = lo.to(gl.uint32, bitcast=True)
        hi = hi.to(gl.uint32, bitcast=True)
        if MASKED:    # rows 16 rg + g (lo) and 16 rg + 8 + g (hi): a stale row (a fresh page's byte 0) is no redo
            rg = gl.arange(0, T // 16, layout=gl.SliceLayout(1, gl.SliceLayout(2, KS)))
            g = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(2, KS)))
            row = gl.expand_dims(gl.expand_dims(16 * rg, 1) + gl.expand_dims(g, 0), 2)
            lo = gl.where(row < live, lo, 0)
            hi = gl.where(row + 8 < live, hi, 0)
        kb = gl.maximum(lo, hi)
    return k, kb


@gluon.jit
def _vt_decode(vw_s, vsw_s, A_LAYOUT: gl.constexpr, NP: gl.constexpr, DV: gl.constexpr, T: gl.constexpr,
               NW: gl.constexpr, MX: gl.constexpr):
    """V^T [DV, T] in MMA row order from the slot's words [p, kth, w, gh, gl, tq, kl, h] (kv_layout's V word order
    [kt_hi, w, g, tq, kt_lo, h] per page, g = 4 gh + gl) and scale words, the bytes of tokens t, t+8, t+1, t+9:
    nvfp4 [p, w, gh, tq, kth, kl] (block 2 w + gh: every lane group of four (gl) shares its block's word), mxfp4
    [p, w, tq, kth, kl] (block w: both lane groups of eight (gh, gl) share it)."""
    VW: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 1, 1, 2, 2], [1, 1, 1, 2, 4, 4, 1, 1], [1, 1, NW, 1, 1, 1, 1, 1],
                                        [7, 6, 5, 4, 3, 2, 1, 0])
    w = vw_s.load(VW)
    if MX:
        # lanes: tq (bits 0-1), gl and gh (bits 2-4, broadcast); warps: w; registers: kl, kth, p
        VSX: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 0, 0, 1], [0, 0, 0, 1, 0], [1, 0, 0, 0, 0]],
            lane_bases=[[0, 0, 1, 0, 0], [0, 0, 2, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]],
            warp_bases=[[0, 1, 0, 0, 0], [0, 2, 0, 0, 0]], block_bases=[], shape=[NP, 4, 4, 2, 2])
        sw = vsw_s.load(VSX)
        if MX == 2:
            p02, p13 = gl.inline_asm_elementwise(_MX_PAIRS, "=r,=r,r", [sw], dtype=(gl.int32, gl.int32),
                                                 is_pure=True, pack=1)
        elif MX == 3:
            p02, p13 = gl.inline_asm_elementwise(_MX_CHK_PAIRS, "=r,=r,r", [sw], dtype=(gl.int32, gl.int32),
                                                 is_pure=True, pack=1)
        else:
            p02 = (sw << 7) & 0x7F807F80                                 # bytes 0, 2 -> (b0 << 7, b2 << 7)
            p13 = (sw >> 1) & 0x7F807F80                                 # bytes 1, 3
        pair = gl.permute(gl.join(p02, p13), (0, 3, 1, 2, 4, 5))        # [p, kth, w, tq, kl, h]
        pair = gl.reshape(pair, [NP, 2, 4, 1, 1, 4, 2, 2])
    else:
        # lanes: tq (bits 0-1), gl (bits 2-3, broadcast), gh (bit 4); warps: w; registers: kl, kth, p
        VS: gl.constexpr = gl.DistributedLinearLayout(
            reg_bases=[[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 1, 0], [1, 0, 0, 0, 0, 0]],
            lane_bases=[[0, 0, 0, 1, 0, 0], [0, 0, 0, 2, 0, 0], [0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0],
                        [0, 0, 1, 0, 0, 0]],
            warp_bases=[[0, 1, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0]], block_bases=[], shape=[NP, 4, 2, 4, 2, 2])
        p02, p13 = gl.inline_asm_elementwise(_NV_PAIRS, "=r,=r,r", [vsw_s.load(VS)], dtype=(gl.int32, gl.int32),
                                             is_pure=True, pack=1)
        pair = gl.permute(gl.join(p02, p13), (0, 4, 1, 2, 3, 5, 6))     # [p, kth, w, gh, tq, kl, h]
        pair = gl.reshape(pair, [NP, 2, 4, 2, 1, 4, 2, 2])
    pair = gl.convert_layout(pair, VW, assert_trivial=True)
    pair = gl.broadcast(pair, w)[0]
    y = _join8(w, pair, MX)      # p 0, kth 1, w 2, gh 3, gl 4, tq 5, kl 6, h 7, half 8, a 9 (i&1), mt 10 (i>>1)
    # rows 64 mt + 16 w + 8 a + g, columns 64 p + 32 kth + 16 kl + 8 h + 2 tq + half (attention_tiles._vt_fp4)
    y = gl.permute(y, (10, 2, 9, 3, 4, 0, 1, 6, 7, 5, 8))
    return gl.convert_layout(gl.reshape(y, [DV, T]), A_LAYOUT, assert_trivial=True)
