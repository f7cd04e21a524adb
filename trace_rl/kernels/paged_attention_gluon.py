"""Opt-in Gluon (Triton 3.6 `triton.experimental.gluon`) warp-specialised FP4-KV paged decode attention (issue 15).

Computes what `paged_attention.decode_attention` computes over an nvfp4 or mxfp4 cache (same write-time layout,
trace_rl/formats/kv_layout.py; same orientation: S^T = K q^T and O^T = V^T P^T with the tokens / head dims as the
MMA's M, K and V^T decoded in registers as the wgmma A operand, per-token float32 factors on the scores and the
probabilities), organised against what bounds the shipped kernel (docs/benchmarks.md, "What bounds FP4": one
partition that decodes K, waits for its HGMMAs, reduces, decodes V, waits again):

- a producer partition (1 warp, 24 registers) copies each 128-token tile's pages (K codes, K scales, V codes,
  V scales, the two per-token factor rows: each a contiguous (page, kv head) block) with one TMA box per page and
  tensor into a STAGES-deep shared ring (`ready` mbarrier with expect-tx per slot, `empty` released by the
  consumer). Hopper's TMA has no gather; the page table is read by the producer (pages past the sequence read
  page 0, as the shipped kernel does);
- the default partition (one warpgroup) per tile: waits on `ready`, decodes K (LDS.128 of a thread's fragment,
  the shipped shift/mask PTX) while the previous tile's PV wgmma is still in flight, retires that PV, issues
  S^T = K q^T async, decodes V^T, releases the slot, waits, runs the online softmax (on the low half of the padded
  columns when the group fits), stores P^T (bf16, the only tile that goes through shared memory) and issues the PV
  wgmma async, leaving it in flight under the next tile's K decode. ptxas moves part of that decode below the
  wgmma waits (the V^T decode after the QK wait: see the gate notes at the end), so within a warpgroup the overlap
  is partial; 2 CTAs per SM (maxnreg 128, the consumer at ~195 of 232 registers) interleave with each other.

One split per (kv head, sequence) program (no split-KV): the first version targets B x kv heads >= ~2 per SM
(B = 32 / 256 x 8 kv heads: 256 / 2048 programs against 132 SMs x 2 resident CTAs). Scope: nvfp4 or mxfp4 (one
kernel, the constexpr MX: mxfp4's scales are 32-element E8M0 blocks, whose 2**125 code bias is multiplied as the
shipped kernel does (the default, exact) or, opt-in mx_fold=True, folded into the scale pairs (MX_FOLD, below: exact
only for scales 2**-70 .. 2**63), and
it has no per-token factors, so its producer copies four boxes per page, not six), head_dim 128, pages of 64 tokens
(128-token tiles = 2 pages), GQA group <= 16 (the query heads of a kv head padded to the MMA's N = 16);
`decode_attention_gluon` refuses other shapes with a message. Gluon has no interpreter: this runs only on an sm_90
GPU; `sass_gate_cases` compiles it for sm_90 on any machine.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from trace_rl.formats import kv_layout as L
from trace_rl.kernels.attention_tiles import _low_half
from trace_rl.kernels.kv_decode import _BIAS_MX, _FP4_CODES, _NV_PAIRS, _SCALE_OUT

FP4_NV_ASM = gl.constexpr("{" + _FP4_CODES + _SCALE_OUT + "}")
FP4_MX_ASM = gl.constexpr("{" + _FP4_CODES + _BIAS_MX + _SCALE_OUT + "}")
FORMATS = {"nvfp4:row": 0, "mxfp4": 1}               # PagedKV.fmt -> the MX constexpr (2: mxfp4 with MX_FOLD)
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
LOG2E = 1.4426950408889634
HEAD_DIM, PAGE, BLOCK_T, N_PAD = 128, 64, 128, 16


@gluon.jit
def _producer(kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
              ready, empty, bt_row, h, seq_len, n_tiles, HKV: gl.constexpr, NP: gl.constexpr,
              PAGE: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr):
    """1 warp: one (kv head, sequence)'s tiles, ring positions 0 .. n_tiles - 1."""
    _produce_tiles(0, kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
                   ready, empty, bt_row, h, seq_len, n_tiles, HKV, NP, PAGE, STAGES, MX)


