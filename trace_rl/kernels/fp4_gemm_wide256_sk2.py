"""Stream-K schedule of the 256-token Gluon FP4 GEMM with a register-side two-segment fix-up (issue 15, opt-in, not
dispatched): fp4_gemm_wide256_sk.py's schedule, producer and step loop, a cheaper finish.

Why (fp4_gemm_wide256_sk's cost at the issue's shapes): with contiguous ranges CTA c covers the TAIL of one tile
(finished a few steps into its range) and the HEAD of a later one (finished at the very end of its range). The tail's
partner (CTA c - 1, holding that tile's head) therefore finishes last, so in `sk` EVERY CTA ends its range with the
same serial fix-up: store its own fp32 partial (BN x BM x 4 = 128 KB at 128 x 256), take the ticket, reload both
partials (256 KB) and store the tile, all 132 SMs at once, on the critical path. Here a tile split over exactly two
segments is finished in registers by whichever segment comes second: it PEEKS at the tile's counter first (an
acquire load: the other segment stores its partial, then releases the counter), and when the other partial is
already there it loads it (128 KB), adds it to its accumulator and stores the tile: no own partial, no reload of it.
The early segment (the tail, a few steps into its CTA's range) stores its partial as before. If both segments find
the counter at 0 (they finish at about the same time) both store a partial and the ticket's second one sums them from
memory (`sk`'s reduction; adding in registers on that path too made ptxas spill 1.3 KB per thread).
Two fp32 values add the same whichever is first (IEEE addition is commutative), so the result is the same bits
whoever adds: deterministic, and equal to `sk`'s (0 + p0) + p1 except for the sign of an exact zero. Tiles over 3 or
more segments keep `sk`'s scheme (every partial stored, the last ticket sums them in segment order).

`default_grid` also prefers a grid (within 5% of the SMs) where no tile is split more than twice: at 4096 x 12288,
M = 256 (96 tiles x 32 K steps), 132 CTAs give ranges of 23-24 steps and some tiles three segments, 128 CTAs ranges
of exactly 24 and two segments everywhere.

The partial slots per tile (MAXSEG) are a runtime argument here (a constexpr in `sk`: one binary per shape).

`fixup=False` (FIXUP) is a timing probe only (benchmarks/skfix.py): every segment stores its accumulator directly,
so split tiles are WRONG; it measures what the fix-up costs.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from trace_rl.kernels import fp4_gemm_gluon_ring as ring
from trace_rl.kernels.fp4_gemm_gluon import _sm_count
from trace_rl.kernels.fp4_gemm_wide256 import (
    BK,
    SCALE_BOX_WORDS,
    Wide256Config,
    _segment256,
    checked_inputs,
    shared_layouts,
)
from trace_rl.kernels.fp4_gemm_wide256_sk import _cta_of, _producer_sk, _reduce_store, _store_tile, max_segments
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4


@gluon.jit
def _finish_segment2(acc, t, seg, n_segs, n_tiles, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om,
                     MAXSEG, BN: gl.constexpr, BM: gl.constexpr, FIXUP: gl.constexpr, PEEK: gl.constexpr):
    """Tile t's segment `seg` of `n_segs`: direct store; two segments: the second adds the first's partial in
    registers (module docstring); more: fp4_gemm_wide256_sk._finish_segment's scheme."""
    layout: gl.constexpr = acc.type.layout
    pid_n = t % n_tiles
    pid_m = t // n_tiles
    r_loc = gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    m_loc = gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    rows = pid_n * BN + r_loc
    offs_m = pid_m * BM + m_loc
    if n_segs == 1 or not FIXUP:
        _store_tile(acc, rows, offs_m, M, N, rf_ptr, out_ptr, stride_om)
    else:
        base = part_ptr + t.to(gl.int64) * MAXSEG * (BN * BM)
        offs = gl.expand_dims(m_loc, 0) * BN + gl.expand_dims(r_loc, 1)
        if n_segs == 2:
            # peek: 1 = the other segment's partial is stored and released (its ticket below); PEEK=False (tests)
            # never sees 1, so takes the path of two segments finishing together (the branch stays a runtime one:
            # a constant `peer` tripped an assertion in Triton 3.6's LLVM lowering)
            peer = gl.atomic_add(count_ptr + t, 0, sem="acquire", scope="gpu") + (0 if PEEK else 2)
            if peer == 1:
                gl.atomic_xchg(count_ptr + t, 0)                # ready for the next launch
                # (only this path adds in registers: the race path below too made ptxas spill, STACK 1296 bytes)
                other = gl.load(base + (1 - seg) * (BN * BM) + offs, cache_modifier=".cg")
                _store_tile(acc + other, rows, offs_m, M, N, rf_ptr, out_ptr, stride_om)
            else:
                gl.store(base + seg * (BN * BM) + offs, acc)
                gl.thread_barrier()                              # every thread's partial is written
                ticket = gl.atomic_add(count_ptr + t, 1, sem="acq_rel", scope="gpu")
                if ticket == 1:     # both stored (they finished together, rare): sum them from memory
                    _reduce_store(base, 2, pid_n, pid_m, M, N, rf_ptr, out_ptr, stride_om, BN, BM)
                    gl.atomic_xchg(count_ptr + t, 0)
        else:
            gl.store(base + seg * (BN * BM) + offs, acc)
            gl.thread_barrier()
            ticket = gl.atomic_add(count_ptr + t, 1, sem="acq_rel", scope="gpu")
            if ticket == n_segs - 1:                             # the last segment sums all in segment order
                _reduce_store(base, n_segs, pid_n, pid_m, M, N, rf_ptr, out_ptr, stride_om, BN, BM)
                gl.atomic_xchg(count_ptr + t, 0)


