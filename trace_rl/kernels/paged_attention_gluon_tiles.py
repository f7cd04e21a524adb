"""The tile code of the Gluon FP4-KV paged decode attention (paged_attention_gluon.py; issue 15): the @gluon.jit
device functions its warp-specialised kernel and the persistent variant (paged_attention_gluon_persistent.py) both
run, one (kv head, sequence)'s tiles at a time. Organised against what bounds the shipped kernel (docs/benchmarks.md,
"What bounds FP4": one partition that decodes K, waits for its HGMMAs, reduces, decodes V, waits again):

- the producer partition (1 warp, 24 registers; `_produce_tiles`) copies each 128-token tile's pages (K codes,
  K scales, V codes, V scales, the two per-token factor rows: each a contiguous (page, kv head) block) with one TMA
  box per page and tensor into a STAGES-deep shared ring (`_ring`: `ready` mbarrier with expect-tx per slot, `empty`
  released by the consumer). Hopper's TMA has no gather; the page table is read by the producer (pages past the
  sequence read page 0, as the shipped kernel does);
- the default partition (one warpgroup; `_consume_tiles`, `_tile`) per tile: waits on `ready`, decodes K (LDS.128
  of a thread's fragment, the shipped shift/mask PTX; `_k_decode`) while the previous tile's PV wgmma is still in
  flight, retires that PV, issues S^T = K q^T async, decodes V^T (`_vt_decode`), releases the slot, waits, runs the
  online softmax (on the low half of the padded columns when the group fits), stores P^T (bf16, the only tile that
  goes through shared memory) and issues the PV wgmma async, leaving it in flight under the next tile's K decode.
  ptxas moves part of that decode below the wgmma waits (the V^T decode after the QK wait: see the gate notes in
  paged_attention_gluon_gate.py), so within a warpgroup the overlap is partial; 2 CTAs per SM (maxnreg 128, the
  consumer at ~195 of 232 registers) interleave with each other.

The K / V decode (`_k_decode`, `_vt_decode`) and the mxfp4 scale folds' constants (MX_FOLD, MX_CHK: the checked
window) are paged_attention_gluon_kv.py's; this file is the pipeline around them: the ring, the producer, the
consumer's online softmax (with the mxfp4 probability flush, MX_P_FLUSH, below) and the epilogue. The constexpr MX
picks the format: 0 nvfp4 (per-token float32 factors on the scores and the probabilities), 1 mxfp4 exact, 2 mxfp4
folded, 3 mxfp4 folded and checked (the output NaN for an item with a K block outside the window: the launcher's
exact REDO). mxfp4 has no per-token factors: its producer copies four boxes per page, not six. `_load_q` and
`_epilogue` read q and write the output in the MMA's column / row orders (kv_layout.k_dim_of_col, v_dim_of_row).
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from trace_rl.kernels.attention_tiles import _low_half
from trace_rl.kernels.paged_attention_gluon_kv import (
    MX_CHK_LO,
    MX_CHK_OUT,
    MX_CHK_TOP,
    MX_OUT,
    _k_decode,
    _ks_layout,
    _vt_decode,
)

# every mxfp4 path flushes probabilities (and the running max's rescale alpha) below 2**-MX_P_FLUSH to 0 (_tile)
MX_P_FLUSH_LOG2 = 51          # python int for the host-side tests
MX_P_FLUSH = gl.constexpr(float(MX_P_FLUSH_LOG2))
# p = ex2.ftz(s - m - MX_P_SHIFT) x 2**MX_P_SHIFT: float32's smallest normal 2**-126 = 2**-MX_P_FLUSH x 2**-MX_P_SHIFT
MX_P_SHIFT = gl.constexpr(float(126 - MX_P_FLUSH_LOG2))
MX_P_UNSHIFT = gl.constexpr(2.0 ** (126 - MX_P_FLUSH_LOG2))


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


@gluon.constexpr_function
def _partials_layout(nw, ns):
    """[nw, ns] with every warp's partial in each thread's registers and the columns where the MMA layout has them
    (column bit 0 and bits >= 3 in registers, bits 1-2 in lanes tq; the lane bits of g broadcast)."""
    cols = [[0, 1]] + [[0, 1 << b] for b in range(3, ns.bit_length() - 1)]
    warps = [[1 << b, 0] for b in range(nw.bit_length() - 1)]
    return gl.DistributedLinearLayout(reg_bases=cols + warps, lane_bases=[[0, 2], [0, 4], [0, 0], [0, 0], [0, 0]],
                                      warp_bases=[[0, 0]] * (nw.bit_length() - 1), block_bases=[], shape=[nw, ns])


@gluon.jit
def _col_max(s, NW: gl.constexpr):
    """max over the tokens (axis 0) of s [T, NS] in the MMA layout (row 64 a + 16 w + r in warp w): each warp's
    partial over its rows (registers, then lanes: shuffles), then the NW partials through shared memory in one
    convert_layout (one store, one barrier, one load) and reduced in registers. gl.max's generic cross-warp reduction
    takes two rounds through shared memory (3 barriers). max is order-independent (FMNMX drops a NaN operand either
    way; a +-0 tie changes no exp2 after it): the same m as gl.max(s, axis=0)."""
    T: gl.constexpr = s.shape[0]
    NS: gl.constexpr = s.shape[1]
    x = gl.reshape(s, [T // (16 * NW), NW, 16, NS])
    x = gl.max(gl.max(x, axis=0), axis=1)          # [NW, NS], one warp's row each: the in-register axis first
    x = gl.max(gl.convert_layout(x, _partials_layout(NW, NS)), axis=0)
    return gl.convert_layout(x, gl.SliceLayout(0, s.type.layout))


@gluon.jit
def _pad_half(x, fill: gl.constexpr):
    """[R, N/2] -> [R, N], the upper columns `fill` (attention_tiles._pad_half, whose tl.full takes no layout,
    cannot serve: Gluon's full needs x's)."""
    R: gl.constexpr = x.shape[0]
    NH: gl.constexpr = x.shape[1]
    return gl.reshape(gl.permute(gl.join(x, gl.full([R, NH], fill, x.dtype, x.type.layout)), (0, 2, 1)), [R, 2 * NH])


@gluon.jit
def _ex2_ftz(x):
    """2**x with results below float32's normal range flushed to 0 (ex2.approx.ftz, what gl.exp2 gives today; spelt
    out because the mxfp4 probability flush relies on the ftz)."""
    return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32, is_pure=True,
                                     pack=1)


@gluon.jit
def _tile(j, it, m_i, l_acc, acc, vt_prev, kbig, q_b, p_s, kc_r, ks_r, kg_r, vc_r, vs_r, vg_r, ready, empty, seq_len,
          qk_scale, N: gl.constexpr, T: gl.constexpr, D: gl.constexpr, DV: gl.constexpr, NP: gl.constexpr,
          STAGES: gl.constexpr, MASKED: gl.constexpr, HALF: gl.constexpr, MX: gl.constexpr, COLMAX: gl.constexpr):
    """Tile `it` of the sequence, at ring position j: online-softmax update of (m_i [NS], l_acc [T, NS], acc [DV, N]);
    NS = N / 2 when HALF (the group fits the low half of the padded columns), else N. MX (mxfp4): no per-token
    factors (decoded elements are the values). COLMAX: the column max through `_col_max` (one barrier), else
    gl.max. MX 3 (checked): kbig, the largest K stored byte - MX_CHK_LO (unsigned) seen per thread, is updated
    (tokens past the sequence count as 0: a fresh page's unwritten byte 0 causes no recompute)."""
    NW: gl.constexpr = gl.num_warps()
    s_mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, N, 16])
    A_LAYOUT: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=s_mma, k_width=2)
    ROWS: gl.constexpr = gl.SliceLayout(1, s_mma)
    slot = j % STAGES
    mbarrier.wait(ready.index(slot), (j // STAGES) & 1)
    # K decode runs while the previous tile's PV wgmma (holding vt_prev) is in flight
    k, kb = _k_decode(kc_r.index(slot), ks_r.index(slot), seq_len - it * T, A_LAYOUT, T, D, NW, MX, MASKED)
    if MX == 3:
        kbig = gl.maximum(kbig, kb)
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
    if COLMAX:
        m_new = gl.maximum(m_i, _col_max(s, NW))
    else:
        m_new = gl.maximum(m_i, gl.max(s, axis=0))
    alpha = gl.exp2(m_i - m_new)
    if MX:            # mxfp4 (every MX: the exact kernel and REDO too, so MX 1 and MX 3 stay bit-identical): flush
        # probabilities < 2**-MX_P_FLUSH to 0, so every P x v product is >= 2**-51 x 2**-70 = 2**-121 (the checked
        # fold's smallest element, 2**-70): a normal float32 in MX 3 as well, whose products are 2**5 smaller
        # (docs/kernels.md "mxfp4 checked fold"). For p through the flush-to-zero ex2 itself: 2**(s - m - 75) is
        # < 2**-126 (flushed) exactly when 2**(s - m) < 2**-51, then x 2**75 (exact); one FMUL per element, where a
        # compare + select cost two and pushed the DEFAULT configs into serialised wgmma waits. The same for alpha
        # (per column, a select): acc (MX 3: the exact acc x 2**-5) x a tiny alpha is the other place a folded
        # value can turn subnormal in one kernel only; alpha < 2**-51 drops the previous tiles, as each of their
        # probabilities is then < 2**-51 against the new max. A NaN score stays NaN (a NaN K block still poisons
        # the item). Either changes an output by < 2**-51 relative per token.
        alpha = gl.where(m_i - m_new < -MX_P_FLUSH, 0.0, alpha)
        p = _ex2_ftz(s - gl.expand_dims(m_new + MX_P_SHIFT, 0)) * MX_P_UNSHIFT
    else:
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
    if N == 8:        # P^T kept K-major as [N, T] (see _ring): stored transposed, read back as the [T, N] operand
        p_s.store(gl.permute(p.to(gl.bfloat16), (1, 0)))
        fence_async_shared()
        acc = warpgroup_mma(vt, p_s.permute((1, 0)), acc, is_async=True)
    else:
        p_s.store(p.to(gl.bfloat16))
        fence_async_shared()
        acc = warpgroup_mma(vt, p_s, acc, is_async=True)
    acc, vt = warpgroup_mma_wait(num_outstanding=1, deps=(acc, vt))     # returns at once: PV stays in flight
    return m_new, l_acc, acc, vt, kbig


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
                   NP: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr, UNROLL: gl.constexpr = 1,
                   COLMAX: gl.constexpr = False):
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
    HALF: gl.constexpr = GROUP <= N // 2 and N >= 16       # N = 8: the column bit 4 is in lanes, not registers
    l_acc = gl.zeros([T, N], gl.float32, s_mma)
    if HALF:
        l_acc = _low_half(l_acc)
    m_i = gl.full([l_acc.shape[1]], float("-inf"), gl.float32, gl.SliceLayout(0, l_acc.type.layout))
    acc = gl.zeros([DV, N], gl.float32, o_mma)
    vt = gl.zeros([DV, T], gl.bfloat16, A_LAYOUT)
    if MX == 3:       # the largest K scale byte per thread (its blocks of every tile)
        kbig = gl.zeros([T // 16, 8, 4], gl.uint32, _ks_layout(NW))
    else:
        kbig = 0
    n_full = seq_len // T
    # UNROLL full tiles per loop iteration (the same tiles in the same order, so the same arithmetic: bit-identical
    # results): the loop's per-iteration fixed cost (the loop-carried V^T registers' copies into the PV wgmma's
    # operand registers, the branch and counters) is paid once per UNROLL tiles; a leftover full tile runs after it
    for it2 in range(n_full // UNROLL):
        for u in gl.static_range(UNROLL):
            it = it2 * UNROLL + u
            m_i, l_acc, acc, vt, kbig = _tile(j0 + it, it, m_i, l_acc, acc, vt, kbig, q_b, p_s, kc_r, ks_r, kg_r,
                                              vc_r, vs_r, vg_r, ready, empty, seq_len, qk_scale, N, T, D, DV, NP,
                                              STAGES, False, HALF, MX, COLMAX)
    if UNROLL > 1:
        for it in range(n_full // UNROLL * UNROLL, n_full):
            m_i, l_acc, acc, vt, kbig = _tile(j0 + it, it, m_i, l_acc, acc, vt, kbig, q_b, p_s, kc_r, ks_r, kg_r,
                                              vc_r, vs_r, vg_r, ready, empty, seq_len, qk_scale, N, T, D, DV, NP,
                                              STAGES, False, HALF, MX, COLMAX)
    if n_full < n_tiles:
        m_i, l_acc, acc, vt, kbig = _tile(j0 + n_full, n_full, m_i, l_acc, acc, vt, kbig, q_b, p_s, kc_r, ks_r,
                                          kg_r, vc_r, vs_r, vg_r, ready, empty, seq_len, qk_scale, N, T, D, DV, NP,
                                          STAGES, True, HALF, MX, COLMAX)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    l_i = gl.sum(l_acc, axis=0)
    if MX == 3:       # a K block outside the checked window (stored < MX_CHK_LO or >= MX_CHK_TOP: stored - LO,
        # unsigned, >= TOP - LO): every column's l NaN, so the whole item's output is NaN and the exact REDO
        # launch recomputes it
        big = gl.max(gl.max(gl.max(kbig, axis=2), axis=1), axis=0)
        l_i = gl.where(big >= MX_CHK_TOP - MX_CHK_LO, float("nan"), l_i)
    return (acc, m_i, l_i)



@gluon.jit
def _epilogue(acc, l_i, out_ptr, b, h, stride_ob, stride_oh, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr,
              DV: gl.constexpr, MX: gl.constexpr):
    """out[b, h's query heads] = O^T / l. nvfp4 V elements decode to code x scale / 2**7 (mxfp4: code x scale); rows
    in V^T's MMA order (kv_layout.v_dim_of_row); a sequence of length 0 (l = 0) gives zeros."""
    if GROUP <= N // 2 and N >= 16:
        acc = _low_half(acc)
    layout: gl.constexpr = acc.type.layout
    l_i = gl.convert_layout(l_i, gl.SliceLayout(0, layout))
    if MX == 1:
        o = gl.where(gl.expand_dims(l_i, 0) == 0, 0.0, acc / gl.expand_dims(l_i, 0))
    elif MX == 2:
        o = gl.where(gl.expand_dims(l_i, 0) == 0, 0.0, acc * MX_OUT / gl.expand_dims(l_i, 0))
    elif MX == 3:
        o = gl.where(gl.expand_dims(l_i, 0) == 0, 0.0, acc * MX_CHK_OUT / gl.expand_dims(l_i, 0))
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
def _out_not_finite(out_ptr, b, h, stride_ob, stride_oh, GROUP: gl.constexpr, N: gl.constexpr, D: gl.constexpr):
    """True where out[b, kv head h's query heads] (written by the checked launch) holds a NaN or +-Inf: the item the
    REDO launch recomputes with the exact kernel."""
    NW: gl.constexpr = gl.num_warps()
    OL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    n = gl.arange(0, N, layout=gl.SliceLayout(1, OL))
    c = gl.arange(0, D, layout=gl.SliceLayout(0, OL))
    o_rows = out_ptr + b.to(gl.int64) * stride_ob + gl.expand_dims(h * GROUP + n, 1) * stride_oh
    o = gl.load(o_rows + gl.expand_dims(c, 0), mask=gl.expand_dims(n < GROUP, 1), other=0.0).to(gl.float32)
    bad = gl.where(gl.abs(o) < float("inf"), 0, 1)          # NaN compares false: not finite
    return gl.max(gl.max(bad, axis=1), axis=0) > 0


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
    if N == 8:
        # [T, 8] bf16 rows are 16 bytes: the default layout is MN-major without swizzle, whose wgmma descriptor reads
        # the wrong elements on the H200 (n_pad=8: wrong bits; with unroll=2 + col_max: compute-sanitizer "Invalid
        # __shared__ read of size 256 bytes" at the PV wgmma, 2026-12-02). K-major [N, T] (128-byte swizzle) instead,
        # like q_s.
        p_s = gl.allocate_shared_memory(gl.bfloat16, [N, T], gl.NVMMASharedLayout.get_default_for([N, T], gl.bfloat16))
    else:
        p_s = gl.allocate_shared_memory(gl.bfloat16, [T, N], gl.NVMMASharedLayout.get_default_for([T, N], gl.bfloat16))
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return kc_b, ks_b, kg_b, vc_b, vs_b, vg_b, q_s, p_s, ready, empty

