"""Grouped (mixture-of-experts) FP4 GEMM: one launch over all experts, static shapes (CUDA-graph friendly).

    y[r] = x[r] @ dequant(W[e])^T (+ bias[e])   for every row r of expert e, offsets[e] <= r < offsets[e + 1]

`x` holds the routed tokens sorted by expert (a token routed to k experts appears k times), `offsets`
[E + 1] int32 on the device comes from the router (offsets[0] = 0, offsets[E] = rows used; rows past it
are left untouched). The experts' weights are one `PackedWeight` whose `q` is [E, N, K] (each expert
quantized on its own: `backends.fp4.prepare_expert_weights`), read through its stacked Hopper layout.

The grid is static: (N tiles, ceil(rows / BM) + E + 1). Program (n, m) finds its expert and M-tile from
the offsets (a prefix sum of ceil(count_e / BM) over the experts, in registers); the programs past the last
tile zero the rows past offsets[E] (`zero_tail`; sum_e ceil(count_e / BM) <= (offsets[E] + E (BM - 1)) / BM,
so E + 1 spare programs cover the tail) or return at once. Per expert the M tile is small (top-8 of 128
experts: 4-32 rows per expert at 64-512 tokens), so this is where 4-bit weights pay most: the time is the
experts' weight bytes. Same decode and MMA loop as the dense kernel (`fp4_gemm.fp4_tile_mma`); no split-K
(the experts give enough programs).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.kernels.fp4_decode import DECODE_ASM, DECODE_PURE
from trace_rl.kernels.fp4_gemm import GEMM_BUDGET, GemmConfig, fp4_tile_mma, fp4_tile_mma2
from trace_rl.kernels.fp_bits import finite_abs
from trace_rl.kernels.hopper_fp4 import COLS, ROWS, HopperFP4


@triton.jit
def _grouped_store(acc, offs_m, m_mask, rows, N, e64, rf_ptr, stride_rfe, row_scale_ptr, bias_ptr, stride_be,
                   out_ptr, stride_om, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """acc [BN, BM] (weight rows x tokens) -> out[tokens, rows]: the expert's row factor, the W4A4 row scale,
    the bias."""
    n_mask = rows < N
    acc = acc * tl.load(rf_ptr + e64 * stride_rfe + rows, mask=n_mask, other=1.0)[:, None]
    if HAS_ROW_SCALE:
        acc = acc * tl.load(row_scale_ptr + offs_m, mask=m_mask, other=1.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + e64 * stride_be + rows, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    tl.store(out_ptr + offs_m[None, :].to(tl.int64) * stride_om + rows[:, None],
             acc.to(out_ptr.dtype.element_ty), mask=n_mask[:, None] & m_mask[None, :])


@triton.jit(do_not_specialize=["R", "N", "KB", "NP16", "E"])
def _fp4_grouped_kernel(
    x_ptr, off_ptr, w_ptr, s_ptr, rf_ptr, out_ptr, row_scale_ptr, bias_ptr,
    R, N, K, KB, NP16, E, stride_xm, stride_we, stride_w, stride_se, stride_s, stride_rfe, stride_om, stride_be,
    MX: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, E_POW2: tl.constexpr,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, DECODE: tl.constexpr, DOT_F32: tl.constexpr,
    EVEN_K: tl.constexpr, MASK_W: tl.constexpr, ACT: tl.constexpr = 0, ZERO_TAIL: tl.constexpr = False,
    DUAL: tl.constexpr = False,
):
    """ACT 0: x is the operand (bf16, or W4A4 activations quantized by the caller, with `row_scale`);
    1 / 2: W4A4 with the activations quantized here, per token, to nvfp4:row / mxfp4 (nvfp4:row first walks
    the rows once for their amax, the global scale). DUAL (ACT 0): a BM-row tile is two BM/2-row halves; a
    tile holding more than BM/2 rows decodes each weight tile once for both halves (`fp4_tile_mma2`), one
    holding fewer runs the single-half loop (no MMA or activation staging for empty rows)."""
    pid_n, pid_m = tl.program_id(0), tl.program_id(1)
    SW: tl.constexpr = BK // 128 if MX else BK // 64
    e_idx = tl.arange(0, E_POW2)
    start = tl.load(off_ptr + e_idx, mask=e_idx < E, other=0)
    end = tl.load(off_ptr + e_idx + 1, mask=e_idx < E, other=0)
    tiles = tl.cdiv(tl.maximum(end - start, 0), BM)
    e = tl.sum(tl.where(tl.cumsum(tiles, 0) <= pid_m, 1, 0), 0)    # the expert whose tiles hold pid_m
    if e < E:
        mt = pid_m - tl.sum(tl.where(e_idx < e, tiles, 0), 0)
        row0 = tl.sum(tl.where(e_idx == e, start, 0), 0) + mt * BM
        row_end = tl.sum(tl.where(e_idx == e, end, 0), 0)
        offs_m = row0 + tl.arange(0, BM)
        m_mask = offs_m < row_end
        n16 = pid_n * (BN // 16) + tl.arange(0, BN // 16)
        rows = pid_n * BN + tl.arange(0, BN)
        e64 = e.to(tl.int64)
        w_ptrs = w_ptr + e64 * stride_we + n16[:, None].to(tl.int64) * stride_w + tl.arange(0, 2 * BK)[None, :]
        s_ptrs = s_ptr + e64 * stride_se + rows[:, None].to(tl.int64) * stride_s + tl.arange(0, SW)[None, :]
        x_ptrs = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + tl.arange(0, BK)[None, :]
        tl.assume(KB > 0)                    # no zero-trip path (see fp4_gemm: ptxas would serialise wgmma)
        if DUAL:
            H: tl.constexpr = BM // 2
            offs_a = row0 + tl.arange(0, H)
            mask_a = offs_a < row_end
            xa_ptrs = x_ptr + offs_a[:, None].to(tl.int64) * stride_xm + tl.arange(0, BK)[None, :]
            acc_a = tl.zeros([BN, H], dtype=tl.float32)
            if row_end - row0 > H:
                acc_b = tl.zeros([BN, H], dtype=tl.float32)
                acc_a, acc_b = fp4_tile_mma2(acc_a, acc_b, xa_ptrs, mask_a[:, None], xa_ptrs + H * stride_xm,
                                             (offs_a + H < row_end)[:, None], K, w_ptrs, (n16 < NP16)[:, None],
                                             s_ptrs, (rows < NP16 * 16)[:, None], 0, KB, BN, BK, MX, DECODE,
                                             DOT_F32, EVEN_K, MASK_W)
                _grouped_store(acc_b, offs_a + H, offs_a + H < row_end, rows, N, e64, rf_ptr, stride_rfe,
                               row_scale_ptr, bias_ptr, stride_be, out_ptr, stride_om, HAS_ROW_SCALE, HAS_BIAS)
            else:
                acc_a = fp4_tile_mma(acc_a, xa_ptrs, mask_a[:, None], K, w_ptrs, (n16 < NP16)[:, None], s_ptrs,
                                     (rows < NP16 * 16)[:, None], 0, KB, BN, BK, MX, DECODE, DOT_F32, EVEN_K,
                                     MASK_W)
            _grouped_store(acc_a, offs_a, mask_a, rows, N, e64, rf_ptr, stride_rfe, row_scale_ptr, bias_ptr,
                           stride_be, out_ptr, stride_om, HAS_ROW_SCALE, HAS_BIAS)
        else:
            if ACT == 1:                         # nvfp4:row: the row global scale amax / 2688 (1 for a zero row)
                amax = tl.zeros([BM], dtype=tl.float32)
                offs_k = tl.arange(0, BK)
                for kb in range(0, KB):
                    k_mask = ((kb * BK + offs_k) < K)[None, :]
                    xk = tl.load(x_ptrs + kb * BK, mask=m_mask[:, None] & k_mask, other=0.0)
                    amax = tl.maximum(amax, tl.max(finite_abs(xk.to(tl.float32))[0], axis=1))
                gscale = tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)
            else:
                gscale = tl.full([BM], 1.0, dtype=tl.float32)
            acc = tl.zeros([BN, BM], dtype=tl.float32)
            acc = fp4_tile_mma(acc, x_ptrs, m_mask[:, None], K, w_ptrs, (n16 < NP16)[:, None], s_ptrs,
                               (rows < NP16 * 16)[:, None], 0, KB, BN, BK, MX, DECODE, DOT_F32, EVEN_K, MASK_W,
                               gscale, ACT)
            if ACT == 1:
                acc = acc * gscale[None, :]
            _grouped_store(acc, offs_m, m_mask, rows, N, e64, rf_ptr, stride_rfe, row_scale_ptr, bias_ptr,
                           stride_be, out_ptr, stride_om, HAS_ROW_SCALE, HAS_BIAS)
    elif ZERO_TAIL:   # the programs past the experts' tiles zero the rows past offsets[E] (no memset launch)
        tail0 = tl.load(off_ptr + E) + (pid_m - tl.sum(tiles, 0)) * BM
        offs_m = tail0 + tl.arange(0, BM)
        rows = pid_n * BN + tl.arange(0, BN)
        tl.store(out_ptr + offs_m[None, :].to(tl.int64) * stride_om + rows[:, None],
                 tl.zeros([BN, BM], dtype=out_ptr.dtype.element_ty),
                 mask=(rows < N)[:, None] & (offs_m < R)[None, :])


# W4A4: quantize the activations inside the grouped kernel (True) or in a separate launch first (False). In the K
# loop the quantization is redone for every N tile: sm_90 SASS (Triton 3.6) 14.6 (nvfp4) / 8.5 (mxfp4) instructions
# per weight element at 16x128x128 against 3.25 / 2.99 without; the separate launch (or a fused producer,
# `row_quantize.quantize_dequant_bf16(src_rows=..., silu_mul=...)`) is cheaper.
FUSE_ACT_QUANT = False

GROUPED_M16 = GemmConfig(16, 128, 128, 1, 4, 4)
GROUPED_M32 = GemmConfig(32, 128, 128, 1, 4, 3)


def default_grouped_config(rows: int, n_experts: int, interpret: bool = False) -> GemmConfig:
    """By the mean rows per expert: up to 16, 16-row x 128 tiles; above, 32-row tiles. H200 sweep at the MoE rollout's
    decode batches (benchmarks/kernels_moe.py, 2026-12-01 call 2; Qwen3-30B-A3B gate+up, nvfp4 W4A16, 12 tiles):
    8 rows per expert (B = 128): 16x128x128 86.9 us, 32x128 102.7, 64x128 141.8; 25.6 (B = 409): 32x128x128 w4s3
    121.3, 64x128 149.7, 16x128 169.0; 32 (B = 512): 32x128 150.8, 64x128 154.6, 16x128 198.5. The fastest tile was
    the default at every B (mxfp4 the same)."""
    if interpret:
        return GemmConfig(16, 64, 128, decode=DECODE_PURE)
    return GROUPED_M16 if rows <= 16 * n_experts else GROUPED_M32


def fp4_grouped_matmul(x: torch.Tensor, offsets: torch.Tensor, w: HopperFP4, row_scale: torch.Tensor | None = None,
                       bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16,
                       config: GemmConfig | None = None, out: torch.Tensor | None = None,
                       act_quant: str | None = None, zero_tail: bool = False) -> torch.Tensor:
    """x [R, K] bf16 (rows sorted by expert), offsets [E + 1] int32, w a stacked layout (values [E, ...]) ->
    out [R, N]; rows >= offsets[E] are not written (zeroed with `zero_tail`). `act_quant` "nvfp4:row" /
    "mxfp4": W4A4 with x (bf16) quantized per token inside the kernel (no `row_scale` then)."""
    from trace_rl.kernels import interpreting

    if w.values.dim() != 3:
        raise ValueError("fp4_grouped_matmul: the weight layout must be stacked over experts ([E, ...] values)")
    E = w.values.shape[0]
    R, K = x.shape
    if K != w.k:
        raise ValueError(f"fp4_grouped_matmul: x has {K} columns, the experts {w.k}")
    if offsets.shape != (E + 1,) or offsets.dtype != torch.int32:
        raise ValueError(f"fp4_grouped_matmul: offsets must be int32 [E + 1] = [{E + 1}], got "
                         f"{offsets.dtype} {tuple(offsets.shape)}")
    if act_quant not in (None, "nvfp4:row", "mxfp4"):
        raise ValueError(f"fp4_grouped_matmul: act_quant is None, 'nvfp4:row' or 'mxfp4', not {act_quant!r}")
    if act_quant is not None and row_scale is not None:
        raise ValueError("fp4_grouped_matmul: act_quant computes the row scales itself; pass no row_scale")
    if act_quant is not None and K % (32 if act_quant == "mxfp4" else 16):
        raise ValueError(f"fp4_grouped_matmul: {act_quant} activations need K divisible by its block, K = {K}")
    interp = interpreting()
    c = config or default_grouped_config(R, E, interp)
    if c.tma:
        raise ValueError(f"fp4_grouped_matmul: tma=True ({c}) is a dense-GEMM variant (fp4_gemm_tma.py); the "
                         f"grouped kernel has none: pass a config without tma")
    if interp and c.decode != DECODE_PURE:
        c = GemmConfig(c.block_m, c.block_n, c.block_k, decode=DECODE_PURE, dual=c.dual)
    if c.dual and (act_quant is not None or c.block_m < 32):
        raise ValueError(f"fp4_grouped_matmul: a dual config ({c}) needs block_m >= 32 and no act_quant")
    c.check()
    np_, kp = w.padded
    if kp % c.block_k:
        c = GemmConfig(c.block_m, c.block_n, COLS, 1, c.num_warps, c.num_stages, c.decode, c.dual)
    out = torch.empty(R, w.n, device=x.device, dtype=out_dtype) if out is None else out
    if R == 0:
        return out
    scales = w.scales.view(torch.int32)
    grid = (triton.cdiv(np_, c.block_n), triton.cdiv(R, c.block_m) + E + 1)
    _fp4_grouped_kernel[grid](
        x, offsets, w.values, scales, w.row_factor, out,
        row_scale if row_scale is not None else w.row_factor, bias if bias is not None else w.row_factor,
        R, w.n, K, kp // c.block_k, np_ // ROWS, E, x.stride(0), w.values.stride(0), w.values.stride(1),
        scales.stride(0), scales.stride(1), w.row_factor.stride(0), out.stride(0),
        bias.stride(0) if bias is not None else 0,
        MX=w.fmt == "mxfp4", HAS_ROW_SCALE=row_scale is not None, HAS_BIAS=bias is not None,
        E_POW2=triton.next_power_of_2(E), BM=c.block_m, BN=c.block_n, BK=c.block_k, DECODE=c.decode,
        DOT_F32=interp, EVEN_K=K % c.block_k == 0, MASK_W=np_ % c.block_n != 0,
        ACT=ACT_IDS[act_quant], ZERO_TAIL=zero_tail, DUAL=c.dual, num_warps=c.num_warps, num_stages=c.num_stages)
    return out


ACT_IDS = {None: 0, "nvfp4:row": 1, "mxfp4": 2}


def grouped_gate_case(cfg: GemmConfig, fmt: str, n_experts: int = 128, budget: float = GEMM_BUDGET,
                      act: str | None = None):
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(x_ptr="*bf16", off_ptr="*i32", w_ptr="*i32", s_ptr="*i32", rf_ptr="*fp32", out_ptr="*bf16",
               row_scale_ptr="*fp32", bias_ptr="*fp32", R="i32", N="i32", K="i32", KB="i32", NP16="i32", E="i32",
               stride_xm="i32", stride_we="i32", stride_w="i32", stride_se="i32", stride_s="i32", stride_rfe="i32",
               stride_om="i32", stride_be="i32")
    consts = dict(MX=fmt == "mxfp4", HAS_ROW_SCALE=False, HAS_BIAS=False, E_POW2=n_experts, BM=cfg.block_m,
                  BN=cfg.block_n, BK=cfg.block_k, DECODE=DECODE_ASM, DOT_F32=False, EVEN_K=True, MASK_W=False,
                  ACT=ACT_IDS[act], ZERO_TAIL=True, DUAL=cfg.dual)
    div = ("x_ptr", "off_ptr", "w_ptr", "s_ptr", "rf_ptr", "out_ptr", "K", "stride_xm", "stride_we", "stride_w",
           "stride_se", "stride_s", "stride_rfe", "stride_om")
    tiles = f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k} w{cfg.num_warps}s{cfg.num_stages}{' dual' if cfg.dual else ''}"
    return GateCase(f"grouped {fmt}{'' if act is None else ' a4'} {tiles}",
                    _fp4_grouped_kernel, sig, consts, cfg.num_warps, cfg.num_stages,
                    cfg.block_n * cfg.block_k / (32 * cfg.num_warps), budget, div)


def sass_gate_cases():
    return [grouped_gate_case(cfg, fmt, budget=b) for cfg, b in ((GROUPED_M16, 3.3), (GROUPED_M32, 3.4))
            for fmt in ("nvfp4", "mxfp4")]
