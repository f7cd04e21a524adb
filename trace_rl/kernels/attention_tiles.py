"""Tile loaders of the paged decode-attention kernel (trace_rl/kernels/paged_attention.py): the page
indices and per-token factors of a tile, K [T, D] and V^T [DV, T] decoded from the write-time cache layout
(trace_rl/formats/kv_layout.py) into the orientation of the MMAs (tokens as M), and the column helpers of
the softmax on half the padded query-head columns. Each is a `@triton.jit` function inlined into the
kernel; `MASKED` variants serve the last (partial) tile of a split."""

from __future__ import annotations

import triton
import triton.language as tl

from trace_rl.kernels.kv_decode import fp4_scale_pair, fp4_scale_word_pairs, fp4_words, fp8_words


@triton.jit
def _page_heads(bt_row, t0, t_hi, h, HKV: tl.constexpr, NP: tl.constexpr, LOG2_PAGE: tl.constexpr,
                MASKED: tl.constexpr):
    """(page, kv head) block index (int64) of the NP pages a tile touches; pages past the sequence read
    page 0. The cache tensors are [pages, heads, ...]: block b starts at b * (elements per page and head)."""
    col = (t0 >> LOG2_PAGE) + tl.arange(0, NP)
    if MASKED:
        pg = tl.load(bt_row + col, mask=(col << LOG2_PAGE) < t_hi, other=0)
    else:
        pg = tl.load(bt_row + col)
    return pg.to(tl.int64) * HKV + h


@triton.jit
def _row_factor(f_ptr, hp, r0, t, t_hi, PAGE: tl.constexpr, NP: tl.constexpr, RP: tl.constexpr,
                MASKED: tl.constexpr, NAN_FLAG: tl.constexpr):
    """float32 per-token factors [T] of a tile ([pages, heads, PAGE] tensor)."""
    ptrs = (f_ptr + hp * PAGE)[:, None] + (r0 + tl.arange(0, RP))[None, :]
    ptrs = tl.reshape(ptrs, [NP * RP])
    if MASKED:
        f = tl.load(ptrs, mask=t < t_hi, other=0.0)
    else:
        f = tl.load(ptrs)
    if NAN_FLAG:       # fp8: a negative row scale flags NaN/Inf values
        f = tl.where(f < 0, float("nan"), f)
    return f


