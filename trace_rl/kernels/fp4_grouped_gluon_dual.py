"""Dual-accumulator variant of the Gluon grouped FP4 GEMM (fp4_grouped_gluon.py), a candidate for 25-46 rows per
expert (B = 409-512 routed tokens at top-8 of 128 experts; issue 15). Same inputs, outputs and bits as the shipped
kernel; `fp4_grouped_matmul_gluon` runs it for a GroupedGluonConfig with `dual=True`.

Why: at 25-32 rows per expert on average the router gives 10 (B = 409) to ~60 (B = 512) of 128 experts 33-46 rows.
The shipped 32-token tile decodes such an expert's weight twice (two token tiles: the decode in registers, not the
MMA, is most of a tile's time), the 64-token tiles decode once but run every wgmma at N = 64 whether the expert has
17 rows or 46 and, at 64 tokens per slot, fit fewer warps per SM. Here a token tile covers up to 2 x BM rows: the
weight step is decoded once into the wgmma A registers and multiplied with the first BM rows (acc) and, only where
the tile has more than BM rows, also with the next BM (acc2, a second activation box loaded only then). A uniform
branch per tile picks one of two K loops (one or two wgmmas per chunk), so no loop carries a branch between a wgmma
and its wait. Tiles are dealt in fp4_grouped_gluon_schedule's `balanced` order over tiles of 2 x BM rows.

Each output element is still one fp32 accumulation over K in the same order (the same wgmma K steps, N-independent):
bit-identical to the shipped tiles (tests/kernels/test_fp4_grouped_gluon_candidates.py).
"""

from __future__ import annotations

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

from trace_rl.kernels import fp4_gemm_gluon_ring as ring
from trace_rl.kernels import fp4_grouped_gluon_schedule as sched
from trace_rl.kernels.fp4_gemm_gluon import _consume_step, _decode_chunk
from trace_rl.kernels.fp4_grouped_gluon import _grouped_store


