"""Load-only probe of the Gluon warp-specialised GEMM (trace_rl/kernels/fp4_gemm_gluon.py) for benchmarks/gemm_bound.py:
the shipped TMA producer partition (`_producer`, unchanged: the same boxes, ring and mbarriers) feeding a consumer
that only waits for each slot, loads its layout words from shared memory as the real consumer does (LDS.128 in the
A-fragment layout) and XORs them, then releases the slot: no decode, no wgmma, no split-K epilogue; one int32 per
program. Same grid, split and descriptors as `fp4_matmul_gluon`. Needs Triton 3.6 (Gluon) and an sm_90 GPU to run;
compiles for sm_90 on any machine (tests/benchmarks/test_gemm_bound.py).
"""

from __future__ import annotations

import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier

from trace_rl.kernels.fp4_gemm_gluon import GluonConfig, _descriptors, _producer, _shared_layouts, auto_split, step_k
from trace_rl.kernels.hopper_fp4 import COLS, ROWS


@gluon.jit
def _drain_consumer(w_bufs, ready, empty, n_iters, BN: gl.constexpr, BK: gl.constexpr, STAGES: gl.constexpr):
    """Per K step: wait for the slot, XOR its words (loaded as `_consumer` loads them), release it."""
    NW: gl.constexpr = gl.num_warps()
    W_LAYOUT: gl.constexpr = gl.BlockedLayout([1, 1, 1, 1, 2, 2], [1, 1, 8, 4, 1, 1], [NW, 1, 1, 1, 1, 1],
                                              [5, 4, 3, 2, 1, 0])
    RAW6: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [5, 4, 3, 2, 1, 0])
    KC: gl.constexpr = BK // 128
    w_raw = w_bufs._reinterpret(gl.int32, [STAGES * KC, BN // 16, 2, 8, 4, 2, 2], RAW6)
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
    per_split = gl.cdiv(KB, SPLIT_K)
    kb_lo = pid_k * per_split
    n_iters = gl.minimum(kb_lo + per_split, KB) - kb_lo
    w_bufs = gl.allocate_shared_memory(gl.int32, [STAGES] + w_desc.block_type.shape, w_desc.layout)
    s_bufs = gl.allocate_shared_memory(gl.int32, [STAGES] + s_desc.block_type.shape, s_desc.layout)
    x_bufs = gl.allocate_shared_memory(gl.bfloat16, [STAGES] + x_desc.block_type.shape, x_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    (word, ) = gl.warp_specialize([
        (_drain_consumer, (w_bufs, ready, empty, n_iters, BN, BK, STAGES)),
        (_producer, (w_desc, s_desc, x_desc, w_bufs, s_bufs, x_bufs, ready, empty, pid_n * (BN // 16), pid_n * BN,
                     pid_m * BM, kb_lo, n_iters, BK, STAGES)),
    ], [1], [24])
    pid = (pid_m * gl.num_programs(1) + pid_k) * gl.num_programs(0) + pid_n
    gl.store(sink_ptr + pid, word)


def gluon_load_only(x2, w, c: GluonConfig, sink, split: int = 0):
    """`fp4_matmul_gluon(x2, w, c)`'s launch (grid, split: `split` or the config's or auto, descriptors) with the
    load-only consumer; one int32 per program into `sink`. Returns (CompiledKernel, programs)."""
    import torch

    bm = c.tile_m(x2.shape[0])
    bk = step_k(w.fmt)
    np_, kp = w.padded
    n_tiles, m_tiles, kb = triton.cdiv(np_, c.block_n), triton.cdiv(x2.shape[0], bm), kp // bk
    sms = torch.cuda.get_device_properties(x2.device).multi_processor_count
    split = split or c.split_k or auto_split(n_tiles * m_tiles, kb, sms * c.ctas_per_sm(bm, w.fmt))
    split = triton.cdiv(kb, triton.cdiv(kb, max(1, min(split, kb))))
    w_desc, s_desc, x_desc = _descriptors(x2, w, c, bm)
    kern = _load_only_ws_kernel[(n_tiles, split, m_tiles)](w_desc, s_desc, x_desc, sink, kb, split, BN=c.block_n,
                                                            BK=bk, BM=bm, STAGES=c.stages, num_warps=c.num_warps,
                                                            maxnreg=c.maxnreg)
    return kern, n_tiles * split * m_tiles


def gate_case(c: GluonConfig, block_m: int, fmt: str = "nvfp4"):
    """A sass_gate case (compile-only: TMA loads, mbarriers, setmaxnreg present; nothing budgeted)."""
    from trace_rl.kernels.sass_gate import GateCase

    bk = step_k(fmt)
    wl, sl, xl = _shared_layouts(block_m, bk)
    sig = dict(w_desc=f"tensordesc<i32[{bk // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
               s_desc=f"tensordesc<i32[{c.block_n}, 4],{sl!r}>",
               x_desc=f"tensordesc<bf16[{block_m}, {bk}],{xl!r}>", sink_ptr="*i32", KB="i32", SPLIT_K="i32")
    consts = dict(BN=c.block_n, BK=bk, BM=block_m, STAGES=c.stages)
    return GateCase(f"probe gluon load-only {fmt} {block_m}x{c.block_n}x{bk} s{c.stages}", _load_only_ws_kernel, sig,
                    consts, c.num_warps, 1, c.block_n * bk / (32 * c.num_warps), 99.0, ("sink_ptr",),
                    register_a=False, forbid=(), max_full_waits=99, options=(("maxnreg", c.maxnreg), ),
                    require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE"))
