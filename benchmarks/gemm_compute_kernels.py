"""Variants of the Gluon warp-specialised FP4 GEMM (trace_rl/kernels/fp4_gemm_gluon.py) aimed at its compute part at
M <= 16, each as a full launch and a compute-only probe (benchmarks/gemm_compute.py times them; issue 15).

Why (benchmarks/results/gemm_bound_h200_1202b*: compute-only 11.9-16.8 us against a 9.3 us read floor; the consumer's
K step compiled for sm_90 by Triton 3.6, per 256 nvfp4 columns and thread):
- the integer pipe: LOP3 160 + SHF 128 + PRMT 64 + LEA 64 = 416 INT ops for 256 weights (mxfp4: 640 per 512). sm_90
  runs INT ops on 16 lanes per SM sub-partition, half a warp instruction per cycle, so a warp needs >= 832 cycles
  per nvfp4 step whatever else happens (HMUL2 128 and the HGMMAs issue elsewhere); the whole 4096x12288 weight is
  >= 4.9 us of INT pipe at 1.98 GHz with a perfectly balanced grid;
- the grid is not balanced: nvfp4 4096x12288 runs 192 CTAs (split 2) on 132 SMs with room for 2: 60 SMs do two CTAs
  (16 K steps of 128 rows) while the mean is 11.6, x1.37; mxfp4 4096x12288 runs 96 one-per-SM CTAs (36 SMs idle);
- latency each step: a named barrier at the top, the ready wait, LDS of the words, then (no overlap) a full
  `WARPGROUP.DEPBAR.LE gsb0, 0x0` after each pair of chunks, the second chunk's 16 HGMMAs issued back to back and
  drained with nothing to do, then MEMBAR.ALL.CTA + fence + a second named barrier before the slot is released. With
  1-2 consumer warps per sub-partition (2 CTAs of one warpgroup; 1 for mxfp4's 4-stage ring) nothing covers it.

Variants (`VARIANTS`; the first three run the shipped `_fp4_gemm_ws_kernel` unchanged, with a config and K step
chosen here):
- `overlap`: the launcher's own config (`config_for`) with `overlap=True`: one wgmma group stays in flight under the
  next chunk's decode (one full wait per step at most); same split, so bit-identical to the shipped launch;
- `w8_overlap`: two consumer warpgroups (64 rows each), overlap, 80 registers: 2 CTAs per SM = 4 consumer warps per
  sub-partition to hide the waits (mxfp4: 2-slot ring so two CTAs fit);
- `n64_k512`: 64-row tiles, 512-column K steps for nvfp4 too (four chunks per step: the per-step barriers, waits and
  slot release amortised over twice the weights; the scale box is 32 bytes), 2-slot ring, 80 registers, overlap:
  3 CTAs per SM and twice the tiles, so the auto split makes 384 CTAs of 4 steps (max 12 64x512 units per SM
  against 16 128x256 = 32 for the shipped nvfp4 4096x12288 launch at equal bytes: x0.75 of the busiest SM's work);
- `imad_overlap` (nvfp4): `overlap` with the scale pairs' multiply-add by IMAD (FMA pipe) instead of LEA (INT pipe):
  its own copy of the consumer and kernel (`_consumer_v`, `_fp4_gemm_ws_v_kernel`), same bits; INT ops per weight
  1.62 -> 1.38. A test of the INT-pipe bound: if its compute-only time drops against `overlap`, the pipe binds.

The compute-only probe (`compute_only`) is gemm_bound_gluon's (activations through the TMA ring, words decoded from
registers, the same wgmmas and split-K epilogue) with the variant's K step, tile and `overlap` schedule. Gluon has no
interpreter: everything here runs on an sm_90 GPU only; `gate_cases` compiles it for sm_90 on any machine
(benchmarks/gemm_compute.py --dry).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
from trace_rl.kernels.fp4_decode import _DECODE_BODY, _NV_SCALE
from trace_rl.kernels.fp4_gemm_gluon import (
    DEFAULT,
    MX_SCALE_ASM,
    NV_SCALE_ASM,
    GluonConfig,
    _finish,
    _fp4_gemm_ws_kernel,
    _producer,
    _shared_layouts,
    config_for,
    launch_grid,
    scale_words,
    split_k_scratch,
)
from trace_rl.kernels.fp_bits import bf16_halves
from trace_rl.kernels.hopper_fp4 import COLS, ROWS

SMEM_PER_SM = 228 * 1024
SMEM_LIMIT = 227 * 1024


@dataclass(frozen=True)
class Variant:
    """A Gluon config and K step per format (None: the launcher's `config_for(M, fmt)` and `step_k(fmt)`)."""

    name: str
    nv: GluonConfig | None
    mx: GluonConfig | None
    bk_nv: int = 256
    bk_mx: int = 512
    overlap_default: bool = False      # with config None: config_for(M, fmt) with overlap=True
    imad: bool = False                 # nvfp4 scale pairs by IMAD (FMA pipe) instead of LEA (INT pipe)
    fmts: tuple = ("nvfp4", "mxfp4")

    def config(self, M: int, fmt: str) -> GluonConfig:
        c = self.nv if fmt == "nvfp4" else self.mx
        if c is None:    # the launcher's config before SMALL_M shipped (DEFAULT at M <= 16): these probes' baseline
            c = DEFAULT if M <= 16 else config_for(M, fmt)
            if self.overlap_default:
                c = replace(c, overlap=True)
        return c

    def bk(self, fmt: str) -> int:
        return self.bk_nv if fmt == "nvfp4" else self.bk_mx


SHIPPED = Variant("shipped", None, None)
VARIANTS = (
    Variant("overlap", None, None, overlap_default=True),
    Variant("w8_overlap", GluonConfig(num_warps=8, maxnreg=80, overlap=True),
            GluonConfig(num_warps=8, maxnreg=80, overlap=True, stages=2)),
    Variant("n64_k512", GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True),
            GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True), bk_nv=512),
    Variant("imad_overlap", None, None, overlap_default=True, imad=True, fmts=("nvfp4", )),
)
# The shipped decode's nvfp4 scale pair is `mad.lo.u32 t, byte x 0x10001, 16, 0x70007000`: ptxas makes it a LEA (INT
# pipe, 64 of the 416 INT ops of a 256-column step). With the multiplier in a register it cannot fold (a kernel
# argument, 16 at run time), ptxas must emit IMAD, which issues on the FMA pipe: 352 INT ops per step (-15%). Same
# bits. If compute-only time drops with it, the INT pipe bounds the decode.
NV_SCALE_IMAD = gl.constexpr(_NV_SCALE.replace(", 16, 0x70007000", ", $5, 0x70007000"))
DECODE_ASM = gl.constexpr(_DECODE_BODY)
assert NV_SCALE_IMAD.value.count("$5") == 4