@gluon.jit
def _dual_producer(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, x2_bufs, ready, empty, off_ptr, pid, nprog, E, NT,
                   NP, KB, BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                   EP: gl.constexpr):
    """1 warp: per tile of up to 2 BM rows and K step, the words, scales and first activation box, and the second box
    (rows m0 + BM ..) only where the tile has more than BM rows (the ready barrier expects its bytes only then)."""
    NB1: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes + x_desc.block_type.nbytes
    NB2: gl.constexpr = NB1 + x_desc.block_type.nbytes
    SW: gl.constexpr = s_desc.block_type.shape[1]
    incl = sched.tile_prefix(off_ptr, E, NT, 2 * BM, EP)
    j = 0
    for t in range(pid, gl.max(incl, axis=0), nprog):
        e, mt, n = sched.locate(t, incl, NT)
        m0 = gl.load(off_ptr + e) + mt * (2 * BM)
        rows = gl.load(off_ptr + e + 1) - m0
        need2 = rows > BM
        need1 = rows <= BM
        n16_0 = (e * NP + n * BN) // 16
        srow = e * NP + n * BN
        for kb in range(KB):
            slot = j % STAGES
            mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
            bar = ready.index(slot)
            mbarrier.expect(bar, NB1, pred=need1)
            mbarrier.expect(bar, NB2, pred=need2)
            tma.async_copy_global_to_shared(w_desc, [kb * (BK // 128), n16_0, 0], bar, w_bufs.index(slot))
            tma.async_copy_global_to_shared(s_desc, [srow, kb * SW], bar, s_bufs.index(slot))
            tma.async_copy_global_to_shared(x_desc, [m0, kb * BK], bar, x_bufs.index(slot))
            tma.async_copy_global_to_shared(x_desc, [m0 + BM, kb * BK], bar, x2_bufs.index(slot), pred=need2)
            j += 1


@gluon.jit
def _dual_step(w_raw, s_raw, x_bufs, x2_bufs, ready, empty, it, acc, acc2, W_LAYOUT: gl.constexpr,
               A_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
               STAGES: gl.constexpr, MX: gl.constexpr):
    """fp4_gemm_gluon._consume_step (no overlap) with each decoded chunk multiplied by both activation boxes."""
    KC: gl.constexpr = BK // 128
    slot = it % STAGES
    mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
    s_s = s_raw.index(slot)
    x_s = x_bufs.index(slot)
    x2_s = x2_bufs.index(slot)
    for kp in gl.static_range(KC // 2):
        w0 = w_raw.index(slot * KC + 2 * kp).load(W_LAYOUT)
        w1 = w_raw.index(slot * KC + 2 * kp + 1).load(W_LAYOUT)
        s0 = s_s.slice(2 * kp, 1, dim=3).load(S_LAYOUT)
        s1 = s_s.slice(2 * kp + 1, 1, dim=3).load(S_LAYOUT)
        for kk in gl.static_range(2):
            if kk == 0:
                a = _decode_chunk(w0, s0, W_LAYOUT, A_LAYOUT, BN, MX)
            else:
                a = _decode_chunk(w1, s1, W_LAYOUT, A_LAYOUT, BN, MX)
            acc = warpgroup_mma(a, x_s.slice((2 * kp + kk) * 128, 128, dim=1).permute((1, 0)), acc, is_async=True)
            acc2 = warpgroup_mma(a, x2_s.slice((2 * kp + kk) * 128, 128, dim=1).permute((1, 0)), acc2,
                                 is_async=True)
            acc, acc2 = warpgroup_mma_wait(num_outstanding=0, deps=(acc, acc2))
    fence_async_shared()
    mbarrier.arrive(empty.index(slot), count=1)
    return acc, acc2


@gluon.jit
def _dual_consumer(w_bufs, s_bufs, x_bufs, x2_bufs, ready, empty, off_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr,
                   pid, nprog, E, NT, KB, N, stride_rfe, stride_be, stride_om, BN: gl.constexpr, BK: gl.constexpr,
                   BM: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr, HAS_ROW_SCALE: gl.constexpr,
                   HAS_BIAS: gl.constexpr, EP: gl.constexpr):
    NW: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = ring.mma_layout(NW, BM)
    A_LAYOUT: gl.constexpr = ring.a_layout(NW, BM)
    W_LAYOUT: gl.constexpr = ring.w_layout(NW)
    S_LAYOUT: gl.constexpr = ring.s_layout(NW, MX)
    w_raw = ring.word_views(w_bufs, BN, BK, STAGES)
    s_raw = ring.scale_views(s_bufs, BN, BK, STAGES, MX)
    incl = sched.tile_prefix(off_ptr, E, NT, 2 * BM, EP)
    j = 0
    for t in range(pid, gl.max(incl, axis=0), nprog):
        e, mt, n = sched.locate(t, incl, NT)
        m0 = gl.load(off_ptr + e) + mt * (2 * BM)
        end = gl.load(off_ptr + e + 1)
        acc = gl.zeros([BN, BM], gl.float32, mma)
        acc2 = gl.zeros([BN, BM], gl.float32, mma)
        if end - m0 > BM:
            for kb in range(KB):
                acc, acc2 = _dual_step(w_raw, s_raw, x_bufs, x2_bufs, ready, empty, j + kb, acc, acc2, W_LAYOUT,
                                       A_LAYOUT, S_LAYOUT, BN, BK, STAGES, MX)
        else:
            a_prev = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
            for kb in range(KB):
                acc, a_prev = _consume_step(w_raw, s_raw, x_bufs, ready, empty, j + kb, kb > 0, acc, a_prev,
                                            W_LAYOUT, A_LAYOUT, S_LAYOUT, BN, BK, STAGES, False, MX)
        j += KB
        _grouped_store(acc, e, n, m0, end, N, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, stride_rfe, stride_be,
                       stride_om, BN, BM, HAS_ROW_SCALE, HAS_BIAS)
        if end - m0 > BM:
            _grouped_store(acc2, e, n, m0 + BM, end, N, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, stride_rfe,
                           stride_be, stride_om, BN, BM, HAS_ROW_SCALE, HAS_BIAS)


@gluon.jit(do_not_specialize=["R", "N", "NT", "NP", "KB", "E"])
def _fp4_grouped_dual_kernel(w_desc, s_desc, x_desc, off_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, R, N, NT, NP,
                             KB, E, stride_rfe, stride_be, stride_om, BN: gl.constexpr, BK: gl.constexpr,
                             BM: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr, HAS_ROW_SCALE: gl.constexpr,
                             HAS_BIAS: gl.constexpr, ZERO_TAIL: gl.constexpr, EP: gl.constexpr):
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    x2_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    gl.warp_specialize([
        (_dual_consumer, (w_bufs, s_bufs, x_bufs, x2_bufs, ready, empty, off_ptr, rf_ptr, out_ptr, row_scale_ptr,
                          bias_ptr, pid, nprog, E, NT, KB, N, stride_rfe, stride_be, stride_om, BN, BK, BM, STAGES,
                          MX, HAS_ROW_SCALE, HAS_BIAS, EP)),
        (_dual_producer, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, x2_bufs, ready, empty, off_ptr, pid, nprog,
                          E, NT, NP, KB, BN, BK, BM, STAGES, EP)),
    ], [1], [24])
    # rows offsets[E] .. R (capacity padding) come back as zeros: fp4_grouped_gluon.zero_tail_rows written out, as
    # calling it moved one PRMT in this kernel's SASS (sass_diff, 2026-12-02) and no GPU run has checked that build
    if ZERO_TAIL:
        NWZ: gl.constexpr = gl.num_warps()
        ZL: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NWZ, 1], [1, 0])
        ZR: gl.constexpr = 4 * NWZ
        zeros = gl.zeros([ZR, 64], out_ptr.dtype.element_ty, ZL)
        tail0 = gl.load(off_ptr + E)
        for r0 in range(tail0 + pid * ZR, R, nprog * ZR):
            r = r0 + gl.arange(0, ZR, layout=gl.SliceLayout(1, ZL))
            for c0 in range(0, N, 64):
                c = c0 + gl.arange(0, 64, layout=gl.SliceLayout(0, ZL))
                gl.store(out_ptr + gl.expand_dims(r, 1).to(gl.int64) * stride_om + gl.expand_dims(c, 0), zeros,
                         mask=gl.expand_dims(r < R, 1) & gl.expand_dims(c < N, 0))


def launch_dual(x: torch.Tensor, offsets: torch.Tensor, w, c, out: torch.Tensor, row_scale, bias, zero_tail: bool,
                grid: int, descriptors) -> None:
    """The dual kernel's launch (fp4_grouped_matmul_gluon has checked the inputs and made `out`)."""
    np_, kp = w.padded
    E = w.values.shape[0]
    w_desc, s_desc, x_desc = descriptors
    _fp4_grouped_dual_kernel[(grid,)](
        w_desc, s_desc, x_desc, offsets, w.row_factor, out,
        row_scale if row_scale is not None else w.row_factor, bias if bias is not None else w.row_factor,
        x.shape[0], w.n, triton.cdiv(np_, c.block_n), np_, kp // c.bk(w.fmt), E, w.row_factor.stride(0),
        w.n if bias is not None else 0, out.stride(0), BN=c.block_n, BK=c.bk(w.fmt), BM=c.block_m, STAGES=c.stages,
        MX=w.fmt == "mxfp4", HAS_ROW_SCALE=row_scale is not None, HAS_BIAS=bias is not None, ZERO_TAIL=zero_tail,
        EP=triton.next_power_of_2(E), num_warps=c.num_warps, maxnreg=c.maxnreg)


def gate_case(fmt: str, c, budget: float, row_scale: bool = False):
    """The compile-gate case of a dual config: the main loop is the two-wgmma K loop (per weight element it counts
    the decode once and both wgmmas); no loop instruction may write the A registers both wgmmas read while they are
    in flight (sass_wgmma_hazard)."""
    import dataclasses

    from trace_rl.kernels.fp4_grouped_gluon import gate_case as single

    case = single(fmt, c, budget, row_scale)
    consts = {k: v for k, v in case.constexprs.items() if k not in ("OVERLAP", "BALANCED")}
    return dataclasses.replace(case, name=case.name + " dual", kernel=_fp4_grouped_dual_kernel, constexprs=consts,
                               max_full_waits=c.bk(fmt) // 128, a_in_flight=True)
