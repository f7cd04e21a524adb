"""Gluon (Triton 3.6) grouped (mixture-of-experts) FP4 GEMM, W4A16 and prequantized W4A4: the warp-specialised
swap-AB pipeline of fp4_gemm_gluon.py over all experts in one persistent launch, with `fp4_grouped.fp4_grouped_matmul`'s
(Triton) inputs. `kernels.linear.fp4_grouped_linear` takes it where grouped_dispatch.py's rule says (sm_90, Triton
3.6, a shape the launcher takes, the mean rows per expert where the H200 measured it faster: TILE_RULE below).

    out[r] = x[r] @ dequant(W[e])^T (x row_scale[r]) (+ bias[e])   for offsets[e] <= r < offsets[e + 1]

Why a different schedule from the Triton grouped kernel: at the MoE rollout's decode batches (top-8 of 128 experts,
64-512 tokens: 4-32 rows per expert on average, up to ~46) the time is the experts' weight bytes, and the Triton
kernel reaches 0.36-0.45 of the read ceiling at 25-32 rows per expert (its M tile is 32: a 46-row expert decodes its
weight twice; its per-program prologue has no producer running ahead). Here:

- work items are (expert, N tile), N tile fastest (consecutive programs share an expert's activation tile in L2);
  the grid is persistent (SMs x CTAs per SM programs, item w += nprog), so one shared-memory ring (TMA producer warp,
  `ready`/`empty` mbarriers, the dense kernel's) streams across items: the producer fetches the next item's first
  steps while the consumers run this item's epilogue, and an expert with no rows costs two scalar loads;
- an item loops over its expert's token tiles of BM rows (16 / 32 / 64: the wgmma N; `token_tile` picks it from
  the mean rows per expert, TILE_RULE); when an expert's rows fit one tile, each weight element is decoded exactly once;
- the consumers decode the layout words in registers (fp4_gemm_gluon._decode_chunk: the shipped shift/mask PTX)
  as wgmma's register A operand, the activation tile [BM, BK] is the shared-memory B operand; fp32 accumulation,
  no split-K (the items fill the GPU), so the result is deterministic;
- the activation box of a tile starts at the expert's first row and may cover the next expert's rows: they are
  multiplied and masked at the store (the rows past R are TMA's zero fill);
- the stacked weight is one TMA view: words [Kp/128, E x Np/16, 256], scales [E x Np, Kp/G/4] (an N tile past the
  expert's Np reads the next expert's rows: masked at the store);
- `zero_tail`: after the items, the programs zero the rows offsets[E] .. R (capacity padding), no memset launch.

Candidates for 25-46 rows per expert (not the default until check `moe512` measures them faster):
fp4_grouped_gluon_candidates.py (`GroupedGluonConfig`: `balanced` = fp4_grouped_gluon_schedule.py's flat tile order,
`dual` = fp4_grouped_gluon_dual.py's tiles of up to 2 x BM rows decoded once).

Limits (the launcher says so): the scale rows must be 16-byte aligned for TMA (Kp / 16 bytes nvfp4, Kp / 32 mxfp4:
mxfp4 at K = 768, the Qwen3-30B-A3B down projection, has 24-byte rows and is refused: use fp4_grouped_matmul), and
padded K a multiple of the K step (256 nvfp4 / 512 mxfp4 columns).
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
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from trace_rl.kernels import fp4_gemm_gluon_ring as ring
from trace_rl.kernels import fp4_grouped_gluon_schedule as sched
from trace_rl.kernels.fp4_gemm_gluon import _consume_step, _shared_layouts
from trace_rl.kernels.fp4_gemm_gluon_config import SMEM_LIMIT, GluonConfig, scale_words
from trace_rl.kernels.fp4_grouped_gluon_candidates import CANDIDATE_BUDGET, GROUPED_CANDIDATES
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4

# Per token tile (the wgmma N) and format: one consumer warpgroup of 128 rows at 16 tokens (the dense DEFAULT: 2 CTAs
# per SM), two warpgroups at 32 / 64 (the dense WIDE configs: nvfp4 32 tokens at 80 registers and 3 slots is 2 CTAs
# per SM; the rest 1, by shared memory). Compile-only (Triton 3.6, sm_90): spill-free with unserialised wgmmas down
# to 72 registers at 32 tokens and 96 at 64, as the dense kernel (GATE_WIDE's floors).
GROUPED_GLUON = {
    "nvfp4": {16: GluonConfig(block_n=128, num_warps=4, maxnreg=128, block_m=16, stages=4),
              32: GluonConfig(block_n=128, num_warps=8, maxnreg=80, block_m=32, stages=3),
              64: GluonConfig(block_n=128, num_warps=8, maxnreg=104, block_m=64, stages=4)},
    "mxfp4": {16: GluonConfig(block_n=128, num_warps=4, maxnreg=128, block_m=16, stages=2),
              32: GluonConfig(block_n=128, num_warps=8, maxnreg=80, block_m=32, stages=3),
              64: GluonConfig(block_n=128, num_warps=8, maxnreg=104, block_m=64, stages=2)},
}

# Benchmark variants (nvfp4; benchmarks/kernels_moe_gluon.py times them beside the tiles above): 256 weight rows per
# program (two warpgroups of 128: the activation box, which TMA re-reads per N tile from L2, is shared by twice the
# weight: at 64 tokens x 128 rows it is 2 bytes per weight byte; the step's bookkeeping over twice the weights: 2.52
# SASS per weight element), and one warpgroup of 64 rows at 64 tokens (2 CTAs per SM at 96 registers, 2 slots).
# Spill-free floors (compile-only): 64x256 at 144 registers (128 spills), 32x256 at 128. "64o": the 64-token tile
# with `overlap` (one wgmma group in flight under the next chunk's decode, the slot released a chunk later and at
# the tile's end): 2.86 SASS per weight element at 112 registers, at most one full wgmma wait per step.
GLUON_VARIANTS = {"64x256": GluonConfig(block_n=256, num_warps=8, maxnreg=144, block_m=64, stages=2),
                  "32x256": GluonConfig(block_n=256, num_warps=8, maxnreg=128, block_m=32, stages=3),
                  "64x64": GluonConfig(block_n=64, num_warps=4, maxnreg=96, block_m=64, stages=2),
                  "64o": GluonConfig(block_n=128, num_warps=8, maxnreg=112, block_m=64, stages=4, overlap=True)}


# The token tile by mean rows per expert, per format (H200, 2026-12-02, benchmarks/kernels_moe_gluon.py, check
# `moegluon`; Qwen3-30B-A3B experts, top-8 of 128, W4A16, CUDA-graph medians in us, one run; mean = 8 B / 128):
#   nvfp4 gate_up [1536 x 2048]  Triton | Gluon 16 / 32 / 64 / 64x64
#     B = 128 (mean 8):    85.5 |  84.0 /  93.6 / 135.5 / 123.6
#     B = 256 (mean 16):  119.2 | 130.4 /  94.6 / 136.8 / 125.0
#     B = 409 (mean 25.6):118.6 | 167.2 / 117.6 / 141.2 / 128.0
#     B = 512 (mean 32):  148.4 | 207.8 / 158.4 / 138.1 / 126.5
#   nvfp4 down [2048 x 768]: 128: 53.2 | 52.6 (16); 256: 70.7 | 55.5 (32); 409: 72.0 | 61.1 (32);
#     512: 92.1 | 76.4 (64x64; 32: 86.4, 64: 86.5)
#   mxfp4 gate_up: 128: 77.4 | 75.9 (16); 256: 106.9 | 96.1 (32); 409: 105.7 | 116.4 (32; 64: 124.9: Triton wins);
#     512: 130.9 | 126.1 (64; 64x64 not measured for mxfp4). mxfp4 down (K = 768): refused (scale rows, K step).
# So nvfp4: 16 up to 12 rows, 32 up to 28 (between 25.6, where 32 wins, and 32, where 64x64 does), then "64x64"
# (GLUON_VARIANTS: one warpgroup of 64 weight rows x 64 tokens, 2 CTAs per SM; 8-12% faster than the 128-row
# 64-token tile at mean 32 in both GEMMs). mxfp4: 16 / 32 (up to 20 rows) / 64; between 20 and 28 rows no Gluon tile
# beat Triton. Above 32 rows nothing was measured. (Where Gluon runs at all: grouped_dispatch.py, which takes Triton
# in those two ranges.) W4A4 prequantized (row scale in the epilogue) measured with the previous rule (64 from 20 rows):
# 128: 85.3 | 83.7, 256: 118.4 | 94.2, 409: 116.4 | 138.4 (tile 64, the pick this rule replaces), 512: 149.3 | 138.9.
# Check `moe512` (benchmarks/moe512_h200.sh) times GROUPED_CANDIDATES (fp4_grouped_gluon_candidates.py: the balanced
# tile order, 3-CTA 64-row tiles, the dual-accumulator "32d") against these picks at B = 256 / 409 / 512; its
# summary's `tile_rule.<fmt>.line` is this table's line as the measured winners give it (`test_expect`: the pinned
# lists of the two tests that check this rule). Any name tile_config resolves can stand in a rule.
# Measured (2026-12-02, check `moe512`, `benchmarks/results/moe512_h200_1202f_summary.json`; gate_up + down us of the
# shipped pick -> the winner, every candidate bit-identical to the shipped tile on the GPU): nvfp4 B = 409: 174.7 ->
# 163.2 (32d), B = 512: 199.7 -> 189.3 (32d), B = 256: 32 stays (148.3); mxfp4 gate_up B = 256: 97.3 -> 92.7
# (32x64ob), B = 409: Triton 105.3 -> 100.7 (32x64ob, so TRITON_FASTER is empty), B = 512: 64 stays (124.9).
TILE_RULE = {"nvfp4": ((12, 16), (20, 32), (None, "32d")),
             "mxfp4": ((12, 16), (28, "32x64ob"), (None, 64))}


def token_tile(rows: int, n_experts: int, fmt: str = "nvfp4") -> int | str:
    """The token tile (a key of GROUPED_GLUON[fmt], GLUON_VARIANTS or GROUPED_CANDIDATES[fmt]: `tile_config`) from
    the mean rows per expert (the router's counts are on the device; the launch must not synchronise), by TILE_RULE.
    An expert above the tile loops over tiles (its weight decoded once per tile); at top-8 of 128 experts and 409-512
    tokens the largest experts hold ~37-46 rows."""
    if fmt not in TILE_RULE:
        raise ValueError(f"token_tile: format {fmt!r}; the Gluon grouped GEMM takes {', '.join(TILE_RULE)}")
    mean = rows / max(n_experts, 1)
    return next(tile for bound, tile in TILE_RULE[fmt] if bound is None or mean <= bound)


def tile_config(fmt: str, tile: int | str) -> GluonConfig:
    """The GluonConfig of token tile `tile`: GROUPED_GLUON[fmt][tile] (16 / 32 / 64), GLUON_VARIANTS[tile] or
    GROUPED_CANDIDATES[fmt][tile]."""
    if tile in GROUPED_GLUON[fmt]:
        return GROUPED_GLUON[fmt][tile]
    if tile in GLUON_VARIANTS:
        return GLUON_VARIANTS[tile]
    if tile in GROUPED_CANDIDATES[fmt]:
        return GROUPED_CANDIDATES[fmt][tile]
    raise ValueError(f"tile_config: no {fmt} tile {tile!r}; known: {list(GROUPED_GLUON[fmt])} + "
                     f"{list(GLUON_VARIANTS)} + {list(GROUPED_CANDIDATES[fmt])}")


def schedule(offsets: list[int], n_tiles: int, block_m: int, pid: int, nprog: int,
             balanced: bool = False) -> list[tuple[int, int, int]]:
    """Program `pid`'s (expert, N tile, first row) token tiles in order, as both partitions walk them (pure Python:
    the tests check the kernel's partition against it; each tile is KB ring steps): fp4_grouped_gluon_schedule's
    `expert` order, or its `balanced` one."""
    return (sched.balanced_schedule if balanced else sched.expert_schedule)(offsets, n_tiles, block_m, pid, nprog)


def tma_rows(x: torch.Tensor) -> torch.Tensor:
    """x as TMA can load it: 16-byte aligned base and rows, unit column stride (K is a multiple of the FP4 block, 16
    or 32, so a contiguous copy has aligned rows)."""
    if x.stride(1) != 1 or (x.stride(0) * 2) % 16 or x.data_ptr() % 16:
        return x.clone(memory_format=torch.contiguous_format)
    return x


@gluon.jit
def zero_tail_rows(out_ptr, off_ptr, E, R, N, stride_om, pid, nprog):
    """Rows offsets[E] .. R of out (capacity padding past the experts' rows) as zeros, spread over the programs:
    the grouped kernels' `zero_tail`, no memset launch."""
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


@gluon.jit
def _produce_tile(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, j, e, n, m0, NP, KB,
                  BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """One token tile's K steps (rows m0 .. m0 + BM of expert e's N tile n): the layout words, scale words and
    activation box of each into the ring once its slot is released. Returns the ring counter j."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes + x_desc.block_type.nbytes
    SW: gl.constexpr = s_desc.block_type.shape[1]
    n16_0 = (e * NP + n * BN) // 16
    srow = e * NP + n * BN
    for kb in range(KB):
        slot = j % STAGES
        # a fresh mbarrier counts as having completed the phase before phase 0: the first round passes
        mbarrier.wait(empty.index(slot), ((j // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        tma.async_copy_global_to_shared(w_desc, [kb * (BK // 128), n16_0, 0], bar, w_bufs.index(slot))
        tma.async_copy_global_to_shared(s_desc, [srow, kb * SW], bar, s_bufs.index(slot))
        tma.async_copy_global_to_shared(x_desc, [m0, kb * BK], bar, x_bufs.index(slot))
        j += 1
    return j


@gluon.jit
def _grouped_producer(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, off_ptr, pid, nprog, work, E,
                      NT, NP, KB, BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                      EP: gl.constexpr, BALANCED: gl.constexpr):
    """1 warp: for every token tile and K step of this program, in the consumers' order (fp4_grouped_gluon_schedule:
    `expert` or, BALANCED, `balanced`), the step's layout words, scale words and activation box into the ring."""
    j = 0
    if BALANCED:
        incl = sched.tile_prefix(off_ptr, E, NT, BM, EP)
        for t in range(pid, gl.max(incl, axis=0), nprog):
            e, mt, n = sched.locate(t, incl, NT)
            j = _produce_tile(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, j, e, n,
                              gl.load(off_ptr + e) + mt * BM, NP, KB, BN, BK, STAGES)
    else:
        for w in range(pid, work, nprog):
            e = w // NT
            n = w - e * NT
            start = gl.load(off_ptr + e)
            m_tiles = gl.cdiv(gl.maximum(gl.load(off_ptr + e + 1) - start, 0), BM)
            for mt in range(m_tiles):
                j = _produce_tile(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, j, e, n,
                                  start + mt * BM, NP, KB, BN, BK, STAGES)


@gluon.jit
def _grouped_store(acc, e, n, row0, row_end, N, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, stride_rfe, stride_be,
                   stride_om, BN: gl.constexpr, BM: gl.constexpr, HAS_ROW_SCALE: gl.constexpr,
                   HAS_BIAS: gl.constexpr):
    """acc [BN weight rows, BM tokens] -> out[tokens, rows]: x the expert's row factor (x the W4A4 row scale)
    (+ the expert's bias), in fp4_gemm._epilogue_store's order; tokens past the expert's rows are not written."""
    layout: gl.constexpr = acc.type.layout
    rows = n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    offs_m = row0 + gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    n_mask = rows < N
    m_mask = offs_m < row_end
    e64 = e.to(gl.int64)
    acc = acc * gl.expand_dims(gl.load(rf_ptr + e64 * stride_rfe + rows, mask=n_mask, other=1.0), 1)
    if HAS_ROW_SCALE:
        acc = acc * gl.expand_dims(gl.load(row_scale_ptr + offs_m, mask=m_mask, other=1.0), 0)
    if HAS_BIAS:
        acc = acc + gl.expand_dims(gl.load(bias_ptr + e64 * stride_be + rows, mask=n_mask, other=0.0)
                                   .to(gl.float32), 1)
    ptrs = out_ptr + gl.expand_dims(offs_m, 0).to(gl.int64) * stride_om + gl.expand_dims(rows, 1)
    gl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=gl.expand_dims(n_mask, 1) & gl.expand_dims(m_mask, 0))


@gluon.jit
def _consume_tile(w_raw, s_raw, x_bufs, ready, empty, j, e, n, row0, row_end, KB, N, rf_ptr, out_ptr, row_scale_ptr,
                  bias_ptr, stride_rfe, stride_be, stride_om, W_LAYOUT: gl.constexpr, A_LAYOUT: gl.constexpr,
                  S_LAYOUT: gl.constexpr, MMA: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr,
                  STAGES: gl.constexpr, MX: gl.constexpr, HAS_ROW_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr,
                  OVERLAP: gl.constexpr):
    """One token tile (rows row0 .. row0 + BM, below row_end, of expert e's N tile n): the dense consumer's
    `_consume_step` per K step (words and scales decoded in registers, wgmma with the register A operand, the slot
    released once the step's wgmmas have retired), then the epilogue store. Returns the ring counter j."""
    acc = gl.zeros([BN, BM], gl.float32, MMA)
    a_prev = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
    for kb in range(KB):
        acc, a_prev = _consume_step(w_raw, s_raw, x_bufs, ready, empty, j, kb > 0, acc, a_prev, W_LAYOUT,
                                    A_LAYOUT, S_LAYOUT, BN, BK, STAGES, OVERLAP, MX)
        j += 1
    if OVERLAP:   # the tile's last step: its wgmmas retire here, then its slot goes back to the producer
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        fence_async_shared()
        mbarrier.arrive(empty.index((j + STAGES - 1) % STAGES), count=1)
    _grouped_store(acc, e, n, row0, row_end, N, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, stride_rfe, stride_be,
                   stride_om, BN, BM, HAS_ROW_SCALE, HAS_BIAS)
    return j


@gluon.jit
def _grouped_consumer(w_bufs, s_bufs, x_bufs, ready, empty, off_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, pid,
                      nprog, work, E, NT, KB, N, stride_rfe, stride_be, stride_om, BN: gl.constexpr, BK: gl.constexpr,
                      BM: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr, HAS_ROW_SCALE: gl.constexpr,
                      HAS_BIAS: gl.constexpr, OVERLAP: gl.constexpr, EP: gl.constexpr, BALANCED: gl.constexpr):
    """The default partition (one or two warpgroups): this program's token tiles in the producer's order
    (`_consume_tile` each)."""
    NW: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = ring.mma_layout(NW, BM)
    A_LAYOUT: gl.constexpr = ring.a_layout(NW, BM)
    W_LAYOUT: gl.constexpr = ring.w_layout(NW)
    S_LAYOUT: gl.constexpr = ring.s_layout(NW, MX)
    w_raw = ring.word_views(w_bufs, BN, BK, STAGES)
    s_raw = ring.scale_views(s_bufs, BN, BK, STAGES, MX)
    j = 0
    if BALANCED:
        incl = sched.tile_prefix(off_ptr, E, NT, BM, EP)
        for t in range(pid, gl.max(incl, axis=0), nprog):
            e, mt, n = sched.locate(t, incl, NT)
            start = gl.load(off_ptr + e)
            j = _consume_tile(w_raw, s_raw, x_bufs, ready, empty, j, e, n, start + mt * BM,
                              gl.load(off_ptr + e + 1), KB, N, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, stride_rfe,
                              stride_be, stride_om, W_LAYOUT, A_LAYOUT, S_LAYOUT, mma, BN, BK, BM, STAGES, MX,
                              HAS_ROW_SCALE, HAS_BIAS, OVERLAP)
    else:   # written out, not through _consume_tile: the shipped kernels' SASS stays byte for byte as it was
        for w in range(pid, work, nprog):
            e = w // NT
            n = w - e * NT
            start = gl.load(off_ptr + e)
            end = gl.load(off_ptr + e + 1)
            m_tiles = gl.cdiv(gl.maximum(end - start, 0), BM)
            for mt in range(m_tiles):
                acc = gl.zeros([BN, BM], gl.float32, mma)
                a_prev = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
                for kb in range(KB):
                    acc, a_prev = _consume_step(w_raw, s_raw, x_bufs, ready, empty, j, kb > 0, acc, a_prev, W_LAYOUT,
                                                A_LAYOUT, S_LAYOUT, BN, BK, STAGES, OVERLAP, MX)
                    j += 1
                if OVERLAP:   # the tile's last step: its wgmmas retire here, then its slot goes back to the producer
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
                    fence_async_shared()
                    mbarrier.arrive(empty.index((j + STAGES - 1) % STAGES), count=1)
                _grouped_store(acc, e, n, start + mt * BM, end, N, rf_ptr, out_ptr, row_scale_ptr, bias_ptr,
                               stride_rfe, stride_be, stride_om, BN, BM, HAS_ROW_SCALE, HAS_BIAS)


@gluon.jit(do_not_specialize=["R", "N", "NT", "NP", "KB", "E"])
def _fp4_grouped_gluon_kernel(w_desc, s_desc, x_desc, off_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, R, N, NT, NP,
                              KB, E, stride_rfe, stride_be, stride_om, BN: gl.constexpr, BK: gl.constexpr,
                              BM: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr,
                              HAS_ROW_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr, ZERO_TAIL: gl.constexpr,
                              OVERLAP: gl.constexpr = False, EP: gl.constexpr = 1, BALANCED: gl.constexpr = False):
    pid = gl.program_id(0)
    nprog = gl.num_programs(0)
    work = E * NT
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    gl.warp_specialize([
        (_grouped_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, off_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr,
                             pid, nprog, work, E, NT, KB, N, stride_rfe, stride_be, stride_om, BN, BK, BM, STAGES,
                             MX, HAS_ROW_SCALE, HAS_BIAS, OVERLAP, EP, BALANCED)),
        (_grouped_producer, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, off_ptr, pid, nprog, work,
                             E, NT, NP, KB, BN, BK, BM, STAGES, EP, BALANCED)),
    ], [1], [24])
    if ZERO_TAIL:   # rows offsets[E] .. R (capacity padding) come back as zeros
        zero_tail_rows(out_ptr, off_ptr, E, R, N, stride_om, pid, nprog)