def smem_bytes(c: GluonConfig, bm: int, bk: int, fmt: str) -> int:
    return c.stages * (c.block_n * bk // 2 + c.block_n * scale_words(fmt, bk) * 4 + bm * bk * 2) + 1024


def ctas_per_sm(c: GluonConfig, bm: int, bk: int, fmt: str) -> int:
    by_smem = SMEM_PER_SM // (smem_bytes(c, bm, bk, fmt) + 1024)
    by_regs = 65536 // (c.maxnreg * (c.num_warps + 4) * 32)
    return max(1, min(by_smem, by_regs))


def plan(M: int, N: int, K: int, fmt: str, v: Variant, sms: int = 132) -> dict:
    """The launch `full` / `compute_only` make (pure Python, as fp4_matmul_gluon computes it with the variant's K
    step): config, bm, bk, grid (n tiles, split, m tiles), K steps per program, CTAs per SM, waves, and the busiest
    SM's weight elements (programs placed round-robin, as the resident grid is)."""
    from trace_rl.kernels.hopper_fp4 import padded_shape

    c = v.config(M, fmt)
    c.check()
    bk = v.bk(fmt)
    bm = c.tile_m(M)
    np_, kp = padded_shape(N, K)
    if kp % bk:
        raise ValueError(f"{v.name}: K = {K} pads to {kp}, not a multiple of the {bk}-column step")
    if smem_bytes(c, bm, bk, fmt) > SMEM_LIMIT:
        raise ValueError(f"{v.name}: {smem_bytes(c, bm, bk, fmt)} bytes of shared memory")
    ctas = ctas_per_sm(c, bm, bk, fmt)
    n_tiles, m_tiles, kb, split = launch_grid(M, (np_, kp), c, bm, bk, lambda: sms * ctas)
    per = triton.cdiv(kb, split)
    programs = n_tiles * split * m_tiles
    busiest = triton.cdiv(programs, sms) * per * c.block_n * bk
    return dict(config=c, bm=bm, bk=bk, grid=(n_tiles, split, m_tiles), kb=kb, steps_per_program=per,
                programs=programs, ctas_per_sm=ctas, waves=round(programs / (sms * ctas), 3),
                busiest_sm_elements=busiest, mean_sm_elements=np_ * kp * m_tiles // sms,
                smem_bytes=smem_bytes(c, bm, bk, fmt))


def _descriptors(x2, w, c: GluonConfig, bm: int, bk: int):
    """fp4_gemm_gluon._descriptors with the K step `bk` (its scale box: bk / 64 or bk / 128 words per row)."""
    from trace_rl.kernels.fp4_gemm_gluon import _descriptors as descriptors

    return descriptors(x2, w, replace(c, block_k=bk), bm)


def _launch_args(x2, w, v: Variant, out):
    import torch

    M, K = x2.shape
    if x2.dtype != torch.bfloat16 or x2.stride(1) != 1 or x2.data_ptr() % 16 or (x2.stride(0) * 2) % 16:
        raise ValueError("x must be a contiguous, 16-byte aligned bf16 [M, K]")
    if out.shape != (M, w.n) or out.dtype != torch.bfloat16 or out.stride(1) != 1:
        raise ValueError(f"out must be a bf16 [{M}, {w.n}] tensor with unit column stride")
    sms = torch.cuda.get_device_properties(x2.device).multi_processor_count
    p = plan(M, w.n, K, w.fmt, v, sms)
    c, bm, bk = p["config"], p["bm"], p["bk"]
    part, counters = split_k_scratch(x2.device, c, bm, p["grid"], w.row_factor)
    return p, _descriptors(x2, w, c, bm, bk), part, counters


def full(x2, w, v: Variant, out):
    """out = x2 @ W^T with the shipped kernel under the variant's config and K step. Returns (kernel, plan)."""
    p, (w_desc, s_desc, x_desc), part, counters = _launch_args(x2, w, v, out)
    c = p["config"]
    if v.imad:
        kern = _fp4_gemm_ws_v_kernel[p["grid"]](
            w_desc, s_desc, x_desc, w.row_factor, out, part, counters, x2.shape[0], w.n, p["kb"], p["grid"][1],
            out.stride(0), 16, BN=c.block_n, BK=p["bk"], BM=p["bm"], STAGES=c.stages, OVERLAP=c.overlap,
            MX=w.fmt == "mxfp4", IMAD=True, num_warps=c.num_warps, maxnreg=c.maxnreg)
        return kern, p
    kern = _fp4_gemm_ws_kernel[p["grid"]](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters, x2.shape[0], w.n, p["kb"], p["grid"][1],
        out.stride(0), BN=c.block_n, BK=p["bk"], BM=p["bm"], STAGES=c.stages, OVERLAP=c.overlap,
        MX=w.fmt == "mxfp4", num_warps=c.num_warps, maxnreg=c.maxnreg)
    return kern, p


def compute_only(x2, w, v: Variant, out, k_steps: int | None = None):
    """The compute-only probe under the variant's launch (no weight bytes read; `out` gets garbage). `k_steps=0`:
    the same binary and grid with no K step at all (launch, barrier setup, warp specialisation, split-K partials,
    tickets and the fixed-order reduction: the fixed cost the K loop adds to). Returns (kernel, plan)."""
    p, (w_desc, s_desc, x_desc), part, counters = _launch_args(x2, w, v, out)
    c = p["config"]
    kern = _compute_ws_kernel[p["grid"]](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters, x2.shape[0], w.n,
        p["kb"] if k_steps is None else k_steps, p["grid"][1],
        out.stride(0), 16, BN=c.block_n, BK=p["bk"], BM=p["bm"], STAGES=c.stages, OVERLAP=c.overlap,
        MX=w.fmt == "mxfp4", IMAD=v.imad, num_warps=c.num_warps, maxnreg=c.maxnreg)
    return kern, p


@gluon.jit
def _decode_chunk_v(w, sw, mult, W_LAYOUT: gl.constexpr, A_LAYOUT: gl.constexpr, BN: gl.constexpr,
                    MX: gl.constexpr, IMAD: gl.constexpr):
    """fp4_gemm_gluon._decode_chunk; IMAD (nvfp4): the scale pairs' multiplier from the register tensor `mult`."""
    if MX:
        p0, p1, p2, p3 = gl.inline_asm_elementwise(MX_SCALE_ASM, "=r,=r,=r,=r,r", [sw],
                                                   dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True,
                                                   pack=1)
        se = gl.convert_layout(gl.join(gl.join(p0, p2), gl.join(p1, p3)), W_LAYOUT, assert_trivial=True)
        so = se
    else:
        if IMAD:
            p0, p1, p2, p3 = gl.inline_asm_elementwise(NV_SCALE_IMAD, "=r,=r,=r,=r,r,r", [sw, mult],
                                                       dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                       is_pure=True, pack=1)
        else:
            p0, p1, p2, p3 = gl.inline_asm_elementwise(NV_SCALE_ASM, "=r,=r,=r,=r,r", [sw],
                                                       dtype=(gl.int32, gl.int32, gl.int32, gl.int32),
                                                       is_pure=True, pack=1)
        se = gl.convert_layout(gl.join(p0, p2), W_LAYOUT, assert_trivial=True)
        so = gl.convert_layout(gl.join(p1, p3), W_LAYOUT, assert_trivial=True)
    se = gl.broadcast(se, w)[0]
    so = gl.broadcast(so, w)[0]
    a, b, c, d = gl.inline_asm_elementwise(DECODE_ASM, "=r,=r,=r,=r,r,r,r", [w, se, so],
                                           dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=True, pack=1)
    a0, a1 = bf16_halves(a)
    b0, b1 = bf16_halves(b)
    c0, c1 = bf16_halves(c)
    d0, d1 = bf16_halves(d)
    r0 = gl.join(gl.join(a0, a1), gl.join(b0, b1))
    r1 = gl.join(gl.join(c0, c1), gl.join(d0, d1))
    v = gl.join(r0, r1)
    v = gl.permute(v, (0, 1, 2, 4, 5, 8, 7, 3, 6))
    v = gl.reshape(v, [BN, 128])
    return gl.convert_layout(v, A_LAYOUT, assert_trivial=True)


@gluon.jit
def _consumer_v(w_bufs, s_bufs, x_bufs, ready, empty, n_iters, sixteen, BN: gl.constexpr, BK: gl.constexpr,
                BM: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr,
                IMAD: gl.constexpr):
    """fp4_gemm_gluon._consumer line for line, decoding with `_decode_chunk_v` (`sixteen`: the run-time 16)."""
    NW: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = ring.mma_layout(NW, BM)
    A_LAYOUT: gl.constexpr = ring.a_layout(NW, BM)
    W_LAYOUT: gl.constexpr = ring.w_layout(NW)
    S_LAYOUT: gl.constexpr = ring.s_layout(NW, MX)
    KC: gl.constexpr = BK // 128
    w_raw = ring.word_views(w_bufs, BN, BK, STAGES)
    s_raw = ring.scale_views(s_bufs, BN, BK, STAGES, MX)
    if MX:
        mult = gl.full([BN // 16, 2, 8, 1], 0, gl.int32, S_LAYOUT) + sixteen
    else:
        mult = gl.full([BN // 16, 2, 8, 1, 2], 0, gl.int32, S_LAYOUT) + sixteen
    acc = gl.zeros([BN, BM], gl.float32, mma)
    a_prev = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        s_s = s_raw.index(slot)
        x_s = x_bufs.index(slot)
        for kp in gl.static_range(KC // 2):
            w0 = w_raw.index(slot * KC + 2 * kp).load(W_LAYOUT)
            w1 = w_raw.index(slot * KC + 2 * kp + 1).load(W_LAYOUT)
            s0 = s_s.slice(2 * kp, 1, dim=3).load(S_LAYOUT)
            s1 = s_s.slice(2 * kp + 1, 1, dim=3).load(S_LAYOUT)
            for kk in gl.static_range(2):
                if kk == 0:
                    a = _decode_chunk_v(w0, s0, mult, W_LAYOUT, A_LAYOUT, BN, MX, IMAD)
                else:
                    a = _decode_chunk_v(w1, s1, mult, W_LAYOUT, A_LAYOUT, BN, MX, IMAD)
                acc = warpgroup_mma(a, x_s.slice((2 * kp + kk) * 128, 128, dim=1).permute((1, 0)), acc,
                                    is_async=True)
                if OVERLAP:
                    acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
                    a_prev = a
                    if kp + kk == 0:
                        fence_async_shared()
                        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=it > 0)
                else:
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if not OVERLAP:
            fence_async_shared()
            mbarrier.arrive(empty.index(slot), count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, )


@gluon.jit(do_not_specialize=["M", "N", "KB", "SPLIT_K", "sixteen"])
def _fp4_gemm_ws_v_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, M, N, KB, SPLIT_K,
                          stride_om, sixteen, BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr,
                          STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr, IMAD: gl.constexpr):
    """fp4_gemm_gluon._fp4_gemm_ws_kernel with `_consumer_v`."""
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    tile = pid_m * gl.num_programs(0) + pid_n
    kb_lo, n_iters = ring.k_range(pid_k, KB, SPLIT_K)
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    (acc, ) = gl.warp_specialize([
        (_consumer_v, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, sixteen, BN, BK, BM, STAGES, OVERLAP, MX,
                       IMAD)),
        (_producer, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, pid_n * (BN // 16), pid_n * BN,
                     pid_m * BM, kb_lo, n_iters, BK, STAGES)),
    ], [1], [24])
    _finish(acc, pid_n, pid_m, tile, pid_k, SPLIT_K, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om, BN, BM)


@gluon.jit
def _x_producer(x_desc, x_bufs, ready, empty, m0, kb_lo, n_iters, BK: gl.constexpr, STAGES: gl.constexpr):
    """The shipped `_producer` without the weight: only each step's activation tile."""
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [m0, (kb_lo + it) * BK], bar, x_bufs.index(slot))


@gluon.jit
def _compute_consumer(w_bufs, s_bufs, x_bufs, ready, empty, n_iters, sixteen, BN: gl.constexpr, BK: gl.constexpr,
                      BM: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr, MX: gl.constexpr,
                      IMAD: gl.constexpr):
    """The shipped `_consumer` (both schedules: OVERLAP keeps one wgmma group in flight and releases a slot one
    chunk later) with each chunk's words and scale words taken from registers (slot 0's never-written contents,
    XORed with the step and chunk so nothing is hoisted)."""
    NW: gl.constexpr = gl.num_warps()
    mma: gl.constexpr = ring.mma_layout(NW, BM)
    A_LAYOUT: gl.constexpr = ring.a_layout(NW, BM)
    W_LAYOUT: gl.constexpr = ring.w_layout(NW)
    S_LAYOUT: gl.constexpr = ring.s_layout(NW, MX)
    KC: gl.constexpr = BK // 128
    w_raw = ring.word_views(w_bufs, BN, BK, STAGES)
    s_raw = ring.scale_views(s_bufs, BN, BK, STAGES, MX)
    w_a = w_raw.index(0).load(W_LAYOUT)
    w_b = w_raw.index(1).load(W_LAYOUT)
    s_a = s_raw.index(0).slice(0, 1, dim=3).load(S_LAYOUT)
    s_b = s_raw.index(0).slice(1, 1, dim=3).load(S_LAYOUT)
    mult = gl.full(s_a.shape, 0, gl.int32, S_LAYOUT) + sixteen
    acc = gl.zeros([BN, BM], gl.float32, mma)
    a_prev = gl.zeros([BN, 128], gl.bfloat16, A_LAYOUT)
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        x_s = x_bufs.index(slot)
        for kp in gl.static_range(KC // 2):
            w0 = w_a ^ (it + 2 * kp)
            w1 = w_b ^ (it + 2 * kp + 1)
            s0 = s_a ^ ((it + kp) & 3)
            s1 = s_b ^ ((it + kp) & 3)
            for kk in gl.static_range(2):
                if kk == 0:
                    a = _decode_chunk_v(w0, s0, mult, W_LAYOUT, A_LAYOUT, BN, MX, IMAD)
                else:
                    a = _decode_chunk_v(w1, s1, mult, W_LAYOUT, A_LAYOUT, BN, MX, IMAD)
                acc = warpgroup_mma(a, x_s.slice((2 * kp + kk) * 128, 128, dim=1).permute((1, 0)), acc,
                                    is_async=True)
                if OVERLAP:
                    acc, a_prev = warpgroup_mma_wait(num_outstanding=1, deps=(acc, a_prev))
                    a_prev = a
                    if kp + kk == 0:
                        fence_async_shared()
                        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), count=1, pred=it > 0)
                else:
                    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        if not OVERLAP:
            fence_async_shared()
            mbarrier.arrive(empty.index(slot), count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, )


@gluon.jit(do_not_specialize=["M", "N", "KB", "SPLIT_K", "sixteen"])
def _compute_ws_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, M, N, KB, SPLIT_K, stride_om,
                       sixteen, BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                       OVERLAP: gl.constexpr, MX: gl.constexpr, IMAD: gl.constexpr):
    """`_fp4_gemm_ws_kernel` with `_compute_consumer` and `_x_producer`: same ring (weight slots allocated, never
    filled), decode schedule, wgmmas and split-K epilogue; no weight bytes read."""
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    tile = pid_m * gl.num_programs(0) + pid_n
    kb_lo, n_iters = ring.k_range(pid_k, KB, SPLIT_K)
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    (acc, ) = gl.warp_specialize([
        (_compute_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, sixteen, BN, BK, BM, STAGES, OVERLAP,
                             MX, IMAD)),
        (_x_producer, (x_desc, x_bufs, ready, empty, pid_m * BM, kb_lo, n_iters, BK, STAGES)),
    ], [1], [24])
    _finish(acc, pid_n, pid_m, tile, pid_k, SPLIT_K, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om, BN, BM)


