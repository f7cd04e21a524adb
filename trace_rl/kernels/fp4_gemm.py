"""W4A16 / W4A4 GEMM on the Hopper FP4 layout: y = x @ dequant(W)^T (+ bias), float32 accumulation.

Swap-AB: a program computes out^T[BN, BM] = W[BN, K-range] @ x^T[K-range, BM], so the weight is wgmma's
A operand, decoded straight into its register fragments (fp4_decode.py: 9 integer instructions and 4
`mul.bf16x2` per 8 weights, no shared-memory round trip), and the few activation rows are the
shared-memory B operand. Code x pre-biased scale is exact in bf16; the layout's per-row float32 factor
(nvfp4 global scale, mxfp4 exponent offset), the W4A4 per-token activation scale and the bias are applied to
the accumulator once.

Split-K stays one launch and deterministic: each of the SPLIT_K programs of an output tile stores its
float32 partial tile, then takes a ticket (an acq_rel atomic on the tile's counter); the program holding
the last ticket adds the SPLIT_K partials in split order (so the sum does not depend on which program
finished last), applies the epilogue, stores, and resets the counter for the next launch. No program
waits for another, so any grid size is safe.

W4A4: the activations arrive as code value x block scale in bf16 (exact) plus a float32 per-token scale
(`row_quantize.quantize_dequant_bf16`, or a fused producer through `fp4_linear_prequantized`), so the
bf16 x bf16 -> fp32 products are exactly the FP4 x FP4 products.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from trace_rl.kernels.fp4_decode import DECODE_ASM, DECODE_PURE, decode_tile, tile_scales
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4
from trace_rl.kernels.row_quantize import fp4_quantize_dequant_bf16


@triton.jit
def _epilogue_store(acc, rows, offs_m, N, M, rf_ptr, row_scale_ptr, bias_ptr, out_ptr, stride_om,
                    HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """acc [BN, BM] float32 (rows = weight rows n, columns = tokens m) -> out[m, n]."""
    n_mask, m_mask = rows < N, offs_m < M
    acc = acc * tl.load(rf_ptr + rows, mask=n_mask, other=1.0)[:, None]
    if HAS_ROW_SCALE:
        acc = acc * tl.load(row_scale_ptr + offs_m, mask=m_mask, other=1.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + rows, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + offs_m[None, :].to(tl.int64) * stride_om + rows[:, None], acc.to(out_ptr.dtype.element_ty),
             mask=n_mask[:, None] & m_mask[None, :])


@triton.jit
def decode_w(w, sw, BN: tl.constexpr, BK: tl.constexpr, MX: tl.constexpr, DECODE: tl.constexpr,
             DOT_F32: tl.constexpr):
    """Loaded layout words w [BN/16, 2 BK] and scale words sw [BN, BK/64 or BK/128] -> the MMA operand [BN, BK]
    (bf16, or float32 if DOT_F32)."""
    w = tl.reshape(w, [BN // 16, BK // 128, 2, 8, 4, 4])
    s_even, s_odd = tile_scales(sw, BN, BK, MX, DECODE)
    return decode_tile(w, s_even, s_odd, BN, BK, DECODE, DOT_F32)


@triton.jit
def _load_decode_w(w_ptrs, w_mask, s_ptrs, s_mask, kb, BN: tl.constexpr, BK: tl.constexpr, MX: tl.constexpr,
                   DECODE: tl.constexpr, DOT_F32: tl.constexpr, MASK_W: tl.constexpr):
    """K block `kb` of the weight tile, decoded to the MMA operand [BN, BK] (bf16, or float32 if DOT_F32):
    the layout words and scale words loaded (masked if MASK_W), then `decode_w`."""
    SW: tl.constexpr = BK // 128 if MX else BK // 64
    if MASK_W:
        w = tl.load(w_ptrs + kb * (2 * BK), mask=w_mask, other=0)
        sw = tl.load(s_ptrs + kb * SW, mask=s_mask, other=0)
    else:
        w = tl.load(w_ptrs + kb * (2 * BK))
        sw = tl.load(s_ptrs + kb * SW)
    return decode_w(w, sw, BN, BK, MX, DECODE, DOT_F32)


@triton.jit
def fp4_tile_mma(acc, x_ptrs, x_mask_m, K, w_ptrs, w_mask, s_ptrs, s_mask, kb_lo, kb_hi,
                 BN: tl.constexpr, BK: tl.constexpr, MX: tl.constexpr, DECODE: tl.constexpr,
                 DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, MASK_W: tl.constexpr,
                 gscale=None, ACT: tl.constexpr = 0):
    """acc[BN, BM] += W[BN, kb_lo*BK : kb_hi*BK] @ x[BM, same]^T over the layout (shared by the dense and
    the grouped kernels). `w_ptrs` [BN/16, 2 BK] int32 layout words, `s_ptrs` [BN, BK/64 or BK/128] int32
    scale words, `x_ptrs` [BM, BK] at K-block 0. ACT: 0 x is the operand (bf16, or W4A4 pre-quantized);
    1 / 2 quantize the bf16 x in registers per token to nvfp4:row (row global `gscale` [BM]) / mxfp4, with
    the row quantizer's own rounding (`row_quantize.fp4_quantize_dequant_bf16`: bit-identical operand)."""
    offs_k = tl.arange(0, x_ptrs.shape[1])
    for kb in range(kb_lo, kb_hi):
        wt = _load_decode_w(w_ptrs, w_mask, s_ptrs, s_mask, kb, BN, BK, MX, DECODE, DOT_F32, MASK_W)
        if EVEN_K:
            x = tl.load(x_ptrs + kb * BK, mask=x_mask_m, other=0.0)
        else:
            x = tl.load(x_ptrs + kb * BK, mask=x_mask_m & ((kb * BK + offs_k) < K)[None, :], other=0.0)
        if ACT != 0:
            x = fp4_quantize_dequant_bf16(x.to(tl.float32), gscale, ACT == 2, x_ptrs.shape[0], BK,
                                          32 if ACT == 2 else 16)
        if DOT_F32:
            acc = tl.dot(wt, tl.trans(x.to(tl.float32)), acc)
        else:
            acc = tl.dot(wt, tl.trans(x), acc)
    return acc


