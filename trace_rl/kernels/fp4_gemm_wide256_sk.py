"""Stream-K schedule of the 256-token Gluon FP4 GEMM (fp4_gemm_wide256.py; issue 15, opt-in, not dispatched).

Why: at 128 weight rows x 256 tokens per CTA and one CTA per SM, the issue's 4096 x 12288 (K x N) at M = 256 has 96
output tiles for 132 SMs (73% of the machine), and at M = 512 192 tiles (1.45 waves); split-K does not fix either
(96 x 2 = 192 CTAs is again 1.45 waves). Here the grid is one CTA per SM and the work is the flat list of (tile, K
step) iterations, tile-major (tile = token tile x N tiles + N tile: neighbouring CTAs share the activation tile in
L2), cut into G equal contiguous ranges [c T / G, (c + 1) T / G): every CTA does the same number of K steps (+-1), a
range covers the tail of one tile, whole tiles and the head of another.

One warp_specialize for the whole range, so the ring never drains at a tile boundary: the producer warp streams the
range's K steps back to back (each step's tile and K coordinates from its flat index); the consumer warpgroups loop
over the range's tile segments and, after a segment's last wgmma, finish it inside the partition while the
producer is already loading the next segment: a tile covered by one segment is stored directly (x row factor); a
tile split over n CTAs has each segment's fp32 partial stored at [tile, segment], an acq_rel ticket, and the last
arriving segment adds the n partials in segment order from zeros: deterministic, no
waiting on another CTA (no spin: nothing can deadlock whatever the residency), the same adds as
fp4_gemm_gluon_epilogue._finish at SPLIT_K = n. Segment s of tile t is the CTA index minus the first CTA covering
t, so partials and the segment count follow from the flat ranges alone.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
)
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
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4


@gluon.jit
def _cta_of(g, G, TOTAL):
    """The CTA whose range [c TOTAL / G, (c + 1) TOTAL / G) holds flat iteration g."""
    return ((g + 1) * G - 1) // TOTAL


@gluon.jit
def _producer_sk(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, lo, hi, KB, n_tiles,
                 BN: gl.constexpr, BM: gl.constexpr, SW_STEP: gl.constexpr, STAGES: gl.constexpr):
    """1 warp: flat iterations lo .. hi - 1 (tile g / KB, K step g % KB) into the ring, across tile boundaries."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes + x_desc.block_type.nbytes
    BOX_STEPS: gl.constexpr = s_desc.block_type.shape[1] // SW_STEP
    for it in range(hi - lo):
        slot = it % STAGES
        mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        g = lo + it
        t = g // KB
        kb = g - t * KB
        pid_n = t % n_tiles
        tma.async_copy_global_to_shared(w_desc, [kb, pid_n * (BN // 16), 0], bar, w_bufs.index(slot))
        # the 16-byte aligned box holding step kb's scale words (fp4_gemm_wide256.scale_box)
        tma.async_copy_global_to_shared(s_desc, [pid_n * BN, (kb // BOX_STEPS) * s_desc.block_type.shape[1]], bar,
                                        s_bufs.index(slot))
        tma.async_copy_global_to_shared(x_desc, [(t // n_tiles) * BM, kb * 128], bar, x_bufs.index(slot))


@gluon.jit
def _store_tile(acc, rows, offs_m, M, N, rf_ptr, out_ptr, stride_om):
    """out[offs_m, rows] = acc x row factor: fp4_gemm_gluon_epilogue._epilogue_store's product and rounding, the
    value rounded to the output dtype before the addresses are formed."""
    n_mask = rows < N
    val = (acc * gl.expand_dims(gl.load(rf_ptr + rows, mask=n_mask, other=1.0), 1)).to(out_ptr.dtype.element_ty)
    offs = gl.expand_dims(offs_m, 0).to(gl.int64) * stride_om + gl.expand_dims(rows, 1)
    mask = gl.expand_dims(n_mask, 1) & gl.expand_dims(offs_m < M, 0)
    gl.store(out_ptr + offs, val, mask=mask)


@gluon.jit
def _finish_segment(acc, t, seg, n_segs, n_tiles, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om,
                    BN: gl.constexpr, BM: gl.constexpr, MAXSEG: gl.constexpr):
    """Tile t's segment `seg` of `n_segs`: direct store, or partial at [t, seg] + ticket, the last arriving segment
    summing the partials in segment order (its own too, reloaded: acc and the sum
    in registers at once would need 256 of them)."""
    layout: gl.constexpr = acc.type.layout
    pid_n = t % n_tiles
    pid_m = t // n_tiles
    r_loc = gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    m_loc = gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    rows = pid_n * BN + r_loc
    offs_m = pid_m * BM + m_loc
    if n_segs == 1:
        _store_tile(acc, rows, offs_m, M, N, rf_ptr, out_ptr, stride_om)
    else:
        base = part_ptr + t.to(gl.int64) * (MAXSEG * BN * BM)
        offs = gl.expand_dims(m_loc, 0) * BN + gl.expand_dims(r_loc, 1)
        gl.store(base + seg * (BN * BM) + offs, acc)
        gl.thread_barrier()                                      # every thread's partial is written
        ticket = gl.atomic_add(count_ptr + t, 1, sem="acq_rel", scope="gpu")
        if ticket == n_segs - 1:                                 # the last segment to arrive reduces
            _reduce_store(base, n_segs, pid_n, pid_m, M, N, rf_ptr, out_ptr, stride_om, BN, BM)
            gl.atomic_xchg(count_ptr + t, 0)                    # ready for the next launch


@gluon.jit
def _reduce_store(base, n_segs, pid_n, pid_m, M, N, rf_ptr, out_ptr, stride_om, BN: gl.constexpr,
                  BM: gl.constexpr):
    """out tile = (sum of the n_segs partials at `base` in segment order, from zeros) x row factor, 32 tokens at a
    time in a row-contiguous layout (coalesced loads and stores; the whole [BN, BM] sum and one partial in the MMA
    layout at once would need 256 registers and spill)."""
    NW: gl.constexpr = gl.num_warps()
    CH: gl.constexpr = 32
    BL: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [NW, 1], [1, 0])
    r_loc = gl.arange(0, BN, layout=gl.SliceLayout(0, BL))
    rows = pid_n * BN + r_loc
    n_mask = rows < N
    rf = gl.expand_dims(gl.load(rf_ptr + rows, mask=n_mask, other=1.0), 0)
    for c in range(BM // CH):
        m_loc = c * CH + gl.arange(0, CH, layout=gl.SliceLayout(1, BL))
        offs = gl.expand_dims(m_loc, 1) * BN + gl.expand_dims(r_loc, 0)
        total = gl.zeros([CH, BN], gl.float32, BL)
        for s in range(n_segs):                                  # fixed order: deterministic
            total += gl.load(base + s * (BN * BM) + offs, cache_modifier=".cg")
        offs_m = pid_m * BM + m_loc
        mask = gl.expand_dims(offs_m < M, 1) & gl.expand_dims(n_mask, 0)
        ptrs = out_ptr + gl.expand_dims(offs_m, 1).to(gl.int64) * stride_om + gl.expand_dims(rows, 0)
        gl.store(ptrs, (total * rf).to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _consumer_sk(w_bufs, s_bufs, x_bufs, ready, empty, lo, hi, G, TOTAL, KB, n_tiles, M, N, rf_ptr, out_ptr,
                 part_ptr, count_ptr, stride_om, BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                 OVERLAP: gl.constexpr, MX: gl.constexpr, MAXSEG: gl.constexpr):
    """The consumer warpgroups (fp4_gemm_wide256._consumer256's step), over the range's tile segments, each
    finished here; `it0` carries the ring position across segments."""
    t_first = lo // KB
    it0 = 0
    for t in range(t_first, (hi - 1) // KB + 1):
        k_lo = gl.maximum(lo, t * KB)
        n = gl.minimum(hi, (t + 1) * KB) - k_lo
        # n steps of tile t from ring position it0 (every slot released, every wgmma retired; OVERLAP in pairs:
        # fp4_gemm_wide256._steps256 says why)
        acc = _segment256(w_bufs, s_bufs, x_bufs, ready, empty, it0, k_lo - t * KB, n, BN, BM, STAGES, OVERLAP, MX)
        it0 += n
        c_first = _cta_of(t * KB, G, TOTAL)
        n_segs = _cta_of(t * KB + KB - 1, G, TOTAL) - c_first + 1
        _finish_segment(acc, t, gl.program_id(0) - c_first, n_segs, n_tiles, M, N, rf_ptr, out_ptr, part_ptr,
                        count_ptr, stride_om, BN, BM, MAXSEG)


@gluon.jit(do_not_specialize=["M", "N", "KB", "n_tiles", "TOTAL"])
def _fp4_gemm_wide256_sk_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, M, N, KB, n_tiles,
                                TOTAL, stride_om, BN: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                                OVERLAP: gl.constexpr, MX: gl.constexpr, MAXSEG: gl.constexpr):
    G = gl.num_programs(0)
    c = gl.program_id(0)
    lo = (c * TOTAL) // G
    hi = ((c + 1) * TOTAL) // G
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    SW_STEP: gl.constexpr = 1 if MX else 2
    gl.warp_specialize([
        (_consumer_sk, (w_bufs, s_bufs, x_bufs, ready, empty, lo, hi, G, TOTAL, KB, n_tiles, M, N, rf_ptr, out_ptr,
                        part_ptr, count_ptr, stride_om, BN, BM, STAGES, OVERLAP, MX, MAXSEG)),
        (_producer_sk, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, lo, hi, KB, n_tiles, BN, BM,
                        SW_STEP, STAGES)),
    ], [1], [24])


def max_segments(total: int, grid: int, kb: int) -> int:
    """Most CTAs one tile's KB iterations can be spread over (the partial slots per tile): ranges hold at least
    total // grid iterations."""
    return min(grid, -(-kb // max(1, total // grid)) + 1)


def fp4_matmul_wide256_sk(x2: torch.Tensor, w: HopperFP4, config: Wide256Config | None = None,
                          out: torch.Tensor | None = None, grid: int = 0) -> torch.Tensor:
    """fp4_matmul_wide256 with the stream-K schedule: `grid` CTAs (0: every resident one, SMs x
    `config.ctas_per_sm`, fewer where a range would hold fewer than 2 K steps); `config.split_k` is ignored (the
    schedule decides)."""
    from trace_rl.kernels.fp4_gemm import tile_counters

    c, x2, M, np_, kp, bm, dev = checked_inputs("fp4_matmul_wide256_sk", x2, w, config)
    N = w.n
    n_tiles, m_tiles, kb = triton.cdiv(np_, c.block_n), triton.cdiv(M, bm), kp // BK
    total = n_tiles * m_tiles * kb
    g = max(1, min(grid or _sm_count(dev) * c.ctas_per_sm(bm), total // 2))
    maxseg = max_segments(total, g, kb)
    out = torch.empty(M, N, device=x2.device, dtype=torch.bfloat16) if out is None else out
    if out.shape != (M, N) or out.stride(1) != 1:
        raise ValueError(f"fp4_matmul_wide256_sk: out must be [{M}, {N}] with unit column stride")
    part = torch.empty(n_tiles * m_tiles * maxseg * c.block_n * bm, device=x2.device, dtype=torch.float32)
    counters = tile_counters(x2.device, n_tiles * m_tiles)
    wl, sl, xl = shared_layouts(bm)
    w_desc = TensorDescriptor(w.values, [kp // COLS, np_ // ROWS, 256], [256, w.values.stride(0), 1],
                              [1, c.block_n // ROWS, 256], wl)
    scales = w.scales.view(torch.int32)
    s_desc = TensorDescriptor(scales, list(scales.shape), list(scales.stride()), [c.block_n, SCALE_BOX_WORDS], sl)
    x_desc = TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [bm, BK], xl)
    _fp4_gemm_wide256_sk_kernel[(g, )](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters, M, N, kb, n_tiles, total, out.stride(0),
        BN=c.block_n, BM=bm, STAGES=c.slots(bm), OVERLAP=c.overlap, MX=w.fmt == "mxfp4", MAXSEG=maxseg,
        num_warps=c.num_warps, maxnreg=c.maxnreg)
    return out
