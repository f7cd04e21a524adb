"""Probes of the Gluon warp-specialised GEMM (trace_rl/kernels/fp4_gemm_gluon.py) for benchmarks/gemm_bound.py, with
the same grid, split and descriptors as `fp4_matmul_gluon`:
- load-only: the shipped TMA producer partition (`_producer`, unchanged: the same boxes, ring and mbarriers) feeding
  a consumer that only waits for each slot, loads its layout words from shared memory as the real consumer does
  (LDS.128 in the A-fragment layout) and XORs them, then releases the slot: no decode, no wgmma, no split-K
  epilogue; one int32 per program;
- compute-only: a producer that brings only the activation tiles, and the shipped consumer (no overlap) decoding
  words held in registers (changed every step) and running the same wgmmas and split-K epilogue.
Needs Triton 3.6 (Gluon) and an sm_90 GPU to run; compiles for sm_90 on any machine
(tests/benchmarks/test_gemm_bound.py).
"""

from __future__ import annotations

from dataclasses import replace

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
from trace_rl.kernels.fp4_gemm_gluon import (
    GluonConfig,
    _decode_chunk,
    _descriptors,
    _finish,
    _producer,
    _shared_layouts,
    launch_grid,
    split_k_scratch,
    step_k,
)
from trace_rl.kernels.hopper_fp4 import COLS, ROWS


