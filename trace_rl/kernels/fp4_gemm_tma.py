"""Opt-in variant of the dense FP4 GEMM (fp4_gemm.py) for M <= 16: the weight stream loaded by TMA.

At M <= 16 the shipped kernel is latency-bound (docs/benchmarks.md, "What bounds them"): every thread issues
cp.async for its share of each K step's layout words, then waits on the stage barrier. Here the layout words
come through a host-built tensor descriptor (`triton.tools.tensor_descriptor.TensorDescriptor`, accepted by
Triton 3.6 and 3.9 and by the interpreter): one thread issues the bulk copy of a whole [BN/16, 2 BK] tile and
the others wait on its mbarrier, so a program can keep more stages (bytes) in flight for fewer instructions.
Rows past the weight's end are filled with zeros by the TMA unit (the shipped kernel's `other=0` mask).
The scale words stay on ordinary (cp.async-pipelined) loads: a [BN, BK/64] int32 box is 8 bytes wide for
nvfp4 at BK = 128, under TMA's 16-byte minimum.

Everything after the load is the shipped kernel's: the same decode (`fp4_gemm.decode_w`), the same dot per K
block in the same order, the same split of K and the same fixed-order split-K reduction (`fp4_gemm.finish_tile`),
so for equal (block_m, block_n, block_k, split) the output is bit-identical to the shipped kernel's; the tests
check that. Selected by `GemmConfig(..., tma=True)`; never the default until measured on the H200.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from trace_rl.kernels.fp4_gemm import GemmConfig, decode_w, finish_tile


@triton.jit(do_not_specialize=["M", "N", "KB", "NP16", "SPLIT_K"])   # one binary for every M and split
def _fp4_gemm_tma_kernel(
    x_ptr, w_desc, s_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, part_ptr, count_ptr,
    M, N, K, KB, NP16, SPLIT_K, stride_xm, stride_s, stride_om,
    MX: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr, DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr, MASK_W: tl.constexpr,
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    SW: tl.constexpr = BK // 128 if MX else BK // 64
    rows = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_k = tl.arange(0, BK)
    s_ptrs = s_ptr + rows[:, None].to(tl.int64) * stride_s + tl.arange(0, SW)[None, :]
    s_mask = (rows < NP16 * 16)[:, None]
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :]
    x_mask_m = (offs_m < M)[:, None]
    per_split = tl.cdiv(KB, SPLIT_K)
    kb_lo = pid_k * per_split
    kb_hi = tl.minimum(kb_lo + per_split, KB)
    tl.assume(kb_hi > kb_lo)    # no empty split (the launcher's); as in the shipped kernel: no serialised wgmma
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    for kb in range(kb_lo, kb_hi):
        w = w_desc.load([pid_n * (BN // 16), kb * (2 * BK)])
        if MASK_W:
            sw = tl.load(s_ptrs + kb * SW, mask=s_mask, other=0)
        else:
            sw = tl.load(s_ptrs + kb * SW)
        wt = decode_w(w, sw, BN, BK, MX, DECODE, DOT_F32)
        if EVEN_K:
            x = tl.load(x_ptrs + kb * BK, mask=x_mask_m, other=0.0)
        else:
            x = tl.load(x_ptrs + kb * BK, mask=x_mask_m & ((kb * BK + offs_k) < K)[None, :], other=0.0)
        if DOT_F32:
            acc = tl.dot(wt, tl.trans(x.to(tl.float32)), acc)
        else:
            acc = tl.dot(wt, tl.trans(x), acc)
    finish_tile(acc, rows, offs_m, N, M, pid_n, pid_m, pid_k, SPLIT_K, rf_ptr, row_scale_ptr, bias_ptr, out_ptr,
                stride_om, part_ptr, count_ptr, HAS_ROW_SCALE, HAS_BIAS, BM, BN)


def weight_descriptor(values, block_n: int, block_k: int) -> TensorDescriptor:
    """The TMA descriptor of the layout words `values` [Np/16, 2 Kp] int32, one box per K step of a program."""
    if values.stride(-1) != 1 or (values.stride(0) * 4) % 16 or values.data_ptr() % 16:
        raise ValueError("fp4_matmul(tma=True): the layout words must be contiguous rows 16-byte aligned "
                         f"(stride {tuple(values.stride())}); pass a HopperFP4 built by to_hopper")
    if 2 * block_k > 256 or block_n // 16 > 256:
        raise ValueError(f"fp4_matmul(tma=True): a TMA box holds at most 256 words per dimension; block_k "
                         f"{block_k} needs {2 * block_k} (use block_k <= 128)")
    return TensorDescriptor.from_tensor(values, [block_n // 16, 2 * block_k])


def launch_tma(grid, x2, w, out, row_scale, bias, part, counters, M, N, K, kb, np16, split, stride_s, c,
               consts: dict):
    """Launch with the arguments `fp4_matmul` gives the shipped kernel (`consts`: its constexprs)."""
    _fp4_gemm_tma_kernel[grid](
        x2, weight_descriptor(w.values, c.block_n, c.block_k), w.scales.view(torch.int32), w.row_factor, out,
        row_scale, bias, part, counters, M, N, K, kb, np16, split, x2.stride(0), stride_s, out.stride(0),
        **consts, num_warps=c.num_warps, num_stages=c.num_stages)


TMA_SIGNATURE = dict(x_ptr="*bf16", w_desc=None, s_ptr="*i32", rf_ptr="*fp32", out_ptr="*bf16",
                     row_scale_ptr="*fp32", bias_ptr="*fp32", part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32",
                     K="i32", KB="i32", NP16="i32", SPLIT_K="i32", stride_xm="i32", stride_s="i32", stride_om="i32")
TMA_DIVISIBLE = ("x_ptr", "s_ptr", "rf_ptr", "out_ptr", "part_ptr", "count_ptr", "K", "stride_xm", "stride_s",
                 "stride_om")
# Compile gate (sass_gate.py), Triton 3.6 sm_90, K loop at 4 stages: the 128-row tile issues 3.40 SASS per weight
# element for nvfp4 / 3.13 mxfp4 (the shipped cp.async kernel: 3.20 / 2.96): the loads shrink to one mbarrier wait
# and two UTMALDG per K step, but the buffer's reuse costs a fence (MEMBAR.ALL.CTA) and barrier, and the scale and
# activation cp.async stay. The 256-row tile: 2.93 / 2.69 (shipped 2.80 / 2.54). Budgets: measured + ~2%.
TMA_GATE = ((GemmConfig(16, 128, 128, 1, 4, 4, tma=True), 3.45), (GemmConfig(16, 256, 128, 1, 4, 4, tma=True), 3.0))


def sass_gate_cases():
    from trace_rl.kernels.fp4_decode import DECODE_ASM
    from trace_rl.kernels.sass_gate import GateCase

    cases = []
    for cfg, budget in TMA_GATE:
        for fmt in ("nvfp4", "mxfp4"):
            consts = dict(MX=fmt == "mxfp4", HAS_ROW_SCALE=False, HAS_BIAS=False, BM=cfg.block_m, BN=cfg.block_n,
                          BK=cfg.block_k, DECODE=DECODE_ASM, DOT_F32=False, EVEN_K=True, MASK_W=False)
            sig = dict(TMA_SIGNATURE, w_desc=f"tensordesc<i32[{cfg.block_n // 16}, {2 * cfg.block_k}]>")
            cases.append(GateCase(f"gemm tma {fmt} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps}"
                                  f"s{cfg.num_stages}", _fp4_gemm_tma_kernel, sig, consts, cfg.num_warps,
                                  cfg.num_stages, cfg.block_n * cfg.block_k / (32 * cfg.num_warps), budget,
                                  TMA_DIVISIBLE))
    return cases