@gluon.jit
def _consumer_sk2(w_bufs, s_bufs, x_bufs, ready, empty, lo, hi, G, TOTAL, KB, n_tiles, M, N, rf_ptr, out_ptr,
                  part_ptr, count_ptr, stride_om, MAXSEG, BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                  OVERLAP: gl.constexpr, MX: gl.constexpr, FIXUP: gl.constexpr, PEEK: gl.constexpr):
    """fp4_gemm_wide256_sk._consumer_sk (the same layouts and step loop) with `_finish_segment2`."""
    it0 = 0
    for t in range(lo // KB, (hi - 1) // KB + 1):
        k_lo = gl.maximum(lo, t * KB)
        n = gl.minimum(hi, (t + 1) * KB) - k_lo
        acc = _segment256(w_bufs, s_bufs, x_bufs, ready, empty, it0, k_lo - t * KB, n, BN, BM, STAGES, OVERLAP, MX)
        it0 += n
        c_first = _cta_of(t * KB, G, TOTAL)
        n_segs = _cta_of(t * KB + KB - 1, G, TOTAL) - c_first + 1
        _finish_segment2(acc, t, gl.program_id(0) - c_first, n_segs, n_tiles, M, N, rf_ptr, out_ptr, part_ptr,
                         count_ptr, stride_om, MAXSEG, BN, BM, FIXUP, PEEK)


@gluon.jit(do_not_specialize=["M", "N", "KB", "n_tiles", "TOTAL", "MAXSEG"])
def _fp4_gemm_wide256_sk2_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, M, N, KB, n_tiles,
                                 TOTAL, stride_om, MAXSEG, BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                                 OVERLAP: gl.constexpr, MX: gl.constexpr, FIXUP: gl.constexpr = True,
                                 PEEK: gl.constexpr = True):
    G = gl.num_programs(0)
    c = gl.program_id(0)
    lo = (c * TOTAL) // G
    hi = ((c + 1) * TOTAL) // G
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    SW_STEP: gl.constexpr = 1 if MX else 2
    gl.warp_specialize([
        (_consumer_sk2, (w_bufs, s_bufs, x_bufs, ready, empty, lo, hi, G, TOTAL, KB, n_tiles, M, N, rf_ptr, out_ptr,
                         part_ptr, count_ptr, stride_om, MAXSEG, BN, BM, STAGES, OVERLAP, MX, FIXUP, PEEK)),
        (_producer_sk, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, lo, hi, KB, n_tiles, BN, BM,
                        SW_STEP, STAGES)),
    ], [1], [24])