@gluon.jit
def _produce_tiles(j0, kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
                   ready, empty, bt_row, h, seq_len, n_tiles, HKV: gl.constexpr, NP: gl.constexpr,
                   PAGE: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr):
    """Tile it's NP pages (six TMA boxes each: one (page, kv head) block per tensor; four for mxfp4, which has no
    per-token factors) into ring position j0 + it (slot (j0 + it) % STAGES; j0 > 0 when a persistent program has
    already streamed other work items' tiles through the ring)."""
    if MX:
        nbytes: gl.constexpr = NP * (kc_desc.block_type.nbytes + ks_desc.block_type.nbytes
                                     + vc_desc.block_type.nbytes + vs_desc.block_type.nbytes)
    else:
        nbytes: gl.constexpr = NP * (kc_desc.block_type.nbytes + ks_desc.block_type.nbytes
                                     + kg_desc.block_type.nbytes + vc_desc.block_type.nbytes
                                     + vs_desc.block_type.nbytes + vg_desc.block_type.nbytes)
    for it in range(n_tiles):
        j = j0 + it
        slot = j % STAGES
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)     # a fresh barrier passes the first round
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        for p in gl.static_range(NP):
            col = it * NP + p
            pg = gl.load(bt_row + col, mask=col * PAGE < seq_len, other=0)    # stale entries: page 0
            blk = pg * HKV + h
            i = slot * NP + p
            tma.async_copy_global_to_shared(kc_desc, [blk, 0, 0], bar, kc_b.index(i))
            tma.async_copy_global_to_shared(ks_desc, [blk, 0, 0], bar, ks_b.index(i))
            tma.async_copy_global_to_shared(vc_desc, [blk, 0, 0], bar, vc_b.index(i))
            tma.async_copy_global_to_shared(vs_desc, [blk, 0, 0], bar, vs_b.index(i))
            if not MX:
                tma.async_copy_global_to_shared(kg_desc, [blk, 0, 0], bar, kg_b.index(i))
                tma.async_copy_global_to_shared(vg_desc, [blk, 0, 0], bar, vg_b.index(i))


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


@gluon.jit
def _k_decode(kw_s, ksw_s, A_LAYOUT: gl.constexpr, T: gl.constexpr, D: gl.constexpr, NW: gl.constexpr,
              MX: gl.constexpr):
    """K [T, D] in MMA column order from the slot's words [T/16, hr, g, tq, jw] (row 16 n16 + 8 hr + g, word
    tq D/32 + jw: a thread's four words are one LDS.128) and scales [T/16, g, tq]: nvfp4 words, the bytes
    (block 2tq, hr), (2tq+1, hr) of rows g, g + 8 (kv_layout's [rg, g, block, hr] with 8 blocks); mxfp4 16-bit
    halves, the bytes (block tq, hr) (4 blocks: a thread's row is one block, so both halves of its pair are it)."""
    KW: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, D // 32], [1, 1, 8, 4, 1], [NW, 1, 1, 1, 1], [4, 3, 2, 1, 0])
    KS: gl.constexpr = gl.BlockedLayout([1, 1, 1], [1, 8, 4], [NW, 1, 1], [2, 1, 0])
    w = gl.permute(kw_s.load(KW), (0, 2, 3, 4, 1))                       # [T/16, g, tq, jw, hr]
    if MX == 1:       # bf16x2 (2**(e-126), 2**(e-126)) = stored byte << 7 in each half (kv_decode.fp4_scale_pair)
        hw = ksw_s.load(KS).to(gl.int32) & 0xFFFF
        p02 = (hw & 255) * 0x00800080
        p13 = (hw >> 8) * 0x00800080
    elif MX == 2:     # the same with the exponent field min(stored, MX_CLAMP) + MX_ADD
        hw = ksw_s.load(KS).to(gl.int32) & 0xFFFF
        p02 = (gl.minimum(hw & 255, MX_CLAMP) + MX_ADD) * 0x00800080
        p13 = (gl.minimum(hw >> 8, MX_CLAMP) + MX_ADD) * 0x00800080
    else:
        p02, p13 = gl.inline_asm_elementwise(_NV_PAIRS, "=r,=r,r", [ksw_s.load(KS)], dtype=(gl.int32, gl.int32),
                                             is_pure=True, pack=1)
    pair = gl.reshape(gl.join(p02, p13), [T // 16, 8, 4, 1, 2])          # [T/16, g, tq, -, hr]
    pair = gl.convert_layout(pair, w.type.layout, assert_trivial=True)
    pair = gl.broadcast(pair, w)[0]
    y = _join8(w, pair, MX)                      # n16 0, g 1, tq 2, jw 3, hr 4, half 5, b 6 (i&1), a 7 (i>>1)
    # row 16 n16 + 8 hr + g; column 32 jw + 16 a + 8 b + 2 tq + half (attention_tiles._k_fp4's permutation)
    y = gl.permute(y, (0, 4, 1, 3, 7, 6, 2, 5))
    return gl.convert_layout(gl.reshape(y, [T, D]), A_LAYOUT, assert_trivial=True)


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


@gluon.jit
def _pad_half(x, fill: gl.constexpr):
    """[R, N/2] -> [R, N], the upper columns `fill` (attention_tiles._pad_half, whose tl.full takes no layout,
    cannot serve: Gluon's full needs x's)."""
    R: gl.constexpr = x.shape[0]
    NH: gl.constexpr = x.shape[1]
    return gl.reshape(gl.permute(gl.join(x, gl.full([R, NH], fill, x.dtype, x.type.layout)), (0, 2, 1)), [R, 2 * NH])


@gluon.jit
def _tile(j, it, m_i, l_acc, acc, vt_prev, q_b, p_s, kc_r, ks_r, kg_r, vc_r, vs_r, vg_r, ready, empty, seq_len, qk_scale,
          N: gl.constexpr, T: gl.constexpr, D: gl.constexpr, DV: gl.constexpr, NP: gl.constexpr,
          STAGES: gl.constexpr, MASKED: gl.constexpr, HALF: gl.constexpr, MX: gl.constexpr):
    """Tile `it` of the sequence, at ring position j: online-softmax update of (m_i [NS], l_acc [T, NS], acc [DV, N]);
    NS = N / 2 when HALF (the group fits the low half of the padded columns), else N. MX (mxfp4): no per-token
    factors (decoded elements are the values)."""
    NW: gl.constexpr = gl.num_warps()
    s_mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, N, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_mma, k_width=2)
    ROWS: gl.constexpr = gl.SliceLayout(1, s_mma)
    slot = j % STAGES
    mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
    # K decode runs while the previous tile's PV wgmma (holding vt_prev) is in flight
    k = _k_decode(kc_r.index(slot), ks_r.index(slot), A_LAYOUT, T, D, NW, MX)
    # retire the previous PV wgmma (it ran under the K decode): its V^T registers are free for this tile's V^T,
    # decoded under the QK wgmma (holding both would need ~250 registers: spills). Retiring it after the QK issue
    # with wait(1) instead makes ptxas serialise every wgmma (C7514).
    acc, vt_prev = warpgroup_mma_wait(num_outstanding=0, deps=(acc, vt_prev))
    s_tok = warpgroup_mma(k, q_b, gl.zeros([T, N], gl.float32, s_mma), is_async=True)
    vt = _vt_decode(vc_r.index(slot), vs_r.index(slot), A_LAYOUT, NP, DV, T, NW, MX)
    if not MX:
        fk = kg_r.index(slot).load(ROWS)
        fv = vg_r.index(slot).load(ROWS)
    fence_async_shared()
    mbarrier.arrive(empty.index(slot), count=1)                   # every word of the slot is in registers
    s, k = warpgroup_mma_wait(num_outstanding=0, deps=(s_tok, k))
    if HALF:
        s = _low_half(s)
        if not MX:
            S_ROWS: gl.constexpr = gl.SliceLayout(1, s.type.layout)
            fk = gl.convert_layout(fk, S_ROWS)
            fv = gl.convert_layout(fv, S_ROWS)
    if MASKED:        # tokens past the sequence: score -inf, factors 0, values 0 (a stale page may hold NaN)
        t = it * T + gl.arange(0, T, layout=gl.SliceLayout(1, s.type.layout))
        if not MX:
            fk = gl.where(t < seq_len, fk, 0.0)
            fv = gl.where(t < seq_len, fv, 0.0)
        cols = it * T + gl.arange(0, T, layout=gl.SliceLayout(0, A_LAYOUT))
        vt = gl.where(gl.expand_dims(cols < seq_len, 0), vt, gl.zeros_like(vt))
    if MX:
        s = s * qk_scale
    else:
        s = s * gl.expand_dims(fk * qk_scale, 1)
    if MASKED:
        s = gl.where(gl.expand_dims(t < seq_len, 1), s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, axis=0))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - gl.expand_dims(m_new, 0))
    l_acc = l_acc * gl.expand_dims(alpha, 0) + p
    if not MX:
        p = p * gl.expand_dims(fv, 1)
    if HALF:          # P^T's upper columns are 0, so are O^T's: scale the low half, pad with zeros
        acc = _low_half(acc)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(0, acc.type.layout)), 0)
        acc = gl.convert_layout(_pad_half(acc, 0.0), s_mma, assert_trivial=True)
        p = gl.convert_layout(_pad_half(p, 0.0), s_mma, assert_trivial=True)
    else:
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(0, acc.type.layout)), 0)
    p_s.store(p.to(gl.bfloat16))
    fence_async_shared()
    acc = warpgroup_mma(vt, p_s, acc, is_async=True)
    acc, vt = warpgroup_mma_wait(num_outstanding=1, deps=(acc, vt))     # returns at once: PV stays in flight
    return m_new, l_acc, acc, vt