@triton.jit
def fp4_tile_mma2(acc_a, acc_b, xa_ptrs, xa_mask_m, xb_ptrs, xb_mask_m, K, w_ptrs, w_mask, s_ptrs, s_mask, kb_lo,
                  kb_hi, BN: tl.constexpr, BK: tl.constexpr, MX: tl.constexpr, DECODE: tl.constexpr,
                  DOT_F32: tl.constexpr, EVEN_K: tl.constexpr, MASK_W: tl.constexpr):
    """`fp4_tile_mma` over two activation tiles (acc_a += W @ xa^T, acc_b += W @ xb^T): each K step's weight tile
    is decoded once for both (the grouped kernel's experts with more rows than one tile)."""
    offs_k = tl.arange(0, xa_ptrs.shape[1])
    for kb in range(kb_lo, kb_hi):
        wt = _load_decode_w(w_ptrs, w_mask, s_ptrs, s_mask, kb, BN, BK, MX, DECODE, DOT_F32, MASK_W)
        if EVEN_K:
            xa = tl.load(xa_ptrs + kb * BK, mask=xa_mask_m, other=0.0)
            xb = tl.load(xb_ptrs + kb * BK, mask=xb_mask_m, other=0.0)
        else:
            k_ok = ((kb * BK + offs_k) < K)[None, :]
            xa = tl.load(xa_ptrs + kb * BK, mask=xa_mask_m & k_ok, other=0.0)
            xb = tl.load(xb_ptrs + kb * BK, mask=xb_mask_m & k_ok, other=0.0)
        if DOT_F32:
            acc_a = tl.dot(wt, tl.trans(xa.to(tl.float32)), acc_a)
            acc_b = tl.dot(wt, tl.trans(xb.to(tl.float32)), acc_b)
        else:
            acc_a = tl.dot(wt, tl.trans(xa), acc_a)
            acc_b = tl.dot(wt, tl.trans(xb), acc_b)
    return acc_a, acc_b