def segments_per_tile(total: int, grid: int, kb: int) -> list[int]:
    """How many CTA ranges [c total / grid, (c + 1) total / grid) each tile's kb iterations meet (the kernel's
    `_cta_of` arithmetic)."""
    def cta_of(g):
        return ((g + 1) * grid - 1) // total
    return [cta_of(t * kb + kb - 1) - cta_of(t * kb) + 1 for t in range(total // kb)]


def default_grid(total: int, kb: int, ctas: int) -> int:
    """The grid: the largest one within 5% of `ctas` (every resident CTA) that splits no tile more than twice (every
    split tile finished in registers), else `ctas`; never so large that a range holds fewer than 2 K steps."""
    top = max(1, min(ctas, total // 2))
    for g in range(top, max(1, int(top * 0.95)) - 1, -1):
        if max(segments_per_tile(total, g, kb)) <= 2:
            return g
    return top


def fp4_matmul_wide256_sk2(x2: torch.Tensor, w: HopperFP4, config: Wide256Config | None = None,
                           out: torch.Tensor | None = None, grid: int = 0, fixup: bool = True,
                           peek: bool = True) -> torch.Tensor:
    """fp4_matmul_wide256_sk with the register-side two-segment fix-up: `grid` CTAs (0: `default_grid` over every
    resident CTA, SMs x `config.ctas_per_sm`); `config.split_k` is ignored. `fixup=False` is a timing probe whose
    split tiles are wrong (module docstring); `peek=False` (tests) sends every two-segment tile through the path of
    two segments finishing together (both partials stored, summed from memory)."""
    from trace_rl.kernels.fp4_gemm import tile_counters

    c, x2, M, np_, kp, bm, dev = checked_inputs("fp4_matmul_wide256_sk2", x2, w, config)
    N = w.n
    n_tiles, m_tiles, kb = triton.cdiv(np_, c.block_n), triton.cdiv(M, bm), kp // BK
    total = n_tiles * m_tiles * kb
    g = max(1, min(grid, total // 2)) if grid else default_grid(total, kb, _sm_count(dev) * c.ctas_per_sm(bm))
    maxseg = max_segments(total, g, kb)
    out = torch.empty(M, N, device=x2.device, dtype=torch.bfloat16) if out is None else out
    if out.shape != (M, N) or out.stride(1) != 1:
        raise ValueError(f"fp4_matmul_wide256_sk2: out must be [{M}, {N}] with unit column stride")
    part = torch.empty(n_tiles * m_tiles * maxseg * c.block_n * bm, device=x2.device, dtype=torch.float32)
    counters = tile_counters(x2.device, n_tiles * m_tiles)
    wl, sl, xl = shared_layouts(bm)
    w_desc = TensorDescriptor(w.values, [kp // COLS, np_ // ROWS, 256], [256, w.values.stride(0), 1],
                              [1, c.block_n // ROWS, 256], wl)
    scales = w.scales.view(torch.int32)
    s_desc = TensorDescriptor(scales, list(scales.shape), list(scales.stride()), [c.block_n, SCALE_BOX_WORDS], sl)
    x_desc = TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [bm, BK], xl)
    _fp4_gemm_wide256_sk2_kernel[(g, )](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters, M, N, kb, n_tiles, total, out.stride(0), maxseg,
        BN=c.block_n, BM=bm, STAGES=c.slots(bm), OVERLAP=c.overlap, MX=w.fmt == "mxfp4", FIXUP=fixup, PEEK=peek,
        num_warps=c.num_warps, maxnreg=c.maxnreg)
    return out