def gate_case(v: Variant, fmt: str, bm: int, mode: str = "full"):
    """A sass_gate case compiling what `full` / `compute_only` launch for (variant, format, token tile): SASS per
    weight element of the consumer's K step (elements: block_n x bk / consumer threads), registers, spills, full
    wgmma waits; budgets loose (a probe: the numbers are reported, not gated)."""
    from trace_rl.kernels.sass_gate import GateCase

    c = v.config(bm, fmt)
    bk = v.bk(fmt)
    wl, sl, xl = _shared_layouts(bm, bk)
    sig = dict(w_desc=f"tensordesc<i32[{bk // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
               s_desc=f"tensordesc<i32[{c.block_n}, {scale_words(fmt, bk)}],{sl!r}>",
               x_desc=f"tensordesc<bf16[{bm}, {bk}],{xl!r}>", rf_ptr="*fp32", out_ptr="*bf16",
               part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32", KB="i32", SPLIT_K="i32", stride_om="i32")
    consts = dict(BN=c.block_n, BK=bk, BM=bm, STAGES=c.stages, OVERLAP=c.overlap, MX=fmt == "mxfp4")
    if mode == "full" and not v.imad:
        kernel = _fp4_gemm_ws_kernel
    else:
        kernel = _fp4_gemm_ws_v_kernel if mode == "full" else _compute_ws_kernel
        sig["sixteen"] = "i32"
        consts["IMAD"] = v.imad
    return GateCase(f"gemmcomp {v.name} {mode} {fmt} bm{bm} {c.block_n}x{bk} w{c.num_warps}s{c.stages}"
                    f"{' overlap' if c.overlap else ''} r{c.maxnreg}", kernel, sig, consts, c.num_warps, 1,
                    c.block_n * bk / (32 * c.num_warps), 99.0,
                    ("rf_ptr", "out_ptr", "part_ptr", "count_ptr", "stride_om"), max_full_waits=99,
                    options=(("maxnreg", c.maxnreg), ), require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG"))


def all_cases():
    """(variant, fmt, bm, mode) of every kernel the benchmark launches (M = 1 -> bm 8, M = 16 -> bm 16)."""
    return [(v, fmt, bm, mode) for v in (SHIPPED, ) + VARIANTS for fmt in v.fmts for bm in (8, 16)
            for mode in ("full", "compute")]