@triton.jit(do_not_specialize=["M", "N", "KB", "NP16", "SPLIT_K"])   # one binary for every M and split
def _fp4_gemm_kernel(
    x_ptr, w_ptr, s_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr, part_ptr, count_ptr,
    M, N, K, KB, NP16, SPLIT_K, stride_xm, stride_w, stride_s, stride_om,
    MX: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr, DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr, MASK_W: tl.constexpr,
):
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    SW: tl.constexpr = BK // 128 if MX else BK // 64
    n16 = pid_n * (BN // 16) + tl.arange(0, BN // 16)
    rows = pid_n * BN + tl.arange(0, BN)
    offs_m = pid_m * BM + tl.arange(0, BM)
    w_ptrs = w_ptr + n16[:, None].to(tl.int64) * stride_w + tl.arange(0, 2 * BK)[None, :]
    s_ptrs = s_ptr + rows[:, None].to(tl.int64) * stride_s + tl.arange(0, SW)[None, :]
    x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + tl.arange(0, BK)[None, :]
    per_split = tl.cdiv(KB, SPLIT_K)
    kb_lo = pid_k * per_split
    kb_hi = tl.minimum(kb_lo + per_split, KB)
    # The launcher leaves no split empty. Telling the compiler so removes the loop's zero-trip path, whose
    # accumulator initialisation would make ptxas serialise every wgmma (C7515).
    tl.assume(kb_hi > kb_lo)
    acc = tl.zeros([BN, BM], dtype=tl.float32)
    acc = fp4_tile_mma(acc, x_ptrs, (offs_m < M)[:, None], K, w_ptrs, (n16 < NP16)[:, None], s_ptrs,
                       (rows < NP16 * 16)[:, None], kb_lo, kb_hi, BN, BK, MX, DECODE, DOT_F32, EVEN_K, MASK_W)
    finish_tile(acc, rows, offs_m, N, M, pid_n, pid_m, pid_k, SPLIT_K, rf_ptr, row_scale_ptr, bias_ptr, out_ptr,
                stride_om, part_ptr, count_ptr, HAS_ROW_SCALE, HAS_BIAS, BM, BN)


@triton.jit
def finish_tile(acc, rows, offs_m, N, M, pid_n, pid_m, pid_k, SPLIT_K, rf_ptr, row_scale_ptr, bias_ptr, out_ptr,
                stride_om, part_ptr, count_ptr, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):
    """Store a program's accumulator: directly (SPLIT_K == 1), or as split `pid_k`'s float32 partial, the
    program holding the tile's last ticket adding all partials in split order (see the module doc)."""
    if SPLIT_K == 1:
        _epilogue_store(acc, rows, offs_m, N, M, rf_ptr, row_scale_ptr, bias_ptr, out_ptr, stride_om,
                        HAS_ROW_SCALE, HAS_BIAS)
    else:
        tile = pid_m * tl.num_programs(0) + pid_n
        base = part_ptr + tile.to(tl.int64) * (SPLIT_K * BN * BM)
        offs = tl.arange(0, BM)[None, :] * BN + tl.arange(0, BN)[:, None]   # stored like `out` (coalesced along n)
        tl.store(base + pid_k * (BN * BM) + offs, acc)
        tl.debug_barrier()                                   # every thread's partial is written
        ticket = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:                            # the last program of this tile reduces
            total = tl.zeros([BN, BM], dtype=tl.float32)
            for s in range(SPLIT_K):                         # fixed order: deterministic
                total += tl.load(base + s * (BN * BM) + offs, cache_modifier=".cg")
            tl.atomic_xchg(count_ptr + tile, 0)              # ready for the next launch
            _epilogue_store(total, rows, offs_m, N, M, rf_ptr, row_scale_ptr, bias_ptr, out_ptr, stride_om,
                            HAS_ROW_SCALE, HAS_BIAS)


@dataclass(frozen=True)
class GemmConfig:
    """Tiles of one launch: BM tokens x BN weight rows x BK columns per K step, SPLIT_K programs per tile."""

    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    decode: int = DECODE_ASM
    dual: bool = False   # grouped only: BM-row tiles as two BM/2-row accumulators sharing each decoded weight tile
    tma: bool = False    # dense only, opt-in, unmeasured: the weight words loaded by TMA (fp4_gemm_tma.py)

    def check(self) -> None:
        if self.block_n % 64 or self.block_k % COLS or self.block_m < 16 or self.block_m & (self.block_m - 1):
            raise ValueError(f"GemmConfig {self}: block_n must be a multiple of 64, block_k of {COLS}, and "
                             f"block_m a power of two >= 16")
        if self.tma and self.block_k != COLS:
            raise ValueError(f"GemmConfig {self}: tma=True needs block_k = {COLS} (a TMA box holds at most 256 "
                             f"words per dimension: 2 x block_k layout words per 16 rows)")


# Shipped tile shapes, picked from the H200 sweep (benchmarks/results/kernels_h200_hopper.json, nvfp4 W4A16 at
# 4096x12288, 12288x4096, 4096x1024): 128-row weight tiles beat 256-row ones at every M (16.8 vs 21.7 us at
# M = 1, 4096x12288: twice the programs, half the registers), although their K loop issues more SASS per weight
# (3.25 vs 2.80 for nvfp4: two wgmmas share each B descriptor instead of four). The compile gate checks every
# shipped config's structure (decoded tile in registers, register-A HGMMA, no serialised wgmma, no spills);
# SMALL_M_LEAN is the SASS reference held to the 3.0 budget.
SMALL_M = GemmConfig(16, 128, 128, 1, 4, 4)
M32 = GemmConfig(32, 128, 128, 1, 4, 3)
MID_M = GemmConfig(64, 128, 128, 1, 8, 3)
LARGE_M = GemmConfig(128, 128, 128, 1, 8, 3)
WIDE_M = GemmConfig(256, 128, 128, 1, 8, 3)     # 254 registers, no spills (Triton 3.6, sm_90)
SMALL_M_LEAN = GemmConfig(16, 256, 128, 1, 4, 4)

# M > 64: one program per SM (182 / 254 registers x 256 threads), so a launch costs about
#   waves x (K steps per split) x step_us  +  the split-K partials' float32 traffic (written and read once),
# with step_us the time of one 128-deep K step of one program, fitted to the H200 sweep
# (kernels_h200_hopper_sweep.json, 12288x4096 / 4096x12288 / 1024x4096 at M = 128-512: the model ranks the
# measured winners first and is within ~10% where the SMs are full): 1.34 us for 128x128, 2.34 us for 256x128
# (twice the MMA per decoded weight tile). E.g. 12288x4096 at M = 256: 96 programs of 256x128 (74.9 us
# measured) beat 192 of 128x128 (2 waves, 84.7 us); at M = 512 the wide tile's 192 programs need 2 waves and
# 128x128 wins (129 vs 145 us). At M = 471 on the MoE's qkv (5120x2048), 128x128 leaves 160 programs (1.2 waves).
LARGE_M_STEP_US = ((LARGE_M, 1.34), (WIDE_M, 2.34))
PARTIAL_BYTES_PER_US = 3.4e6    # split-K partial write + read, fitted: 12288x4096 M = 512 split 2 costs +29 us


def large_m_cost_us(M: int, N: int, K: int, cfg: GemmConfig, step_us: float, split: int, num_sms: int) -> float:
    """Modelled microseconds of a launch with M > 64 (see LARGE_M_STEP_US)."""
    kb = triton.cdiv(K, cfg.block_k)
    split = max(1, min(split, kb))
    split = triton.cdiv(kb, triton.cdiv(kb, split))          # as the launcher normalises it
    m_tiles, n_tiles = triton.cdiv(M, cfg.block_m), triton.cdiv(N, cfg.block_n)
    us = triton.cdiv(m_tiles * n_tiles * split, num_sms) * triton.cdiv(kb, split) * step_us
    if split > 1:
        us += 2 * split * m_tiles * cfg.block_m * N * 4 / PARTIAL_BYTES_PER_US
    return us


def default_config(M: int, N: int, K: int, num_sms: int = 132, interpret: bool = False,
                   decode: int = DECODE_ASM) -> GemmConfig:
    """Tiles by M bucket, then split K (one launch, fixed-order reduction). For M <= 64: the largest power of two
    keeping <= 3 programs per SM and >= 4 K steps per split (H200 sweep: 4096x12288 -> 4, 12288x4096 -> 8,
    4096x1024 -> 8 at M <= 32; at M = 64 at most 4). For M > 64: the 128x128 or 256x128 tile and split 1, 2 or 4
    with the lowest modelled time (`large_m_cost_us`; ties keep the smaller tile and split)."""
    if interpret:   # few programs, big tiles: each interpreted program costs milliseconds
        return GemmConfig(max(16, min(64, triton.next_power_of_2(M))), 64, 128 if K <= 128 else 256,
                          decode=DECODE_PURE)
    if M > 64:
        cost, _, split, base = min((large_m_cost_us(M, N, K, c, us, s, num_sms), i, s, c)
                                   for i, (c, us) in enumerate(LARGE_M_STEP_US) for s in (1, 2, 4))
        return GemmConfig(base.block_m, base.block_n, base.block_k, split, base.num_warps, base.num_stages, decode)
    base = SMALL_M if M <= 16 else M32 if M <= 32 else MID_M
    tiles = triton.cdiv(M, base.block_m) * triton.cdiv(N, base.block_n)
    kb = triton.cdiv(K, base.block_k)
    split, cap = 1, (16 if M <= 32 else 4)
    while split * 2 <= cap and tiles * split * 2 <= 3 * num_sms and kb // (split * 2) >= 4:
        split *= 2
    return GemmConfig(base.block_m, base.block_n, base.block_k, split, base.num_warps, base.num_stages, decode)


_COUNTERS: dict = {}


def tile_counters(device, n: int) -> torch.Tensor:
    """Zeroed int32 tickets for the split-K reduction, one per output tile, cached per device (the kernel
    leaves them at zero). Launches of the split-K GEMM on one device are assumed to be stream-ordered."""
    key = torch.device(device)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 4096), dtype=torch.int32, device=key)
        _COUNTERS[key] = buf
    return buf