@gluon.jit
def _drain_consumer(w_bufs, ready, empty, n_iters, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """Per K step: wait for the slot, XOR its words (loaded as `_consumer` loads them), release it."""
    W_LAYOUT: gl.constexpr = ring.w_layout(gl.num_warps())
    KC: gl.constexpr = BK // 128
    w_raw = ring.word_views(w_bufs, BN, BK, STAGES)
    acc = gl.zeros([BN // 16, 2, 8, 4, 2, 2], gl.int32, W_LAYOUT)
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        for kc in gl.static_range(KC):
            acc ^= w_raw.index(slot * KC + kc).load(W_LAYOUT)
        mbarrier.arrive(empty.index(slot), count=1)
    word = gl.xor_sum(gl.xor_sum(gl.xor_sum(gl.xor_sum(gl.xor_sum(gl.xor_sum(acc, 5), 4), 3), 2), 1), 0)
    return (word, )


@gluon.jit(do_not_specialize=["KB", "SPLIT_K"])
def _load_only_ws_kernel(w_desc, s_desc, x_desc, sink_ptr, KB, SPLIT_K, BN: gl.constexpr, BK: gl.constexpr,
                         BM: gl.constexpr, STAGES: gl.constexpr):
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    kb_lo, n_iters = ring.k_range(pid_k, KB, SPLIT_K)
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    (word, ) = gl.warp_specialize([
        (_drain_consumer, (w_bufs, ready, empty, n_iters, BN, BK, STAGES)),
        (_producer, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, pid_n * (BN // 16), pid_n * BN,
                     pid_m * BM, kb_lo, n_iters, BK, STAGES)),
    ], [1], [24])
    pid = (pid_m * gl.num_programs(1) + pid_k) * gl.num_programs(0) + pid_n
    gl.store(sink_ptr + pid, word)


@gluon.jit
def _x_producer(x_desc, x_bufs, ready, empty, m0, kb_lo, n_iters, BK: gl.constexpr, STAGES: gl.constexpr):
    """`_producer` without the weight: only the activation tile of each step (the wgmma's B operand)."""
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
        bar = ready.index(slot)
        mbarrier.expect(bar, x_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(x_desc, [m0, (kb_lo + it) * BK], bar, x_bufs.index(slot))


@gluon.jit
def _compute_consumer(w_bufs, s_bufs, x_bufs, ready, empty, n_iters, BN: gl.constexpr, BK: gl.constexpr,
                      BM: gl.constexpr, STAGES: gl.constexpr, MX: gl.constexpr):
    """`_consumer` (no overlap) with the words and scale words of each step taken from registers: slot 0's
    contents (never written: values the compiler cannot know) loaded once, XORed with the step, so the decode
    cannot be hoisted; same decode, wgmmas, waits and slot releases."""
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
    acc = gl.zeros([BN, BM], gl.float32, mma)
    for it in range(n_iters):
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        x_s = x_bufs.index(slot)
        for kp in gl.static_range(KC // 2):
            w0 = w_a ^ (it + 2 * kp)
            w1 = w_b ^ (it + 2 * kp + 1)
            s0 = s_a ^ (it & 3)
            s1 = s_b ^ (it & 3)
            for kk in gl.static_range(2):
                if kk == 0:
                    a = _decode_chunk(w0, s0, W_LAYOUT, A_LAYOUT, BN, MX)
                else:
                    a = _decode_chunk(w1, s1, W_LAYOUT, A_LAYOUT, BN, MX)
                acc = warpgroup_mma(a, x_s.slice((2 * kp + kk) * 128, 128, dim=1).permute((1, 0)), acc,
                                    is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
        fence_async_shared()
        mbarrier.arrive(empty.index(slot), count=1)
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc, ))
    return (acc, )


@gluon.jit(do_not_specialize=["M", "N", "KB", "SPLIT_K"])
def _compute_only_ws_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, M, N, KB, SPLIT_K,
                            stride_om, BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                            MX: gl.constexpr):
    """`_fp4_gemm_ws_kernel` (no overlap) with `_compute_consumer` and `_x_producer`: same ring, decode, wgmmas and
    split-K epilogue, no weight bytes read."""
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    tile = pid_m * gl.num_programs(0) + pid_n
    kb_lo, n_iters = ring.k_range(pid_k, KB, SPLIT_K)
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    (acc, ) = gl.warp_specialize([
        (_compute_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, BN, BK, BM, STAGES, MX)),
        (_x_producer, (x_desc, x_bufs, ready, empty, pid_m * BM, kb_lo, n_iters, BK, STAGES)),
    ], [1], [24])
    _finish(acc, pid_n, pid_m, tile, pid_k, SPLIT_K, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om, BN, BM)


def gluon_compute_only(x2, w, c: GluonConfig, out, split: int = 0):
    """`fp4_matmul_gluon(x2, w, c, out)`'s launch with `_compute_only_ws_kernel` (c.overlap is ignored: the
    non-overlapped consumer). Returns (CompiledKernel, programs)."""
    bm, bk, (n_tiles, m_tiles, kb, split) = _grid(x2, w, c, split)
    part, counters = split_k_scratch(x2.device, c, bm, (n_tiles, split, m_tiles), w.row_factor)
    w_desc, s_desc, x_desc = _descriptors(x2, w, c, bm)
    kern = _compute_only_ws_kernel[(n_tiles, split, m_tiles)](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters, x2.shape[0], w.n, kb, split, out.stride(0),
        BN=c.block_n, BK=bk, BM=bm, STAGES=c.stages, MX=w.fmt == "mxfp4", num_warps=c.num_warps, maxnreg=c.maxnreg)
    return kern, n_tiles * split * m_tiles


def _grid(x2, w, c: GluonConfig, split: int):
    """(BM, BK, (n tiles, m tiles, K steps, split)) as `fp4_matmul_gluon` computes them (`launch_grid`; `split`,
    when given, in place of the config's)."""
    import torch

    bm = c.tile_m(x2.shape[0])
    bk = step_k(w.fmt)
    sms = torch.cuda.get_device_properties(x2.device).multi_processor_count
    c = replace(c, split_k=split) if split else c
    return bm, bk, launch_grid(x2.shape[0], w.padded, c, bm, bk, lambda: sms * c.ctas_per_sm(bm, w.fmt))


def gluon_load_only(x2, w, c: GluonConfig, sink, split: int = 0):
    """`fp4_matmul_gluon(x2, w, c)`'s launch (grid, split: `split` or the config's or auto, descriptors) with the
    load-only consumer; one int32 per program into `sink`. Returns (CompiledKernel, programs)."""
    bm, bk, (n_tiles, m_tiles, kb, split) = _grid(x2, w, c, split)
    w_desc, s_desc, x_desc = _descriptors(x2, w, c, bm)
    kern = _load_only_ws_kernel[(n_tiles, split, m_tiles)](w_desc, s_desc, x_desc, sink, kb, split, BN=c.block_n,
                                                            BK=bk, BM=bm, STAGES=c.stages, num_warps=c.num_warps,
                                                            maxnreg=c.maxnreg)
    return kern, n_tiles * split * m_tiles


def gate_case(c: GluonConfig, block_m: int, fmt: str = "nvfp4", mode: str = "load_only"):
    """A sass_gate case for the load-only or compute-only probe (compile-only: TMA loads, mbarriers, setmaxnreg
    present; compute-only: register-A HGMMA, no spills; nothing budgeted)."""
    from trace_rl.kernels.sass_gate import GateCase

    bk = step_k(fmt)
    wl, sl, xl = _shared_layouts(block_m, bk)
    descs = dict(w_desc=f"tensordesc<i32[{bk // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
                 s_desc=f"tensordesc<i32[{c.block_n}, 4],{sl!r}>",
                 x_desc=f"tensordesc<bf16[{block_m}, {bk}],{xl!r}>")
    consts = dict(BN=c.block_n, BK=bk, BM=block_m, STAGES=c.stages)
    if mode == "load_only":
        kernel, sig, divisible = _load_only_ws_kernel, descs | dict(sink_ptr="*i32", KB="i32", SPLIT_K="i32"), \
            ("sink_ptr", )
    else:
        kernel, divisible = _compute_only_ws_kernel, ("rf_ptr", "out_ptr", "part_ptr", "count_ptr", "stride_om")
        sig = descs | dict(rf_ptr="*fp32", out_ptr="*bf16", part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32",
                           KB="i32", SPLIT_K="i32", stride_om="i32")
        consts["MX"] = fmt == "mxfp4"
    return GateCase(f"probe gluon {mode} {fmt} {block_m}x{c.block_n}x{bk} s{c.stages}", kernel, sig, consts,
                    c.num_warps, 1, c.block_n * bk / (32 * c.num_warps), 99.0, divisible,
                    register_a=mode != "load_only", forbid=(), max_full_waits=99, options=(("maxnreg", c.maxnreg), ),
                    require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE"))
