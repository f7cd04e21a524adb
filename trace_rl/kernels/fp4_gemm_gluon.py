"""Gluon (Triton 3.6 `triton.experimental.gluon`) warp-specialised FP4 W4A16 / W4A4 GEMM (issue 15): M <= 16 (the
path `fp4_linear` takes there on sm_90), and opt-in wide token tiles (32 / 64 / 128 tokens as the wgmma N) for
M = 64 .. 512.

out[M, N] = x[M, K] @ dequant(W)^T, with W in the Hopper FP4 layout (hopper_fp4.py, nvfp4 or mxfp4), as
`fp4_gemm.py` computes it, but organised against the latency that bounds that kernel at M <= 16 (docs/benchmarks.md,
"What bounds them": each warp waits for its cp.async stage, a barrier, the LDS of the packed words and a dependent
decode chain before its wgmma, with only 12 warps per SM to hide it):

- a producer partition (1 warp, 24 registers) streams each K step's layout words, scale words and activation tile
  with TMA into a STAGES-deep shared-memory ring, one `ready` mbarrier (expect-tx) per slot, waiting only on the
  slot's `empty` mbarrier; it runs ahead of the consumer by up to STAGES steps, so the bytes in flight per SM no
  longer depend on how far the decode has got;
- the default partition (the consumers: one or two warpgroups, `GluonConfig.num_warps`) waits on `ready`, loads its
  words (LDS.128: a thread's four words are its wgmma A fragment over 8 K-slices, hopper_fp4.py), decodes them with
  the shipped shift/mask PTX (fp4_decode._DECODE_BODY) into registers, and runs wgmma with the decoded weight as the
  register A operand (swap-AB: weight rows are the MMA M, the BM tokens the MMA N, the activation tile the shared-
  memory B operand); after the step's wgmmas complete it fences and arrives on `empty` (with `overlap`, one wgmma
  group stays in flight under the next chunk's decode, and a slot is released one chunk later).

One K step is 256 nvfp4 / 512 mxfp4 columns (two / four 128-column decode chunks, decoded in pairs): the scale tile
[BN rows, 16 bytes] is TMA's narrowest box (a byte per 16 nvfp4 or 32 mxfp4 columns). K is split over SPLIT_K
programs per N tile; the split-K reduction is the shipped kernel's deterministic one (`fp4_gemm.finish_tile`'s
scheme: partials stored, an acq_rel ticket, the last program adds the partials in split order), so the result does
not depend on which program finished last.

Past 16 tokens (`config_for`, WIDE): the decode is per weight element whatever the token tile, so a wider wgmma N
(BM = 32 / 64 / 128) spreads it over more tokens; M beyond the tile is the grid's third axis (token tiles, each with
its own split-K partials and ticket). The accumulator grows as BM / 2 fp32 registers per thread per 64 weight rows,
so the wide configs run two consumer warpgroups of 64 rows each.

M <= 16 is shipped (`SMALL_M`, the `fin` kernel `_fp4_gemm_ws_fin_kernel`: 64-row tiles, 512-column steps, the
fast split-K epilogue, W4A4 row scales and bias, programmatic dependent launch; fp4_gemm_gluon_epilogue.py states
the PDL contract): `kernels.linear` takes it for M <= 16 on sm_90 (`gemm_dispatch.small_m_path`), and the wide
tiles on the same `fin` kernel (`mid_m_config`) at 16 < M <= the weight's `gemm_dispatch.GLUON_MID_M` entry.
Gluon has no interpreter, so this runs only on an sm_90 GPU; its compile-gate cases (fp4_gemm_gluon_gate.py)
compile it for sm_90 on any machine.
"""

from __future__ import annotations

import functools

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