def fp4_matmul(x2: torch.Tensor, w: HopperFP4, row_scale: torch.Tensor | None = None,
               bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
               config: GemmConfig | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x2 [M, K] bf16 (unit column stride) @ W^T with W in the Hopper layout -> [M, N] `out_dtype`."""
    from trace_rl.kernels import interpreting

    M, K = x2.shape
    N = w.n
    if K != w.k:
        raise ValueError(f"fp4_matmul: x has {K} columns, the weight {w.k}")
    interp = interpreting()
    if config is None:
        sms = 132 if interp else torch.cuda.get_device_properties(x2.device).multi_processor_count
        config = default_config(M, N, K, sms, interp, DECODE_PURE if interp else DECODE_ASM)
    c = config
    c.check()
    np_, kp = w.padded
    if kp % c.block_k:
        c = replace(c, block_k=COLS)
    out = torch.empty(M, N, device=x2.device, dtype=out_dtype) if out is None else out
    n_tiles, m_tiles = triton.cdiv(np_, c.block_n), triton.cdiv(M, c.block_m)
    kb = kp // c.block_k
    split = max(1, min(c.split_k, kb))
    split = triton.cdiv(kb, triton.cdiv(kb, split))    # no empty split (the kernel assumes none)
    if split > 1:
        part = torch.empty(n_tiles * m_tiles * split * c.block_n * c.block_m, device=x2.device, dtype=torch.float32)
        counters = tile_counters(x2.device, n_tiles * m_tiles)
    else:
        part = counters = w.row_factor      # unused
    G = 32 if w.fmt == "mxfp4" else 16
    grid = (n_tiles, m_tiles, split)
    rs = row_scale if row_scale is not None else w.row_factor
    bs = bias if bias is not None else w.row_factor
    consts = dict(MX=w.fmt == "mxfp4", HAS_ROW_SCALE=row_scale is not None, HAS_BIAS=bias is not None,
                  BM=c.block_m, BN=c.block_n, BK=c.block_k, DECODE=c.decode, DOT_F32=interp,
                  EVEN_K=K % c.block_k == 0, MASK_W=np_ % c.block_n != 0)
    if c.tma:
        from trace_rl.kernels.fp4_gemm_tma import launch_tma

        launch_tma(grid, x2, w, out, rs, bs, part, counters, M, N, K, kb, np_ // ROWS, split, kp // (4 * G), c,
                   consts)
        return out
    _fp4_gemm_kernel[grid](
        x2, w.values, w.scales.view(torch.int32), w.row_factor, out, rs, bs, part, counters, M, N, K, kb,
        np_ // ROWS, split, x2.stride(0), w.values.stride(0), kp // (4 * G), out.stride(0), **consts,
        num_warps=c.num_warps, num_stages=c.num_stages)
    return out


GEMM_SIGNATURE = dict(x_ptr="*bf16", w_ptr="*i32", s_ptr="*i32", rf_ptr="*fp32", out_ptr="*bf16",
                      row_scale_ptr="*fp32", bias_ptr="*fp32", part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32",
                      K="i32", KB="i32", NP16="i32", SPLIT_K="i32", stride_xm="i32", stride_w="i32", stride_s="i32",
                      stride_om="i32")
GEMM_DIVISIBLE = ("x_ptr", "w_ptr", "s_ptr", "rf_ptr", "out_ptr", "part_ptr", "count_ptr", "K", "stride_xm",
                  "stride_w", "stride_s", "stride_om")
GEMM_BUDGET = 3.0   # SASS per weight element in the K loop (issue 15): the decode's budget, held by SMALL_M_LEAN
# The shipped configs are held to what they measure (+~2%): at M <= 32 the 128-row tile's extra per-K-slice wgmma
# bookkeeping (~0.45 per element) buys more programs in flight, which the H200 sweep shows matters more; at
# M >= 64 the K loop also stages 64-128 activation rows per step (cp.async + addressing, ~1 per element) and is
# tensor-core-bound. docs/kernels.md lists the numbers.
SHIPPED_BUDGET = {SMALL_M: 3.3, M32: 3.4, MID_M: 4.3, LARGE_M: 4.6, WIDE_M: 5.3}


def gemm_gate_case(cfg: GemmConfig, fmt: str, name: str | None = None, budget: float = GEMM_BUDGET):
    from trace_rl.kernels.sass_gate import GateCase

    consts = dict(MX=fmt == "mxfp4", HAS_ROW_SCALE=False, HAS_BIAS=False, BM=cfg.block_m,
                  BN=cfg.block_n, BK=cfg.block_k, DECODE=DECODE_ASM, DOT_F32=False, EVEN_K=True, MASK_W=False)
    return GateCase(name or f"gemm {fmt} {cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps}s{cfg.num_stages}",
                    _fp4_gemm_kernel, GEMM_SIGNATURE, consts, cfg.num_warps, cfg.num_stages,
                    cfg.block_n * cfg.block_k / (32 * cfg.num_warps), budget, GEMM_DIVISIBLE)


def sass_gate_cases():
    cases = [gemm_gate_case(SMALL_M_LEAN, f, f"gemm {f} 16x256x128 (SASS reference)") for f in ("nvfp4", "mxfp4")]
    return cases + [gemm_gate_case(c, f, budget=b) for c, b in SHIPPED_BUDGET.items() for f in ("nvfp4", "mxfp4")]