def grouped_descriptors(x: torch.Tensor, w: HopperFP4, c: GluonConfig):
    """TMA views of the stacked weight (experts folded into the row-block / row axis) and of the activations."""
    E = w.values.shape[0]
    np_, kp = w.padded
    bk = c.bk(w.fmt)
    wl, sl, xl = _shared_layouts(c.block_m, bk)
    values = w.values if w.values.is_contiguous() else w.values.contiguous()
    w_desc = TensorDescriptor(values, [kp // COLS, E * np_ // ROWS, 256], [256, values.stride(1), 1],
                              [bk // COLS, c.block_n // ROWS, 256], wl)
    scales = w.scales.contiguous().view(torch.int32).reshape(E * np_, -1)       # [E x Np, Kp/G/4]
    s_desc = TensorDescriptor(scales, list(scales.shape), list(scales.stride()),
                              [c.block_n, scale_words(w.fmt, bk)], sl)
    x_desc = TensorDescriptor(x, list(x.shape), list(x.stride()), [c.block_m, bk], xl)
    return w_desc, s_desc, x_desc


def _check(x: torch.Tensor, offsets: torch.Tensor, w: HopperFP4, c: GluonConfig, row_scale, bias):
    if not isinstance(w, HopperFP4) or w.values.dim() != 3 or w.fmt not in ("nvfp4", "mxfp4"):
        raise ValueError("fp4_grouped_matmul_gluon: the weight must be a stacked nvfp4 / mxfp4 HopperFP4 layout "
                         "([E, ...] values: kernels.linear.hopper_weight of prepare_expert_weights' PackedWeight)")
    E = w.values.shape[0]
    np_, kp = w.padded
    if x.dim() != 2 or x.dtype != torch.bfloat16 or x.shape[1] != w.k:
        raise ValueError(f"fp4_grouped_matmul_gluon: x must be bf16 [R, {w.k}], got {x.dtype} {tuple(x.shape)}")
    if offsets.shape != (E + 1,) or offsets.dtype != torch.int32:
        raise ValueError(f"fp4_grouped_matmul_gluon: offsets must be int32 [E + 1] = [{E + 1}], got "
                         f"{offsets.dtype} {tuple(offsets.shape)}")
    c.check(w.fmt)
    if c.block_m not in (16, 32, 64):
        raise ValueError(f"fp4_grouped_matmul_gluon: block_m (the token tile) must be 16, 32 or 64, got {c}")
    if kp % c.bk(w.fmt):
        raise ValueError(f"fp4_grouped_matmul_gluon: K = {w.k} pads to {kp}, not a multiple of the "
                         f"{c.bk(w.fmt)}-column K step ({w.fmt}); use fp4_grouped.fp4_grouped_matmul")
    if w.scales.shape[-1] % 16:
        raise ValueError(f"fp4_grouped_matmul_gluon: {w.fmt} scale rows of K = {w.k} are {w.scales.shape[-1]} "
                         f"bytes, not a multiple of 16 (TMA); use fp4_grouped.fp4_grouped_matmul")
    if c.smem_bytes(c.block_m, w.fmt) > SMEM_LIMIT:
        raise ValueError(f"fp4_grouped_matmul_gluon: {c} needs {c.smem_bytes(c.block_m, w.fmt)} bytes of shared "
                         f"memory (> {SMEM_LIMIT}): fewer stages")
    if row_scale is not None and (row_scale.shape != (x.shape[0],) or row_scale.dtype != torch.float32):
        raise ValueError(f"fp4_grouped_matmul_gluon: row_scale must be float32 [{x.shape[0]}], got "
                         f"{row_scale.dtype} {tuple(row_scale.shape)}")
    if bias is not None and (bias.shape != (E, w.n) or not bias.is_contiguous()):
        raise ValueError(f"fp4_grouped_matmul_gluon: bias must be a contiguous [{E}, {w.n}], got {tuple(bias.shape)}")
    if not (x.device == offsets.device == w.values.device):
        raise ValueError(f"fp4_grouped_matmul_gluon: x ({x.device}), offsets ({offsets.device}) and the weight "
                         f"({w.values.device}) must be on one device")
    if not (x.is_cuda and torch.cuda.get_device_capability(x.device) == (9, 0)):
        raise RuntimeError("fp4_grouped_matmul_gluon: needs x and the weight on an sm_90 GPU (wgmma, TMA)")
    if not triton.__version__.startswith("3.6"):
        raise RuntimeError(f"fp4_grouped_matmul_gluon: written against Triton 3.6's Gluon API, found "
                           f"{triton.__version__}")


def grouped_gluon_config(rows: int, n_experts: int, fmt: str, tile: int | str | None = None) -> GluonConfig:
    """The config of `tile`, default `token_tile(rows, n_experts, fmt)`."""
    return tile_config(fmt, tile or token_tile(rows, n_experts, fmt))


def fp4_grouped_matmul_gluon(x: torch.Tensor, offsets: torch.Tensor, w: HopperFP4,
                             row_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
                             out_dtype: torch.dtype = torch.bfloat16, config: GluonConfig | None = None,
                             out: torch.Tensor | None = None, zero_tail: bool = False,
                             programs: int | None = None) -> torch.Tensor:
    """`fp4_grouped.fp4_grouped_matmul`'s contract (x [R, K] bf16 rows sorted by expert, offsets [E + 1] int32 on
    the device, w stacked; W4A4: x the dequantized activation codes, `row_scale` [R] the per-token scale) on the
    Gluon pipeline -> out [R, N]; rows >= offsets[E] untouched (zeroed with `zero_tail`). `config`: default
    `grouped_gluon_config(R, E, fmt)`; `programs`: the persistent grid (default SMs x CTAs per SM). Nothing
    synchronises or allocates but `out`: CUDA-graph capturable."""
    from trace_rl.kernels.fp4_gemm_gluon import _sm_count

    E = w.values.shape[0] if isinstance(w, HopperFP4) and w.values.dim() == 3 else 0
    R = x.shape[0]
    c = config or grouped_gluon_config(R, E, w.fmt)
    _check(x, offsets, w, c, row_scale, bias)
    x = tma_rows(x)
    out = torch.empty(R, w.n, device=x.device, dtype=out_dtype) if out is None else out
    if out.shape != (R, w.n) or out.stride(1) != 1:
        raise ValueError(f"fp4_grouped_matmul_gluon: out must be [{R}, {w.n}] with unit column stride")
    if R == 0:
        return out
    np_, kp = w.padded
    nt = triton.cdiv(np_, c.block_n)
    dev = x.device.index if x.device.index is not None else torch.cuda.current_device()
    grid = programs or min(E * nt, _sm_count(dev) * c.ctas_per_sm(c.block_m, w.fmt))
    if getattr(c, "dual", False):
        from trace_rl.kernels.fp4_grouped_gluon_dual import launch_dual

        launch_dual(x, offsets, w, c, out, row_scale, bias, zero_tail, grid, grouped_descriptors(x, w, c))
        return out
    w_desc, s_desc, x_desc = grouped_descriptors(x, w, c)
    _fp4_grouped_gluon_kernel[(grid,)](
        w_desc, s_desc, x_desc, offsets, w.row_factor, out,
        row_scale if row_scale is not None else w.row_factor, bias if bias is not None else w.row_factor,
        R, w.n, nt, np_, kp // c.bk(w.fmt), E, w.row_factor.stride(0), w.n if bias is not None else 0,
        out.stride(0), BN=c.block_n, BK=c.bk(w.fmt), BM=c.block_m, STAGES=c.stages, MX=w.fmt == "mxfp4",
        HAS_ROW_SCALE=row_scale is not None, HAS_BIAS=bias is not None, ZERO_TAIL=zero_tail, OVERLAP=c.overlap,
        EP=triton.next_power_of_2(E), BALANCED=getattr(c, "balanced", False), num_warps=c.num_warps,
        maxnreg=c.maxnreg)
    return out


def gate_case(fmt: str, c: GluonConfig, budget: float, row_scale: bool = False):
    """The compile-gate case (sass_gate.py) of token tile `c.block_m`: the K loop (the innermost loop of the
    persistent item / token-tile loops) must keep the decode in registers (register-A HGMMA, no STS/LDSM) and spill
    nothing."""
    from trace_rl.kernels.sass_gate import GateCase

    bk = c.bk(fmt)
    wl, sl, xl = _shared_layouts(c.block_m, bk)
    sig = dict(w_desc=f"tensordesc<i32[{bk // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
               s_desc=f"tensordesc<i32[{c.block_n}, {scale_words(fmt, bk)}],{sl!r}>",
               x_desc=f"tensordesc<bf16[{c.block_m}, {bk}],{xl!r}>", off_ptr="*i32", rf_ptr="*fp32",
               out_ptr="*bf16", row_scale_ptr="*fp32", bias_ptr="*fp32", R="i32", N="i32", NT="i32", NP="i32",
               KB="i32", E="i32", stride_rfe="i32", stride_be="i32", stride_om="i32")
    consts = dict(BN=c.block_n, BK=bk, BM=c.block_m, STAGES=c.stages, MX=fmt == "mxfp4", HAS_ROW_SCALE=row_scale,
                  HAS_BIAS=row_scale, ZERO_TAIL=True, OVERLAP=c.overlap, EP=128, BALANCED=getattr(c, "balanced", False))
    return GateCase(f"grouped gluon {fmt} {c.block_m}x{c.block_n}x{bk} w{c.num_warps}s{c.stages} r{c.maxnreg}"
                    f"{' overlap' if c.overlap else ''}{' balanced' if getattr(c, 'balanced', False) else ''}"
                    f"{' w4a4 bias' if row_scale else ''}", _fp4_grouped_gluon_kernel, sig, consts, c.num_warps, 1,
                    c.block_n * bk / (32 * c.num_warps), budget,
                    ("off_ptr", "rf_ptr", "out_ptr", "row_scale_ptr", "bias_ptr", "stride_om", "stride_rfe"),
                    max_full_waits=1 if c.overlap else bk // COLS, options=(("maxnreg", c.maxnreg), ), innermost=True,
                    require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE"))


# Compile gate (Triton 3.6, sm_90; SASS per weight element of the K loop, the innermost loop of the persistent item /
# token-tile loops): nvfp4 2.53 (16 tokens, one warpgroup) / 2.73 (32) / 2.75 (64), mxfp4 2.22 / 2.39 / 2.39 -- the
# dense kernel's (2.52-2.77 / 2.38-2.43): the item and tile bookkeeping stays out of the K loop. Register-A HGMMA, no
# STS/LDSM in the loop, no spills anywhere (the producer warp at 24 registers included). Budgets: + ~5%.
GATE_BUDGET = {"nvfp4": {16: 2.7, 32: 2.9, 64: 2.9}, "mxfp4": {16: 2.6, 32: 2.55, 64: 2.55}}



def sass_gate_cases():
    if not triton.__version__.startswith("3.6"):
        return []
    return [gate_case(f, c, GATE_BUDGET[f][bm]) for f in ("nvfp4", "mxfp4") for bm, c in GROUPED_GLUON[f].items()] + \
        [gate_case("nvfp4", GROUPED_GLUON["nvfp4"][32], GATE_BUDGET["nvfp4"][32], row_scale=True)] + \
        [gate_case("nvfp4", c, 2.95) for c in GLUON_VARIANTS.values()] + \
        [_candidate_gate(f, c) for f in GROUPED_CANDIDATES for c in GROUPED_CANDIDATES[f].values()]


def _candidate_gate(fmt, c):
    """A GROUPED_CANDIDATES config's gate case (dual: fp4_grouped_gluon_dual's; overlap: the in-flight A-register
    hazard check on)."""
    import dataclasses

    from trace_rl.kernels.fp4_grouped_gluon_candidates import DUAL_BUDGET
    from trace_rl.kernels.fp4_grouped_gluon_dual import gate_case as dual_case

    if c.dual:
        return dual_case(fmt, c, DUAL_BUDGET[fmt])
    return dataclasses.replace(gate_case(fmt, c, CANDIDATE_BUDGET[fmt]), a_in_flight=c.overlap)