@gluon.constexpr_function
def _plain(rank):
    return gl.SwizzledSharedLayout(1, 1, 1, list(range(rank - 1, -1, -1)))


@gluon.jit
def _load_q(q_ptr, b, h, stride_qb, stride_qh, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr):
    """q^T of kv head h's query heads in K's column order (kv_layout.k_dim_of_col), [N, D] (rows >= GROUP zero)."""
    NW: gl.constexpr = gl.num_warps()
    QL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    n = gl.arange(0, N, layout=gl.SliceLayout(1, QL))
    c = gl.arange(0, D, layout=gl.SliceLayout(0, QL))
    dim = (D // 4) * ((c >> 1) & 3) + (D // 8) * (c & 1) + 2 * (c >> 4) + ((c >> 3) & 1)
    q_rows = q_ptr + b.to(gl.int64) * stride_qb + gl.expand_dims(h * GROUP + n, 1) * stride_qh
    return gl.load(q_rows + gl.expand_dims(dim, 0), mask=gl.expand_dims(n < GROUP, 1), other=0.0)


@gluon.jit
def _consume_tiles(j0, seq_len, n_tiles, qk_scale, q_s, p_s, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, ready, empty,
                   GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr, DV: gl.constexpr, T: gl.constexpr,
                   NP: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr):
    """One (kv head, sequence)'s n_tiles tiles at ring positions j0 .. j0 + n_tiles - 1 against q^T in q_s: returns
    (O^T [DV, N] unnormalised, m, l) with every wgmma retired (q_s and p_s free again)."""
    NW: gl.constexpr = gl.num_warps()
    s_mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, N, 16])
    o_mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, N, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_mma, k_width=2)
    q_b = q_s.permute((1, 0))                                              # [D, N]
    # plain views of the TMA ring (written unswizzled), one slot's tile per leading index
    # (a shared layout describes the trailing dims; the leading one indexes slots)
    kc_r = kc_b._reinterpret(gl.int32, [STAGES, T // 16, 2, 8, 4, D // 32], _plain(5))
    vc_r = vc_b._reinterpret(gl.int32, [STAGES, NP, 2, 4, 2, 4, 4, 2, 2], _plain(8))
    if MX:            # K scales as 16-bit halves [rg, g, block] (bytes hr 0, 1), V scale words [p, w, tq, kth, kl]
        ks_r = ks_b._reinterpret(gl.int16, [STAGES, T // 16, 8, 4], _plain(3))
        vs_r = vs_b._reinterpret(gl.int32, [STAGES, NP, 4, 4, 2, 2], _plain(5))
        kg_r = ks_r   # no per-token factors: never read
        vg_r = vs_r
    else:
        ks_r = ks_b._reinterpret(gl.int32, [STAGES, T // 16, 8, 4], _plain(3))
        vs_r = vs_b._reinterpret(gl.int32, [STAGES, NP, 4, 2, 4, 2, 2], _plain(6))
        kg_r = kg_b._reinterpret(gl.float32, [STAGES, T], _plain(1))
        vg_r = vg_b._reinterpret(gl.float32, [STAGES, T], _plain(1))
    HALF: gl.constexpr = GROUP <= N // 2
    l_acc = gl.zeros([T, N], gl.float32, s_mma)
    if HALF:
        l_acc = _low_half(l_acc)
    m_i = gl.full([l_acc.shape[1]], float("-inf"), gl.float32, gl.SliceLayout(0, l_acc.type.layout))
    acc = gl.zeros([DV, N], gl.float32, o_mma)
    vt = gl.zeros([DV, T], gl.bfloat16, A_LAYOUT)
    n_full = seq_len // T
    for it in range(n_full):
        m_i, l_acc, acc, vt = _tile(j0 + it, it, m_i, l_acc, acc, vt, q_b, p_s, kc_r, ks_r, kg_r, vc_r, vs_r, vg_r,
                                    ready, empty, seq_len, qk_scale, N, T, D, DV, NP, STAGES, False, HALF, MX)
    if n_full < n_tiles:
        m_i, l_acc, acc, vt = _tile(j0 + n_full, n_full, m_i, l_acc, acc, vt, q_b, p_s, kc_r, ks_r, kg_r, vc_r, vs_r,
                                    vg_r, ready, empty, seq_len, qk_scale, N, T, D, DV, NP, STAGES, True, HALF, MX)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, m_i, gl.sum(l_acc, axis=0))


@gluon.jit
def _consumer(q_ptr, b, h, seq_len, n_tiles, qk_scale, stride_qb, stride_qh, q_s, p_s, kc_b, ks_b, kg_b, vc_b,
              vs_b, vg_b, ready, empty, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr, DV: gl.constexpr,
              T: gl.constexpr, NP: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr):
    q = _load_q(q_ptr, b, h, stride_qb, stride_qh, GROUP, N, D)
    q_s.store(q.to(gl.bfloat16))
    fence_async_shared()
    return _consume_tiles(0, seq_len, n_tiles, qk_scale, q_s, p_s, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, ready, empty,
                          GROUP, N, D, DV, T, NP, STAGES, MX)


@gluon.jit
def _epilogue(acc, l_i, out_ptr, b, h, stride_ob, stride_oh, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
              DV: gl.constexpr, MX: gl.constexpr):
    """out[b, h's query heads] = O^T / l. nvfp4 V elements decode to code x scale / 2**7 (mxfp4: code x scale); rows
    in V^T's MMA order (kv_layout.v_dim_of_row); a sequence of length 0 (l = 0) gives zeros."""
    if GROUP <= N // 2:
        acc = _low_half(acc)
    layout: gl.constexpr = acc.type.layout
    l_i = gl.convert_layout(l_i, gl.SliceLayout(0, layout))
    if MX == 1:
        o = gl.where(gl.expand_dims(l_i, 0) == 0, 0.0, acc / gl.expand_dims(l_i, 0))
    elif MX == 2:
        o = gl.where(gl.expand_dims(l_i, 0) == 0, 0.0, acc * MX_OUT / gl.expand_dims(l_i, 0))
    else:
        o = gl.where(gl.expand_dims(l_i, 0) == 0, 0.0, acc * 128.0 / gl.expand_dims(l_i, 0))
    rho = gl.arange(0, DV, layout=gl.SliceLayout(1, layout))
    n = gl.arange(0, acc.shape[1], layout=gl.SliceLayout(0, layout))
    g, hr, w, mt = rho & 7, (rho >> 3) & 1, (rho >> 4) & 3, rho >> 6
    out_dim = 16 * (2 * w + (g >> 2)) + 4 * (g & 3) + 2 * (mt & 1) + hr + 128 * (mt >> 1)
    keep = gl.expand_dims(out_dim < D, 1) & gl.expand_dims(n < GROUP, 0)
    o_ptr = out_ptr + b.to(gl.int64) * stride_ob + gl.expand_dims(h * GROUP + n, 0) * stride_oh \
        + gl.expand_dims(out_dim, 1)
    gl.store(o_ptr, o.to(out_ptr.dtype.element_ty), mask=keep)


@gluon.jit
def _ring(kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, N: gl.constexpr, D: gl.constexpr, T: gl.constexpr,
          PAGE: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr):
    """The shared memory of one program: the STAGES-slot TMA ring (NP pages per slot per tensor), q^T, P^T and the
    ready / empty barriers (initialised)."""
    NP: gl.constexpr = T // PAGE
    kc_b = gl.allocate_shared_memory(gl.int32, [STAGES * NP] + kc_desc.block_type.shape, kc_desc.layout)
    ks_b = gl.allocate_shared_memory(gl.int32, [STAGES * NP] + ks_desc.block_type.shape, ks_desc.layout)
    vc_b = gl.allocate_shared_memory(gl.int32, [STAGES * NP] + vc_desc.block_type.shape, vc_desc.layout)
    vs_b = gl.allocate_shared_memory(gl.int32, [STAGES * NP] + vs_desc.block_type.shape, vs_desc.layout)
    if MX:            # mxfp4 has no per-token factors: kg_desc / vg_desc are placeholders, never loaded
        kg_b = ks_b
        vg_b = vs_b
    else:
        kg_b = gl.allocate_shared_memory(gl.float32, [STAGES * NP] + kg_desc.block_type.shape, kg_desc.layout)
        vg_b = gl.allocate_shared_memory(gl.float32, [STAGES * NP] + vg_desc.block_type.shape, vg_desc.layout)
    q_s = gl.allocate_shared_memory(gl.bfloat16, [N, D], gl.NVMMASharedLayout.get_default_for([N, D], gl.bfloat16))
    p_s = gl.allocate_shared_memory(gl.bfloat16, [T, N], gl.NVMMASharedLayout.get_default_for([T, N], gl.bfloat16))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, q_s, p_s, ready, empty


@gluon.jit
def _decode_attention_ws_kernel(q_ptr, out_ptr, bt_ptr, lens_ptr, kc_desc, ks_desc, kg_desc, vc_desc, vs_desc,
                                vg_desc, qk_scale, stride_qb, stride_qh, stride_ob, stride_oh, stride_bt,
                                HKV: gl.constexpr, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
                                DV: gl.constexpr, PAGE: gl.constexpr, T: gl.constexpr, STAGES: gl.constexpr,
                                MX: gl.constexpr):
    h = gl.program_id(0)
    b = gl.program_id(1)
    seq_len = gl.load(lens_ptr + b)
    n_tiles = gl.cdiv(seq_len, T)
    NP: gl.constexpr = T // PAGE
    kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, q_s, p_s, ready, empty = _ring(kc_desc, ks_desc, kg_desc, vc_desc, vs_desc,
                                                                       vg_desc, N, D, T, PAGE, STAGES, MX)
    bt_row = bt_ptr + b.to(gl.int64) * stride_bt
    acc, m_i, l_i = gl.warp_specialize([
        (_consumer, (q_ptr, b, h, seq_len, n_tiles, qk_scale, stride_qb, stride_qh, q_s, p_s, kc_b, ks_b, kg_b, vc_b,
                     vs_b, vg_b, ready, empty, GROUP, N, D, DV, T, NP, STAGES, MX)),
        (_producer, (kc_desc, ks_desc, kg_desc, vc_desc, vs_desc, vg_desc, kc_b, ks_b, kg_b, vc_b, vs_b, vg_b,
                     ready, empty, bt_row, h, seq_len, n_tiles, HKV, NP, PAGE, STAGES, MX)),
    ], [1], [24])
    _epilogue(acc, l_i, out_ptr, b, h, stride_ob, stride_oh, GROUP, N, D, DV, MX)


@dataclass(frozen=True)
class GluonAttentionConfig:
    """`stages` ring slots of one 128-token tile (2 pages: 19 KB each) and `maxnreg`, the per-thread register budget
    the kernel is compiled for: the producer warp keeps 24 and setmaxnreg hands the rest to the consumer warpgroup;
    maxnreg x 8 warps x 32 (the producer's warp is padded to a warpgroup) bounds the CTAs per SM (128: 2)."""

    stages: int = 4
    maxnreg: int = 128
    # mxfp4: False (the default): kv_decode's 2**125 bias HMUL2, exact for every scale byte, as the shipped kernel;
    # True: the bias folded into the scale pairs (MX_FOLD, 0.28 fewer SASS per element) but exact only for block
    # scales 2**-70 .. 2**63 (larger ones give +-Inf where the shipped kernel stays finite): opt-in, never a default
    # that can turn a finite result into Inf.
    mx_fold: bool = False
    # True: the persistent kernel (paged_attention_gluon_persistent.py: SMs x ctas_per_sm() programs looping over the
    # (kv head, sequence) items, the ring and barriers set up once, the next item's tiles prefetched under the
    # current one), for short contexts where the per-program prologue and epilogue dominate. Same tile code, same
    # results up to nothing (each item's arithmetic is the shipped kernel's).
    persistent: bool = False
    # persistent only: programs to launch (0: SMs x ctas_per_sm(), one per resident CTA slot; tests set a few to
    # give each program several items)
    programs: int = 0

    def check(self) -> None:
        if not 2 <= self.stages <= 6:
            raise ValueError(f"GluonAttentionConfig {self}: stages must be in 2..6")
        if self.programs < 0 or (self.programs and not self.persistent):
            raise ValueError(f"GluonAttentionConfig {self}: programs is a count >= 1 of the persistent kernel's")

    def smem_bytes(self, kv_format: str = "nvfp4:row") -> int:
        per_page = 4 * sum(_words(kv_format).values())
        return self.stages * (BLOCK_T // PAGE) * per_page + 2 * N_PAD * HEAD_DIM * 2 + 2048

    def ctas_per_sm(self) -> int:
        return max(1, min(65536 // (self.maxnreg * 8 * 32), (228 * 1024) // (self.smem_bytes() + 1024)))


DEFAULT = GluonAttentionConfig()


def _box(words: int) -> list[int]:
    """A (page, kv head) block of `words` 4-byte elements as one TMA box [1, rows, <= 256]."""
    cols = min(words, 256)
    return [1, words // cols, cols]


def _block_layout():
    return gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3)


def _block_desc(t: torch.Tensor, blocks: int) -> TensorDescriptor:
    words = t.numel() // blocks
    box = _box(words)
    return TensorDescriptor(t, [blocks, box[1], box[2]], [words, box[2], 1], box, _block_layout())


def _block_sig(words: int, dtype: str) -> str:
    return f"tensordesc<{dtype}{_box(words)},{_block_layout()!r}>"


def _words(kv_format: str = "nvfp4:row", dv: int = HEAD_DIM) -> dict:
    """Words per (page, kv head) block: K codes, K scales, K factors, V codes, V scales, V factors (mxfp4: 32-element
    blocks, no factors)."""
    if kv_format == "mxfp4":
        return dict(kc=PAGE * HEAD_DIM // 8, ks=PAGE * HEAD_DIM // 128, vc=PAGE * dv // 8,
                    vs=HEAD_DIM // 32 * PAGE // 4)
    return dict(kc=PAGE * HEAD_DIM // 8, ks=PAGE * HEAD_DIM // 64, kg=PAGE, vc=PAGE * dv // 8,
                vs=HEAD_DIM // 16 * PAGE // 4, vg=PAGE)


def _out_factor(mx: int) -> float:
    """What a decoded element is short of its value (the factor on the scores and the output)."""
    return (L.NVFP4_FACTOR, 1.0, 2.0 ** MX_FOLD)[mx]


def _check(q, k, v, block_table, seq_lens):
    from trace_rl.formats.paged_kv import PagedKV

    if not (isinstance(k, PagedKV) and isinstance(v, PagedKV)) or k.fmt != v.fmt or k.fmt not in FORMATS:
        raise ValueError(f"decode_attention_gluon: nvfp4 or mxfp4 K/V caches only, both of one format (got "
                         f"{getattr(k, 'fmt', k)!r}/{getattr(v, 'fmt', v)!r}); use paged_attention.decode_attention")
    if (k.role, v.role) != ("k", "v"):
        raise ValueError(f"decode_attention_gluon: caches must be allocated with role='k' / 'v' (got {k.role!r}, "
                         f"{v.role!r})")
    if q.dim() != 3 or q.dtype != torch.bfloat16:
        raise ValueError(f"decode_attention_gluon: q must be [B, Hq, D] bf16, got {q.dtype} {tuple(q.shape)}")
    B, Hq, D = q.shape
    if (k.block_size, k.head_dim, k.heads) != (v.block_size, v.head_dim, v.heads):
        raise ValueError("decode_attention_gluon: K and V caches differ in page size, heads or head_dim")
    if D != HEAD_DIM or k.head_dim != HEAD_DIM or k.block_size != PAGE:
        raise ValueError(f"decode_attention_gluon: head_dim {HEAD_DIM} and pages of {PAGE} tokens only (got q "
                         f"head_dim {D}, cache {k.head_dim} x page {k.block_size}); use "
                         "paged_attention.decode_attention")
    if Hq % k.heads or not 1 <= Hq // k.heads <= N_PAD:
        raise ValueError(f"decode_attention_gluon: {Hq} query heads over {k.heads} kv heads; the group must be a "
                         f"whole number in 1..{N_PAD}")
    if block_table.dim() != 2 or block_table.shape[0] != B or seq_lens.shape != (B,):
        raise ValueError(f"decode_attention_gluon: block_table must be [B={B}, pages] and seq_lens [B]")
    tensors = (k.codes, k.scales, v.codes, v.scales) + ((k.global_scale, v.global_scale) if k.fmt == "nvfp4:row"
                                                        else ())
    for t in tensors:
        if t is None or not t.is_contiguous():
            raise ValueError("decode_attention_gluon needs the PagedKV tensors (codes, scales, nvfp4's global scale) "
                             "contiguous, as PagedKV.allocate makes them")
    if not q.is_cuda or torch.cuda.get_device_capability(q.device) != (9, 0):
        raise RuntimeError("decode_attention_gluon: needs an sm_90 GPU (wgmma, TMA, setmaxnreg)")
    if not triton.__version__.startswith("3.6"):
        raise RuntimeError(f"decode_attention_gluon: written against Triton 3.6's experimental Gluon API, found "
                           f"{triton.__version__}")


def decode_attention_gluon(q: torch.Tensor, k, v, block_table: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           config: GluonAttentionConfig | None = None) -> torch.Tensor:
    """`paged_attention.decode_attention` over nvfp4 or mxfp4 caches (same arguments), warp-specialised, one split
    per (kv head, sequence). Returns [B, Hq, D] in q.dtype; a sequence of length 0 gives zeros."""
    c = config or DEFAULT
    c.check()
    _check(q, k, v, block_table, seq_lens)
    B, Hq, D = q.shape
    hkv = k.heads
    blocks = k.num_blocks * hkv
    dv = L.v_rows(D)
    mx = FORMATS[k.fmt] * (2 if c.mx_fold else 1)
    kc, ks, vc, vs = (_block_desc(t.view(torch.int32), blocks) for t in (k.codes, k.scales, v.codes, v.scales))
    # mxfp4: no per-token factors; the K / V scale descriptors stand in for them (the kernel never loads them)
    kg, vg = (ks, vs) if mx else (_block_desc(k.global_scale, blocks), _block_desc(v.global_scale, blocks))
    if q.stride(2) != 1:
        q = q.contiguous()
    out = torch.empty(B, Hq, D, device=q.device, dtype=q.dtype)
    bt = block_table if block_table.dtype == torch.int32 else block_table.to(torch.int32)
    bt = bt if bt.stride(-1) == 1 else bt.contiguous()
    lens = seq_lens if seq_lens.dtype == torch.int32 else seq_lens.to(torch.int32)
    qk = scale * LOG2E * _out_factor(mx)
    args = (q, out, bt, lens, kc, ks, kg, vc, vs, vg, qk, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            bt.stride(0))
    consts = dict(HKV=hkv, GROUP=Hq // hkv, N=N_PAD, D=D, DV=dv, PAGE=PAGE, T=BLOCK_T, STAGES=c.stages, MX=mx)
    if c.persistent:
        from trace_rl.kernels.paged_attention_gluon_persistent import (
            _decode_attention_persistent_kernel,
            persistent_grid,
        )

        grid = min(B * hkv, c.programs) if c.programs else persistent_grid(B * hkv, _sms(q.device), c.ctas_per_sm())
        if grid:
            _decode_attention_persistent_kernel[(grid, )](*args, B * hkv, **consts, num_warps=4, maxnreg=c.maxnreg)
        return out
    _decode_attention_ws_kernel[(hkv, B)](*args, **consts, num_warps=4, maxnreg=c.maxnreg)
    return out


@functools.cache
def _sms_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def _sms(device) -> int:
    return _sms_of(device.index if device.index is not None else torch.cuda.current_device())


def gate_case(c: GluonAttentionConfig, group: int = 4, kv_heads: int = 8, budget: float = 3.35,
              kv_format: str = "nvfp4:row", full_waits: int = 2):
    from trace_rl.kernels.sass_gate import GateCase

    w = _words(kv_format)
    mx = FORMATS[kv_format] * (2 if c.mx_fold else 1)
    kg, vg = (_block_sig(w["ks"], "i32"), _block_sig(w["vs"], "i32")) if mx else \
        (_block_sig(w["kg"], "fp32"), _block_sig(w["vg"], "fp32"))              # mxfp4: the launcher's placeholders
    sig = dict(q_ptr="*bf16", out_ptr="*bf16", bt_ptr="*i32", lens_ptr="*i32",
               kc_desc=_block_sig(w["kc"], "i32"), ks_desc=_block_sig(w["ks"], "i32"), kg_desc=kg,
               vc_desc=_block_sig(w["vc"], "i32"), vs_desc=_block_sig(w["vs"], "i32"), vg_desc=vg, qk_scale="fp32",
               stride_qb="i32", stride_qh="i32", stride_ob="i32", stride_oh="i32", stride_bt="i32")
    consts = dict(HKV=kv_heads, GROUP=group, N=N_PAD, D=HEAD_DIM, DV=L.v_rows(HEAD_DIM), PAGE=PAGE, T=BLOCK_T,
                  STAGES=c.stages, MX=mx)
    name = kv_format.split(":")[0] + ("" if mx != 1 else " bias")
    kernel, kind = _decode_attention_ws_kernel, "ws"
    if c.persistent:      # its main loop is the inner (tile) loop of the item loop
        from trace_rl.kernels.paged_attention_gluon_persistent import _decode_attention_persistent_kernel

        kernel, kind = _decode_attention_persistent_kernel, "persistent"
        sig["work"] = "i32"
    return GateCase(f"attention gluon {kind} {name} g{group} s{c.stages} r{c.maxnreg}", kernel, sig,
                    consts, 4, 1, BLOCK_T * (HEAD_DIM + L.v_rows(HEAD_DIM)) / 128, budget,
                    ("q_ptr", "out_ptr", "bt_ptr", "lens_ptr", "stride_qb", "stride_qh", "stride_ob", "stride_oh",
                     "stride_bt"),
                    max_full_waits=full_waits, options=(("maxnreg", c.maxnreg), ), innermost=c.persistent,
                    require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE"), forbid=())


# Compile gate (sass_gate.py; Triton 3.6 only). Per K/V element of a 128-token tile (256 per consumer thread), sm_90,
# Triton 3.6, Qwen3-8B heads (group 4): 789 SASS in the loop, 3.08 per element (the shipped nvfp4 kernel: 3.31), no
# spills, every HGMMA with a register A operand, 2 full wgmma waits per tile (the previous PV before the QK issue, the
# QK before the softmax), the consumer in R0-R194 under setmaxnreg 232 (maxnreg 128: 2 CTAs per SM). Groups of 9-16
# (no half-column softmax): 3.28. The main loop may hold STSM (the P^T store), LDSM (the K scale words) and STS (the
# cross-warp max): the decoded tiles stay in registers (convert_layout(assert_trivial=True) into the wgmma operand
# layout). 3 stages cost ~20 more SASS per tile (slot = it % 3). Before the half-column softmax: 3.28 at group 4.
# Below maxnreg 128 ptxas serialises every wgmma (C7514) or spills: 96 (3.54, serialised), 88 and 80 (3 CTAs per
# SM: serialised and 12-45 spill accesses per tile).
# Where ptxas puts the work (SASS of the full-tile loop, in order): the ready wait; the K code extraction (~115
# LOP3/SHF, under the previous PV); the PV wait; the K scale multiplies (64 HMUL2) interleaved with the 16 QK HGMMAs;
# the slot release; the QK wait, placed right after the last HGMMA; then the whole V^T decode (~226), the softmax and
# the 16 PV HGMMAs (in flight under the next tile's K code extraction). ptxas schedules WARPGROUP.DEPBAR as early as
# it can and sinks the decode below it: also with 256 registers, with vt in the wait's deps, with the slot release
# after the wait, and with the V^T decode written before the QK issue (3.16 per element, the decode still after the
# wait). Inside one warpgroup only the K code extraction overlaps an MMA; the overlap of V^T decode and the QK MMA
# that the source asks for comes from the other resident CTA's warps.
# mxfp4, the bias folded (MX 2, opt-in mx_fold=True): 806 SASS, 3.15 per element at group 4 (851, 3.32 at group 16; 810,
# 3.16 at group 1), no spills, 2 full waits, the consumer in R0-R180 (R0-R212 at group 16): the scale pairs cost
# ~7 ops per V scale word (and, min.u16x2, mad) against nvfp4's 2, and no factor loads or multiplies. Through
# kv_decode's 2**125 bias HMUL2 instead (mx_fold=False, MX 1, the default, exact for every scale byte): 878, 3.43 at
# group 4 (968, 3.78 at group 16: over issue 15's 3.5 budget, gated at 3.8 so it cannot grow), R0-R206: +128 HMUL2,
# 0.5 per element.
GATE = ((GluonAttentionConfig(), 4, 3.15, "nvfp4:row"), (GluonAttentionConfig(stages=2), 4, 3.15, "nvfp4:row"),
        (GluonAttentionConfig(), 16, 3.35, "nvfp4:row"), (GluonAttentionConfig(), 4, 3.5, "mxfp4"),
        (GluonAttentionConfig(), 16, 3.8, "mxfp4"), (GluonAttentionConfig(mx_fold=True), 4, 3.25, "mxfp4"),
        (GluonAttentionConfig(mx_fold=True), 16, 3.4, "mxfp4"),
        # the persistent variant (paged_attention_gluon_persistent.py; its tile loop, inside the item loop)
        (GluonAttentionConfig(persistent=True), 4, 3.5, "mxfp4"),
        (GluonAttentionConfig(persistent=True), 16, 3.8, "mxfp4"),
        (GluonAttentionConfig(persistent=True, mx_fold=True), 4, 3.25, "mxfp4"))
# The persistent variant over nvfp4: ptxas serialises every wgmma of its tile loop (C7513, "non wgmma instructions
# defining input registers of a wgmma between start and end of the pipeline stage": 32 full waits, 3.36 per element
# at group 4, 3.67 at 16), whatever the register budget (maxnreg 128-168 alike) and with the factor loads after the
# QK wait; without the per-token factor loads (fk = fv = 1) or with one item per program it is not serialised (3.13).
# Also serialised: two items unrolled (static_range), the item loop around a warp_specialize region per item, padded
# accumulator columns made distinct (acc * 0); a noinline per-item function trades it for C7510 (pipeline crossing a
# function boundary). Where in its pipeline ptxas finds the offending definition is not visible in the PTX (no
# definition of an in-flight wgmma register on any path; the same copies into the padded accumulator columns inside
# the PV stage as the shipped kernel's).
# Gated as it is, so that it cannot get worse unseen; benchmarks/attention_short_h200.sh measures what it costs.
GATE_SERIALISED = ((GluonAttentionConfig(persistent=True), 4, 3.45, "nvfp4:row"),
                   (GluonAttentionConfig(persistent=True), 16, 3.75, "nvfp4:row"))


def sass_gate_cases():
    if not triton.__version__.startswith("3.6"):
        return []
    return [gate_case(c, group, budget=budget, kv_format=fmt) for c, group, budget, fmt in GATE] + \
        [gate_case(c, group, budget=budget, kv_format=fmt, full_waits=32) for c, group, budget, fmt in GATE_SERIALISED]