from trace_rl.kernels import fp4_gemm_gluon_ring as ring
from trace_rl.kernels.fp4_decode import _DECODE_BODY, _MX_SCALE, _NV_SCALE
from trace_rl.kernels.fp4_gemm_gluon_config import (  # noqa: F401 (re-exported: the launcher's configs)
    DEFAULT,
    SMALL_M,
    SMEM_LIMIT,
    TOKEN_TILES,
    WIDE,
    WIDE_OVERLAP,
    GluonConfig,
    auto_split,
    config_for,
    scale_words,
    small_m_fits,
    step_k,
)
from trace_rl.kernels.fp4_gemm_gluon_epilogue import _finish, _finish_fast, _gdc_launch, _gdc_wait  # noqa: F401 (re-exported)
from trace_rl.kernels.fp_bits import bf16_halves
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4

DECODE_ASM_TEXT = gl.constexpr(_DECODE_BODY)
NV_SCALE_ASM = gl.constexpr(_NV_SCALE)
MX_SCALE_ASM = gl.constexpr(_MX_SCALE)


@gluon.jit
def _producer(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, n16_0, row0, m0, kb_lo, n_iters,
              BK: gl.constexpr, STAGES: gl.constexpr):
    """1 warp: TMA of step `kb_lo + it`'s words [BK/128, BN/16, 256], scale words [BN, 4] (nvfp4: BK = 256, a byte
    per 16 columns; mxfp4: BK = 512, a byte per 32) and activations [BM, BK] (tokens m0 ..) into slot it % STAGES
    once the consumer has released it."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes + x_desc.block_type.nbytes
    for it in range(n_iters):
        slot = it % STAGES
        # a fresh mbarrier counts as having completed the phase before phase 0: the first round passes
        mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, nbytes)
        kb = kb_lo + it
        tma.async_copy_global_to_shared(w_desc, [kb * (BK // 128), n16_0, 0], bar, w_bufs.index(slot))
        tma.async_copy_global_to_shared(s_desc, [row0, kb * s_desc.block_type.shape[1]], bar, s_bufs.index(slot))
        tma.async_copy_global_to_shared(x_desc, [m0, kb * BK], bar, x_bufs.index(slot))


@gluon.jit
def _decode_chunk(w, sw, W_LAYOUT: gl.constexpr, A_LAYOUT: gl.constexpr, BN: gl.constexpr, MX: gl.constexpr):
    """One 128-column chunk: layout words `w` [BN/16, 2, 8, 4, 2, 2] (n16, h, g, t, j, ii: word i = 2j + ii of lane
    4g + t, rows 16 n16 + 8h + g) and scale words, loaded from the ring -> the wgmma A operand [BN, 128] bf16 =
    code x 2**-126 x pre-biased scale (exact), in registers. Word i holds K-slices 2i (slots A, B) and 2i + 1 (C, D).
    nvfp4: `sw` [BN/16, 2, 8, 1, 2] (n16, h, g, -, j: byte b of word j is K-slice 4j + b), so slice 2i's scale is
    byte 2 ii of word j and slice 2i + 1's byte 2 ii + 1; mxfp4: `sw` [BN/16, 2, 8, 1] (byte i covers slices 2i and
    2i + 1)."""
    if MX:
        p0, p1, p2, p3 = gl.inline_asm_elementwise(MX_SCALE_ASM, "=r,=r,=r,=r,r", [sw],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                                   pack=1)
        se = gl.convert_layout(gl.join(gl.join(p0, p2), gl.join(p1, p3)), W_LAYOUT, assert_trivial=True)   # [j, ii]
        so = se
    else:
        p0, p1, p2, p3 = gl.inline_asm_elementwise(NV_SCALE_ASM, "=r,=r,=r,=r,r", [sw],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                                   pack=1)
        se = gl.convert_layout(gl.join(p0, p2), W_LAYOUT, assert_trivial=True)
        so = gl.convert_layout(gl.join(p1, p3), W_LAYOUT, assert_trivial=True)
    se = gl.broadcast(se, w)[0]
    so = gl.broadcast(so, w)[0]
    a, b, c, d = gl.inline_asm_elementwise(DECODE_ASM_TEXT, "=r,=r,=r,=r,r,r,r", [w, se, so],
                                           dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    a0, a1 = bf16_halves(a)
    b0, b1 = bf16_halves(b)
    c0, c1 = bf16_halves(c)
    d0, d1 = bf16_halves(d)
    r0 = gl.join(gl.join(a0, a1), gl.join(b0, b1))            # [..., e, c]
    r1 = gl.join(gl.join(c0, c1), gl.join(d0, d1))
    v = gl.join(r0, r1)                                       # [n16, h, g, t, j, ii, e, c, r]
    v = gl.permute(v, (0, 1, 2, 4, 5, 8, 7, 3, 6))            # [n16, h, g, j, ii, r, c, t, e]
    v = gl.reshape(v, [BN, 128])       # row 16 n16 + 8h + g, column 64j + 32ii + 16r + 8c + 2t + e
    return gl.convert_layout(v, A_LAYOUT, assert_trivial=True)


@gluon.jit
def _consume_step(w_raw, s_raw, x_bufs, ready, empty, it, release_prev, acc, a_prev, W_LAYOUT: gl.constexpr,
                  A_LAYOUT: gl.constexpr, S_LAYOUT: gl.constexpr, BN: gl.constexpr, BK: gl.constexpr,
                  STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr):
    """The consumer's ring step `it` (the dense and the grouped kernel's): wait for slot it % STAGES, decode its
    chunks two at a time (words and scale words of both loaded first: their LDS latency is paid once per pair, not
    again behind the first chunk's wgmma wait; ptxas then decodes the second chunk under the first one's HGMMAs) and
    run their wgmmas into `acc`. Returns (acc, a_prev).
    OVERLAP: keep one wgmma group in flight (wait(1)) so the next chunk's decode runs under it; the decoded operand of
    the in-flight group (`a_prev`) stays live until the next wait (passed through its deps); after the step's first
    wait every wgmma of step it - 1 has retired, so its slot is released there (if `release_prev`: step it - 1 was
    one of this tile's). Otherwise each chunk's wgmmas complete before the next and the slot is released at the end."""
    KC: gl.constexpr = BK // 128
    slot = it % STAGES
    mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
    s_s = s_raw.index(slot)                                    # [BN/16, 2, 8, KC(, 2)] int32
    x_s = x_bufs.index(slot)                                   # [BM, BK] bf16
    for kp in gl.static_range(KC // 2):
        w0 = w_raw.index(slot * KC + 2 * kp).load(W_LAYOUT)     # [BN/16, 2, 8, 4, 2, 2] int32
        w1 = w_raw.index(slot * KC + 2 * kp + 1).load(W_LAYOUT)
        s0 = s_s.slice(2 * kp, 1, dim=3).load(S_LAYOUT)         # [BN/16, 2, 8, 1(, 2)] int32
        s1 = s_s.slice(2 * kp + 1, 1, dim=3).load(S_LAYOUT)
        for kk in gl.static_range(2):
            if kk == 0:
                a = _decode_chunk(w0, s0, W_LAYOUT, A_LAYOUT, BN, MX)
            else:
                a = _decode_chunk(w1, s1, W_LAYOUT, A_LAYOUT, BN, MX)
            acc = warpgroup_mma(a, x_s.slice((2 * kp + kk) * 128, 128, dim=1).permute((1, 0)), acc, is_async=True)
            if OVERLAP:
                acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
                a_prev = a
                if kp + kk == 0:   # every wgmma of step it - 1 has retired: its slot can be refilled
                    fence_async_shared()
                    mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=release_prev)
            else:
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    if not OVERLAP:
        # the step's wgmmas (which read the activation tile) are complete and its words are in registers
        fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)
    return acc, a_prev


@gluon.jit
def _consumer(w_bufs, s_bufs, x_bufs, ready, empty, n_iters, BN: gl.constexpr, BK: gl.constexpr,
              BM: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr):
    """The default partition (num_warps = 4 or 8: one or two warpgroups, warp w owning weight rows 16 (w + r NW),
    r = 0 .. BN/(16 NW) - 1): per K step, decode + wgmma (`_consume_step`, OVERLAP: one wgmma group in flight);
    returns (acc [BN, BM] fp32, ) once every wgmma has retired."""
    NW: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = ring.mma_layout(NW, BM)
    A_LAYOUT: gl.constexpr = ring.a_layout(NW, BM)
    W_LAYOUT: gl.constexpr = ring.w_layout(NW)
    S_LAYOUT: gl.constexpr = ring.s_layout(NW, MX)
    w_raw = ring.word_views(w_bufs, BN, BK, STAGES)          # [STAGES x BK/128, BN/16, 2, 8, 4, 2, 2] int32
    s_raw = ring.scale_views(s_bufs, BN, BK, STAGES, MX)     # [STAGES, BN/16, 2, 8, BK/128(, 2)] int32
    acc = gl.zeros([BN, BM], gl.float32, mma)
    a_prev = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
    for it in range(n_iters):
        acc, a_prev = _consume_step(w_raw, s_raw, x_bufs, ready, empty, it, it > 0, acc, a_prev, W_LAYOUT, A_LAYOUT,
                                    S_LAYOUT, BN, BK, STAGES, OVERLAP, MX)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, )


@gluon.jit(do_not_specialize=["M", "N", "KB", "SPLIT_K"])
def _fp4_gemm_ws_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, M, N, KB, SPLIT_K, stride_om,
                        BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                        OVERLAP: gl.constexpr, MX: gl.constexpr):
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)                      # token tile (M > BM)
    tile = pid_m * gl.num_programs(0) + pid_n     # this output tile's partials and split-K ticket
    kb_lo, n_iters = ring.k_range(pid_k, KB, SPLIT_K)
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    (acc, ) = gl.warp_specialize([
        (_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, BN, BK, BM, STAGES, OVERLAP, MX)),
        (_producer, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, pid_n * (BN // 16), pid_n * BN,
                     pid_m * BM, kb_lo, n_iters, BK, STAGES)),
    ], [1], [24])
    _finish(acc, pid_n, pid_m, tile, pid_k, SPLIT_K, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om, BN, BM)


@gluon.jit
def _producer_pdl(w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, n16_0, row0, m0, kb_lo, n_iters,
                  BK: gl.constexpr, STAGES: gl.constexpr):
    """`_producer` under PDL: the first STAGES steps' weight words and scales (no earlier kernel of a step writes
    the weight) are requested before `_gdc_wait`, under the previous kernel's tail; every activation tile after it
    (an earlier kernel may have written x). A slot's `ready` expects all three boxes, so the consumer is unchanged."""
    nbytes: gl.constexpr = w_desc.block_type.nbytes + s_desc.block_type.nbytes + x_desc.block_type.nbytes
    for it in range(gl.minimum(n_iters, STAGES)):        # fresh slots: no `empty` wait in the first round
        bar = ready.index(it)
        mbarrier.expect(bar, nbytes)
        kb = kb_lo + it
        tma.async_copy_global_to_shared(w_desc, [kb * (BK // 128), n16_0, 0], bar, w_bufs.index(it))
        tma.async_copy_global_to_shared(s_desc, [row0, kb * s_desc.block_type.shape[1]], bar, s_bufs.index(it))
    _gdc_wait()
    for it in range(n_iters):
        slot = it % STAGES
        bar = ready.index(slot)
        kb = kb_lo + it
        if it >= STAGES:
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(bar, nbytes)
            tma.async_copy_global_to_shared(w_desc, [kb * (BK // 128), n16_0, 0], bar, w_bufs.index(slot))
            tma.async_copy_global_to_shared(s_desc, [row0, kb * s_desc.block_type.shape[1]], bar,
                                            s_bufs.index(slot))
        tma.async_copy_global_to_shared(x_desc, [m0, kb * BK], bar, x_bufs.index(slot))


@gluon.jit(do_not_specialize=["M", "N", "KB"])
def _fp4_gemm_ws_fin_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, row_scale_ptr, bias_ptr,
                            M, N, KB, stride_om, BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr,
                            STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr, SPLIT: gl.constexpr,
                            PDL: gl.constexpr = False, HAS_ROW_SCALE: gl.constexpr = False,
                            HAS_BIAS: gl.constexpr = False):
    """The shipped small-M kernel (`GluonConfig.fin`): `_fp4_gemm_ws_kernel`'s pipeline with `_finish_fast` (SPLIT,
    the grid's second axis, a constexpr), the W4A4 row scale and the bias; PDL: launch dependents at once, weight
    prefetch before the grid-dependency wait (`_producer_pdl`), no global write before it (fp4_gemm_gluon_epilogue)."""
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    tile = pid_m * gl.num_programs(0) + pid_n
    kb_lo, n_iters = ring.k_range(pid_k, KB, SPLIT)
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    if PDL:
        _gdc_launch()    # the next GEMM's CTAs may take this one's SMs as they exit: its setup runs under our tail
        (acc, ) = gl.warp_specialize([
            (_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, BN, BK, BM, STAGES, OVERLAP, MX)),
            (_producer_pdl, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, pid_n * (BN // 16),
                             pid_n * BN, pid_m * BM, kb_lo, n_iters, BK, STAGES)),
        ], [1], [24])
    else:
        (acc, ) = gl.warp_specialize([
            (_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, BN, BK, BM, STAGES, OVERLAP, MX)),
            (_producer, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, pid_n * (BN // 16),
                         pid_n * BN, pid_m * BM, kb_lo, n_iters, BK, STAGES)),
        ], [1], [24])
    _finish_fast(acc, pid_n, pid_m, tile, pid_k, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om,
                 row_scale_ptr, bias_ptr, BN, BM, SPLIT, PDL, HAS_ROW_SCALE, HAS_BIAS)


def _shared_layouts(block_m: int, bk: int):
    """The TMA boxes' shared layouts (words, scale words, activations): one definition for the launch and the
    compile gate's signature."""
    return (gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=3),
            gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32, rank=2),
            gl.NVMMASharedLayout.get_default_for([block_m, bk], gl.bfloat16))


def _descriptors(x2: torch.Tensor, w: HopperFP4, c: GluonConfig, block_m: int):
    np_, kp = w.padded
    bk = c.bk(w.fmt)
    wl, sl, xl = _shared_layouts(block_m, bk)
    # the layout words as [Kp/128, Np/16, 256]: a box is one K step's 128-column chunks of BN/16 row blocks
    w_desc = TensorDescriptor(w.values, [kp // COLS, np_ // ROWS, 256], [256, w.values.stride(0), 1],
                              [bk // COLS, c.block_n // ROWS, 256], wl)
    scales = w.scales.view(torch.int32)                                    # [Np, Kp/64] or [Np, Kp/128]
    s_desc = TensorDescriptor(scales, list(scales.shape), list(scales.stride()),
                              [c.block_n, scale_words(w.fmt, bk)], sl)
    x_desc = TensorDescriptor(x2, list(x2.shape), list(x2.stride()), [block_m, bk], xl)
    return w_desc, s_desc, x_desc


def launch_grid(M: int, padded: tuple[int, int], c: GluonConfig, bm: int, bk: int, resident) -> tuple:
    """(N tiles, M tiles, K steps, split) of a launch over a [Np, Kp] padded weight (`HopperFP4.padded`) with M
    tokens, `bm` per program and `bk` columns per K step: the config's split_k, else `auto_split` for `resident()`
    programs at once (SMs x CTAs per SM; a callable, asked only then), evened out so no split is empty. The one
    definition for `fp4_matmul_gluon` and the benchmark probes that launch other kernels on its grid."""
    np_, kp = padded
    n_tiles, m_tiles, kb = triton.cdiv(np_, c.block_n), triton.cdiv(M, bm), kp // bk
    split = c.split_k or auto_split(n_tiles * m_tiles, kb, resident())
    return n_tiles, m_tiles, kb, triton.cdiv(kb, triton.cdiv(kb, max(1, min(split, kb))))


def split_k_scratch(device, c: GluonConfig, bm: int, grid: tuple[int, int, int], unused: torch.Tensor) -> tuple:
    """(float32 partials, tile counters) a launch on `grid` = (N tiles, split, M tiles) needs for its split-K
    reduction, or (unused, unused) (any tensor: the kernel does not touch them) when it does not split."""
    from trace_rl.kernels.fp4_gemm import tile_counters

    n_tiles, split, m_tiles = grid
    if split == 1:
        return unused, unused
    part = torch.empty(n_tiles * m_tiles * split * c.block_n * bm, device=device, dtype=torch.float32)
    return part, tile_counters(device, n_tiles * m_tiles)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def fp4_matmul_gluon(x2: torch.Tensor, w: HopperFP4, config: GluonConfig | None = None,
                     out: torch.Tensor | None = None, row_scale: torch.Tensor | None = None,
                     bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                     pdl: bool = False) -> torch.Tensor:
    """x2 [M, K] bf16 @ W^T for an nvfp4 or mxfp4 weight W in the Hopper layout -> [M, N] `out_dtype`; `config`
    defaults to `config_for(M, fmt, padded K, padded N)`. `row_scale` [M] float32 (W4A4: the nvfp4:row per-token
    scale) and `bias` [N] need a `fin` config. `pdl`: launch as a programmatic dependent of the previous kernel in
    the stream (needs a `fin` config; fp4_gemm_gluon_epilogue states the contract). Nothing is allocated but `out`
    (unless given) and the split-K partials (the caching allocator: a CUDA-graph capture's pool), nothing
    synchronises, so it can be captured. Needs an sm_90 GPU and Triton 3.6 (Gluon is version-pinned)."""
    if not isinstance(w, HopperFP4) or w.fmt not in ("nvfp4", "mxfp4") or w.values.dim() != 2:
        got = f"{w.fmt} values {tuple(w.values.shape)}" if isinstance(w, HopperFP4) else type(w).__name__
        raise ValueError(f"fp4_matmul_gluon: the weight must be a 2-D nvfp4 or mxfp4 HopperFP4 layout "
                         f"(hopper_fp4.to_hopper), got {got}")
    if x2.dim() != 2 or x2.dtype != torch.bfloat16:
        raise ValueError(f"fp4_matmul_gluon: x must be a 2-D bf16 tensor, got {x2.dtype} {tuple(x2.shape)}")
    M, K = x2.shape
    if M < 1:
        raise ValueError(f"fp4_matmul_gluon: M = {M}; needs M >= 1")
    c = config or config_for(M, w.fmt, w.padded[1], w.padded[0])
    c.check(w.fmt)
    bk = c.bk(w.fmt)
    bm = c.tile_m(M)
    if c.smem_bytes(bm, w.fmt) > SMEM_LIMIT:
        raise ValueError(f"fp4_matmul_gluon: {c} at {bm} tokens x {bk} {w.fmt} columns needs "
                         f"{c.smem_bytes(bm, w.fmt)} bytes of shared memory (> {SMEM_LIMIT}): fewer stages or a "
                         f"smaller block_m")
    if (row_scale is not None or bias is not None or pdl) and not c.fin:
        raise ValueError(f"fp4_matmul_gluon: row_scale, bias and pdl need a `fin` config (SMALL_M), got {c}")
    if K != w.k:
        raise ValueError(f"fp4_matmul_gluon: x has {K} columns, the weight {w.k}")
    if w.padded[1] % bk:
        raise ValueError(f"fp4_matmul_gluon: K = {K} pads to {w.padded[1]} layout columns, not a multiple of "
                         f"the {bk}-column K step ({w.fmt}): the scale rows ({w.scales.shape[1]} bytes) would not "
                         f"be 16-byte aligned for TMA or the last step would be partial (use fp4_matmul)")
    if not (x2.is_cuda and w.values.is_cuda and x2.device == w.values.device):
        raise ValueError("fp4_matmul_gluon: x and the weight must be on the same CUDA device")
    dev = x2.device.index if x2.device.index is not None else torch.cuda.current_device()
    if _capability(dev) != (9, 0):
        raise RuntimeError("fp4_matmul_gluon: needs an sm_90 GPU (wgmma, TMA, setmaxnreg)")
    if not triton.__version__.startswith("3.6"):
        raise RuntimeError(f"fp4_matmul_gluon: written against Triton 3.6's experimental Gluon API, found "
                           f"{triton.__version__}")
    if x2.stride(1) != 1 or (x2.stride(0) * 2) % 16 or x2.data_ptr() % 16:
        # TMA: unit column stride, 16-byte aligned base and rows (K % 16 == 0 for FP4); a fresh copy is aligned
        x2 = x2.clone(memory_format=torch.contiguous_format)
    N = w.n
    n_tiles, m_tiles, kb, split = launch_grid(M, w.padded, c, bm, bk,
                                              lambda: _sm_count(dev) * c.ctas_per_sm(bm, w.fmt))
    out = torch.empty(M, N, device=x2.device, dtype=out_dtype) if out is None else out
    if out.shape != (M, N) or out.dtype not in (torch.bfloat16, torch.float16, torch.float32) or out.stride(1) != 1:
        raise ValueError(f"fp4_matmul_gluon: out must be a bf16 / fp16 / fp32 [{M}, {N}] tensor with unit column "
                         f"stride, got {out.dtype} {tuple(out.shape)}")
    part, counters = split_k_scratch(x2.device, c, bm, (n_tiles, split, m_tiles), w.row_factor)
    w_desc, s_desc, x_desc = _descriptors(x2, w, c, bm)
    grid = (n_tiles, split, m_tiles)
    if not c.fin:
        _fp4_gemm_ws_kernel[grid](
            w_desc, s_desc, x_desc, w.row_factor, out, part, counters, M, N, kb, split, out.stride(0),
            BN=c.block_n, BK=bk, BM=bm, STAGES=c.stages, OVERLAP=c.overlap, MX=w.fmt == "mxfp4",
            num_warps=c.num_warps, maxnreg=c.maxnreg)
        return out
    if row_scale is not None and (row_scale.shape != (M, ) or row_scale.dtype != torch.float32):
        raise ValueError(f"fp4_matmul_gluon: row_scale must be float32 [{M}], got {row_scale.dtype} "
                         f"{tuple(row_scale.shape)}")
    if bias is not None and bias.shape != (N, ):
        raise ValueError(f"fp4_matmul_gluon: bias must be [{N}], got {tuple(bias.shape)}")
    _fp4_gemm_ws_fin_kernel[grid](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters,
        row_scale.contiguous() if row_scale is not None else w.row_factor,
        bias.contiguous() if bias is not None else w.row_factor, M, N, kb, out.stride(0),
        BN=c.block_n, BK=bk, BM=bm, STAGES=c.stages, OVERLAP=c.overlap, MX=w.fmt == "mxfp4", SPLIT=split,
        PDL=pdl, HAS_ROW_SCALE=row_scale is not None, HAS_BIAS=bias is not None, num_warps=c.num_warps,
        maxnreg=c.maxnreg, **({"launch_pdl": True} if pdl else {}))
    return out