@triton.jit
def _k_fp4(x, sw, T: tl.constexpr, NP: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, MX: tl.constexpr,
           MODE: tl.constexpr):
    """FP4 K words [T, D/8] and scale words [NP, RP*NB/4] (stored [rg, g, block, hr]) -> [T, D]."""
    G: tl.constexpr = 32 if MX else 16
    NB: tl.constexpr = D // G
    sb = tl.join(tl.join(sw & 255, (sw >> 16) & 255), tl.join((sw >> 8) & 255, (sw >> 24) & 255))
    sb = tl.reshape(sb, [NP, RP // 16, 8, NB, 2])                                   # p, rg, g, block, hr
    sb = tl.reshape(tl.permute(sb, (0, 1, 4, 2, 3)), [T, NB])                       # [token, block]
    if NB >= 8:      # each (tq, l) run of D/8 dims spans NBH blocks
        NBH: tl.constexpr = NB // 8
        lo, hi = tl.split(tl.permute(tl.reshape(sb, [T, 4, 2, NBH]), (0, 1, 3, 2)))  # [T, 4, NBH]
        pair = fp4_scale_pair(lo, hi, MX)
        pair = tl.broadcast_to(pair[:, :, :, None], [T, 4, NBH, G // 4])
    else:            # one block covers a thread's whole row (or several threads')
        s1 = tl.reshape(tl.broadcast_to(tl.reshape(sb, [T, NB, 1]), [T, NB, 4 // NB]), [T, 4])
        pair = fp4_scale_pair(s1, s1, MX)
        pair = tl.broadcast_to(pair[:, :, None], [T, 4, D // 32])
    pair = tl.reshape(pair, [T, D // 8])
    o0l, o0h, o1l, o1h, o2l, o2h, o3l, o3h = fp4_words(x, pair, MX, MODE)
    y = tl.join(tl.join(tl.join(o0l, o0h), tl.join(o1l, o1h)), tl.join(tl.join(o2l, o2h), tl.join(o3l, o3h)))
    y = tl.reshape(y, [T, 4, D // 32, 2, 2, 2])                                    # t, tq, jw, l, a, ih
    y = tl.permute(y, (0, 2, 5, 4, 1, 3))                                           # t, jw, ih, a, tq, l
    return tl.reshape(y, [T, D])


@triton.jit
def _k_fp8(x, T: tl.constexpr, D: tl.constexpr, MODE: tl.constexpr):
    a_lo, a_hi, b_lo, b_hi = fp8_words(x, MODE)
    y = tl.join(tl.join(a_lo, a_hi), tl.join(b_lo, b_hi))                          # [T, W, l, h]
    y = tl.reshape(y, [T, 4, D // 16, 2, 2])                                        # t, tq, jw, l, h
    y = tl.permute(y, (0, 2, 4, 1, 3))                                              # t, jw, h, tq, l
    return tl.reshape(y, [T, D])


@triton.jit
def _k_tile(kc_ptr, ks_ptr, hp, r0, HKV: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr,
            NP: tl.constexpr, RP: tl.constexpr, KV_FMT: tl.constexpr, MODE: tl.constexpr):
    """K [T, D] in MMA column order (bf16, float32 under DECODE_PURE). Pointers are page-block bases
    (int64, one per page) plus int32 offsets inside the block; offsets stay 3-D (a reshape of pointers
    hides their alignment from Triton: no 16-byte loads)."""
    T: tl.constexpr = NP * RP
    rows = r0 + tl.arange(0, RP)
    if KV_FMT == 0:        # token-major pages [P, S, H, D]: page p, row r, head h at (p S + r) H + h
        h = hp % HKV
        row = tl.reshape(((hp - h) * PAGE + h)[:, None] + rows[None, :] * HKV, [T])
        k = tl.load(kc_ptr + row[:, None] * D + tl.arange(0, D)[None, :])
    elif KV_FMT == 1:
        ptrs = (kc_ptr + hp * (PAGE * D // 4))[:, None, None] + (rows * (D // 4))[None, :, None] \
            + tl.arange(0, D // 4)[None, None, :]
        k = _k_fp8(tl.reshape(tl.load(ptrs), [T, D // 4]), T, D, MODE)
    else:
        NB: tl.constexpr = D // (16 if KV_FMT == 2 else 32)
        ptrs = (kc_ptr + hp * (PAGE * D // 8))[:, None, None] + (rows * (D // 8))[None, :, None] \
            + tl.arange(0, D // 8)[None, None, :]
        x = tl.reshape(tl.load(ptrs), [T, D // 8])                                      # [T, D/8] words
        s_ptrs = (ks_ptr + hp * (PAGE * NB // 4))[:, None] + (r0 * NB // 4 + tl.arange(0, RP * NB // 4))[None, :]
        k = _k_fp4(x, tl.load(s_ptrs), T, NP, RP, D, KV_FMT == 3, MODE)
    return k


@triton.jit
def _half_mask(t_first, t_hi):
    """int32 mask keeping the 16-bit halves (tokens t_first, t_first + 1) that are inside the sequence."""
    keep_lo = tl.where(t_first < t_hi, 0xFFFF, 0)
    keep_hi = tl.where(t_first + 1 < t_hi, -65536, 0)
    return keep_lo | keep_hi


@triton.jit
def _token_pairs(t0, KHA: tl.constexpr, KL: tl.constexpr):
    """First token (tile-relative + t0) of each V^T word's pair: [KHA, KL, h] (add 2 tq)."""
    return (t0 + 16 * (tl.arange(0, KHA)[:, None, None] * KL + tl.arange(0, KL)[None, :, None])
            + 8 * tl.arange(0, 2)[None, None, :])


@triton.jit
def _vt_fp8(x, T: tl.constexpr, DV: tl.constexpr, KL: tl.constexpr, MODE: tl.constexpr):
    """FP8 V^T words -> [DV, T]. The last tile needs no mask here: an E4M3 code always decodes to a finite value
    (<= 480; NaN/Inf are flagged by the row scale), and a masked token's row factor loads as 0, so its
    probability x factor is 0 and so is every product with its (stale) values. Masking the codes instead
    (x & half-mask) put the decoded tile in a layout the MMA cannot take from registers: Triton sent it
    through shared memory (STS + LDSM), the one structural difference from the FP4 tail, and with cp.async
    pipelining (2-3 stages) that tail read wrong values on the H200."""
    KHA: tl.constexpr = T // (16 * KL)
    x = tl.reshape(x, [KHA, DV // 128, 4, 8, 4, KL, 2, 2])                         # kh, mw, w, g, tq, kl, h, ml
    a_lo, a_hi, b_lo, b_hi = fp8_words(x, MODE)
    y = tl.join(tl.join(a_lo, a_hi), tl.join(b_lo, b_hi))                          # [..., l, hr]
    # kh0 mw1 w2 g3 tq4 kl5 h6 ml7 l8 hr9 -> rows (mw, ml, w, hr, g), cols (kh, kl, h, tq, l)
    y = tl.permute(y, (1, 7, 2, 9, 3, 0, 5, 6, 4, 8))
    return tl.reshape(y, [DV, T])


@triton.jit
def _vt_fp4(x, sw, t0, t_hi, NP: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
            KL: tl.constexpr, MX: tl.constexpr, MODE: tl.constexpr, MASKED: tl.constexpr):
    """FP4 V^T words and scale words [NP, DV/G, tq, kt] (stored [block, tq, kt, (l, h)]) -> [DV, T]."""
    T: tl.constexpr = NP * RP
    KHA: tl.constexpr = T // (16 * KL)
    MW: tl.constexpr = DV // 128
    G: tl.constexpr = 32 if MX else 16
    KT: tl.constexpr = RP // 16
    x = tl.reshape(x, [KHA, MW, 4, 8, 4, KL, 2])                                    # kh, mw, w, g, tq, kl, h
    blk = tl.arange(0, DV // G)
    p02, p13 = fp4_scale_word_pairs(sw, MX, MODE)                                   # tokens (t, t+1), (t+8, t+9)
    pair = tl.join(p02, p13)
    pair = tl.where((blk < D // G)[None, :, None, None, None], pair, 0)             # padding rows
    if MX:             # a thread's rows are in block 4 mw + w
        pair = tl.reshape(pair, [NP, MW, 4, 1, 1, 4, KT // KL, KL, 2])
    else:              # block 8 mw + 2 w + g // 4
        pair = tl.reshape(pair, [NP, MW, 4, 2, 1, 4, KT // KL, KL, 2])
    pair = tl.reshape(tl.broadcast_to(pair, [NP, MW, 4, 2, 4, 4, KT // KL, KL, 2]), [NP, MW, 4, 8, 4, KT // KL, KL, 2])
    pair = tl.reshape(tl.permute(pair, (0, 5, 1, 2, 3, 4, 6, 7)), [KHA, MW, 4, 8, 4, KL, 2])
    if MASKED:
        tp = _token_pairs(t0, KHA, KL)[:, None, None, None, None, :, :]
        tp = tp + 2 * tl.arange(0, 4)[None, None, None, None, :, None, None]
        pair = pair & _half_mask(tp, t_hi)
    o0l, o0h, o1l, o1h, o2l, o2h, o3l, o3h = fp4_words(x, pair, MX, MODE)
    y = tl.join(tl.join(tl.join(o0l, o0h), tl.join(o1l, o1h)), tl.join(tl.join(o2l, o2h), tl.join(o3l, o3h)))
    # kh0 mw1 w2 g3 tq4 kl5 h6 l7 a8 ih9 -> rows (mw, ih, w, a, g), cols (kh, kl, h, tq, l)
    y = tl.permute(y, (1, 9, 2, 8, 3, 0, 5, 6, 4, 7))
    return tl.reshape(y, [DV, T])


@triton.jit
def _vt_tile(vc_ptr, vs_ptr, hp, r0, t0, t_hi, HKV: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
             PAGE: tl.constexpr, NP: tl.constexpr, RP: tl.constexpr, KV_FMT: tl.constexpr,
             MODE: tl.constexpr, MASKED: tl.constexpr):
    """V^T [DV, T] in MMA row order (bf16, float32 under DECODE_PURE); masked tokens are zero."""
    T: tl.constexpr = NP * RP
    KL: tl.constexpr = 2 if PAGE % 32 == 0 else 1
    if KV_FMT == 0:
        h = hp % HKV
        row = tl.reshape(((hp - h) * PAGE + h)[:, None] + (r0 + tl.arange(0, RP))[None, :] * HKV, [T])
        ptrs = vc_ptr + row[:, None] * D + tl.arange(0, D)[None, :]
        if MASKED:
            v = tl.load(ptrs, mask=(t0 + tl.arange(0, T) < t_hi)[:, None], other=0.0)
        else:
            v = tl.load(ptrs)
        vt = tl.trans(v)
    elif KV_FMT == 1:
        ptrs = (vc_ptr + hp * (PAGE * DV // 4))[:, None] + (r0 * (DV // 4) + tl.arange(0, RP * DV // 4))[None, :]
        vt = _vt_fp8(tl.load(ptrs), T, DV, KL, MODE)
    else:
        G: tl.constexpr = 16 if KV_FMT == 2 else 32
        ptrs = (vc_ptr + hp * (PAGE * DV // 8))[:, None] + (r0 * (DV // 8) + tl.arange(0, RP * DV // 8))[None, :]
        blk = tl.arange(0, DV // G)
        s_offs = blk[:, None, None] * (PAGE // 4) + tl.arange(0, 4)[None, :, None] * (PAGE // 16) \
            + (r0 >> 4) + tl.arange(0, RP // 16)[None, None, :]                                  # [blocks, tq, kt]
        s_ptrs = (vs_ptr + hp * (D // G * PAGE // 4))[:, None, None, None] + s_offs[None, :, :, :]
        sw = tl.load(s_ptrs, mask=(blk < D // G)[None, :, None, None], other=0)           # [NP, blocks, tq, kt]
        vt = _vt_fp4(tl.load(ptrs), sw, t0, t_hi, NP, RP, D, DV, KL, KV_FMT == 3, MODE, MASKED)
    return vt


@triton.jit
def _low_half(x):
    """[R, N] -> [R, N/2]: the first N/2 columns. The MMA holds column bit log2(N)-1 in registers, so this
    moves no data; the softmax then runs on half the padded columns (GQA groups <= N/2)."""
    R: tl.constexpr = x.shape[0]
    N: tl.constexpr = x.shape[1]
    lo, hi = tl.split(tl.permute(tl.reshape(x, [R, 2, N // 2]), (0, 2, 1)))
    return lo


@triton.jit
def _pad_half(x, fill):
    """[R, N/2] -> [R, N], the upper columns `fill`."""
    R: tl.constexpr = x.shape[0]
    NH: tl.constexpr = x.shape[1]
    return tl.reshape(tl.permute(tl.join(x, tl.full([R, NH], fill, x.dtype)), (0, 2, 1)), [R, 2 * NH])
