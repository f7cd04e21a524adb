"""Large-M dense FP4 linear: dequantize the weight to a bf16 scratch [N, K], then one cuBLAS GEMM.

At M >= `DEQUANT_CUBLAS_MIN_M` rows the FP4 GEMM (fp4_gemm.py) is issue-bound on decoding the weight in its K
loop (0.36-0.55x cuBLAS BF16 at M >= 128 on the H200, issue 17), while the weight's bytes no longer dominate.
So, as vLLM's AWQ/GPTQ paths do at large M: one small kernel writes the bf16 operand the FP4 GEMM would
multiply (below) into a scratch buffer, cuBLAS multiplies it with float32 output (`torch.mm(..., out_dtype=
torch.float32)`), and the FP4 GEMM's own epilogue (`fp4_gemm._epilogue_store`: row factor, W4A4 per-token
scale, bias, one rounding to the output dtype) finishes. The result differs from `fp4_matmul` only in the
order of the float32 accumulation.

**The operand** is exactly the Hopper layout's (hopper_fp4.py, `operand(h)`): the product is taken from the
reference codes `q.codes` and
- nvfp4: E2M1 x E4M3 scale x 2**-19 (2-bit x 4-bit significands, >= 2**-29: exact in bf16; a NaN scale's
  block is NaN, a zero scale's block +-0, a negative scale flips the signs), with the row factor
  (global x 2**19) in the epilogue;
- mxfp4: E2M1 x 2**-126 x 2**(b - 127), b the layout's pre-biased scale byte (the row's largest exponent maps
  to b = 254), row factor 2**c_n in the epilogue. Exact in bf16 for blocks within 133 binades of their row's
  largest; blocks further below round into bf16 subnormals (or to zero) exactly as the FP4 GEMM's
  `mul.bf16x2` rounds them (one round-to-nearest-even of the exact product), so both paths see the same
  operand. A NaN block (b = 255) decodes as Inf and its row factor is NaN: the row is NaN in both paths.
The float32 product is exact before the one rounding to bf16 (Triton's float32 multiply keeps subnormals: the
sm_90 SASS has FMUL without .FTZ; flush-to-zero is only set for libdevice calls).

**Scratch**: one bf16 buffer per (device, N, K), allocated on first use outside CUDA-graph capture (the
engine's warm-up steps run before capture) and never freed, so a captured graph keeps a valid pointer; layers
of one shape share it (stream-ordered: a layer's GEMM reads it before the next layer's dequantization writes).
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from trace_rl.kernels.fp4_gemm import _epilogue_store
from trace_rl.kernels.hopper_fp4 import HopperFP4, block_size, operand

# When the dense FP4 linear takes this path: M >= DEQUANT_CUBLAS_MIN_M rows and a weight of at most
# DEQUANT_CUBLAS_MAX_WEIGHT elements. Measured on the H200 (benchmarks/fp4_dequant_mm.py, results in
# benchmarks/results/fp4_dequant_mm_h200.json; nvfp4, dequant + cuBLAS time over the FP4 GEMM's, W4A4):
#   2048x4096, 4096x2048, 5120x2048 (<= 10.5M elements, the bf16 scratch <= 21 MB stays in the 50 MB L2):
#     M = 64: 0.76-0.96x (slower), M = 128-512: 1.07-1.34x faster;
#   4096x12288, 12288x4096 (50M elements, a 100 MB scratch through HBM; dequantizing alone takes 50 us):
#     M = 64-256: 0.36-0.79x, M = 471-512: 0.96-1.04x (a tie).
# So the path is for weights whose scratch fits comfortably in L2; sizes between 10.5M and 50M elements are not
# measured and stay on the FP4 GEMM (12M elements = a 24 MB scratch, half the L2).
DEQUANT_CUBLAS_MIN_M = 128
DEQUANT_CUBLAS_MAX_WEIGHT = 12 * 2**20
# TRACE_RL_FP4_DEQUANT_CUBLAS=0 keeps the FP4 GEMM at every M (A/B runs).
ENABLED = os.environ.get("TRACE_RL_FP4_DEQUANT_CUBLAS", "1") != "0"

BLOCK_N, BLOCK_K = 32, 256
EPI_BM, EPI_BN = 32, 128


def use_dequant_cublas(m: int, n: int, k: int) -> bool:
    """Whether the dense FP4 linear of `m` rows over an [n, k] weight takes the dequantize + cuBLAS path."""
    return ENABLED and m >= DEQUANT_CUBLAS_MIN_M and n * k <= DEQUANT_CUBLAS_MAX_WEIGHT


@triton.jit
def _operand_bits(codes_ptr, scales_ptr, N, K, stride_c, stride_s, MX: tl.constexpr, BN: tl.constexpr,
                  BK: tl.constexpr):
    """The bf16 operand (module doc) of this program's [BN, BK] tile as int32 holding bf16 bits, with the tile's
    int64 rows [BN, 1] and row mask. Codes are loaded as bytes (two per byte, even column in the low nibble) and
    scales once per block, broadcast over the block's columns. Also the FP8 operand cache's weight writer
    (operand_cache_fp8.py), which must see these exact bits."""
    G: tl.constexpr = 32 if MX else 16
    rows = tl.program_id(0) * BN + tl.arange(0, BN)
    r64 = rows[:, None].to(tl.int64)
    row_ok = (rows < N)[:, None]
    c2 = tl.program_id(1) * (BK // 2) + tl.arange(0, BK // 2)
    byte = tl.load(codes_ptr + r64 * stride_c + c2[None, :], mask=row_ok & (c2 < K // 2)[None, :],
                   other=0).to(tl.int32)
    c = tl.reshape(tl.join(byte & 15, byte >> 4), (BN, BK))             # column 2j: low nibble of byte j
    cs = tl.program_id(1) * (BK // G) + tl.arange(0, BK // G)
    s = tl.load(scales_ptr + r64 * stride_s + cs[None, :], mask=row_ok & (cs < K // G)[None, :],
                other=0).to(tl.int32)
    if MX:
        # E2M1 x 2**-126: the code's bits at bf16 bits 15, 8, 7, 6 (0.5 -> a subnormal), as float32
        code = (((c >> 3) << 31) | ((c & 7) << 22)).to(tl.float32, bitcast=True)
        scale = (s << 23).to(tl.float32, bitcast=True)                # 2**(b - 127); 0 for b = 0, Inf for 255
    else:
        e = (c >> 1) & 3
        m = c & 1
        mag = tl.where(e == 0, m * 0x3F000000, ((e + 126) << 23) | (m << 22))   # 0, 0.5 | (1 + m/2) 2**(e-1)
        code = (mag | ((c >> 3) << 31)).to(tl.float32, bitcast=True)
        se = (s >> 3) & 15
        sm = s & 7
        scale = tl.where(se == 0, sm.to(tl.float32) * 0.001953125,               # E4M3 subnormal: m 2**-9
                         (((se + 120) << 23) | (sm << 20)).to(tl.float32, bitcast=True))
        scale = tl.where((s & 0x7F) == 0x7F, float("nan"), tl.where(s >= 128, -scale, scale))
        scale = scale * 1.9073486328125e-06                             # 2**-19 (exact): the layout's bias
    w = tl.reshape(tl.reshape(code, (BN, BK // G, G)) * scale[:, :, None], (BN, BK))
    u = w.to(tl.int32, bitcast=True)
    if MX:
        # Round to bf16 (nearest even) on the bits: right for subnormals also under the interpreter (whose
        # float32 -> bf16 cast mishandles them); NaN stays NaN (the GPU's NaN is 0x7FFFFFFF: no carry).
        bits = tl.where(w != w, (u >> 16) | 0x7FC0, (u + 0x7FFF + ((u >> 16) & 1)) >> 16)
    else:
        bits = u >> 16                                                  # exact in bf16: the low half is zero
    return bits, r64, row_ok


@triton.jit
def _dequant_kernel(codes_ptr, scales_ptr, out_ptr, N, K, stride_c, stride_s, stride_o,
                    MX: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    """out[BN, BK] tile = the bf16 operand (module doc, `_operand_bits`), stored as int16 bits."""
    bits, r64, row_ok = _operand_bits(codes_ptr, scales_ptr, N, K, stride_c, stride_s, MX, BN, BK)
    cols = tl.program_id(1) * BK + tl.arange(0, BK)
    tl.store(out_ptr + r64 * stride_o + cols[None, :], bits.to(tl.int16), mask=row_ok & (cols < K)[None, :])


@triton.jit
def _epilogue_kernel(y_ptr, rf_ptr, row_scale_ptr, bias_ptr, out_ptr, M, N, stride_y, stride_o,
                     HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr):
    """out = epilogue(y) with the FP4 GEMM's own epilogue code (y [M, N] float32, read as [BN, BM] tiles)."""
    offs_m = tl.program_id(0) * BM + tl.arange(0, BM)
    rows = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.load(y_ptr + offs_m[None, :].to(tl.int64) * stride_y + rows[:, None],
                  mask=(rows < N)[:, None] & (offs_m < M)[None, :], other=0.0)
    _epilogue_store(acc, rows, offs_m, N, M, rf_ptr, row_scale_ptr, bias_ptr, out_ptr, stride_o,
                    HAS_ROW_SCALE, HAS_BIAS)


def _use_triton(t: torch.Tensor) -> bool:
    from trace_rl.kernels import interpreting

    return t.is_cuda or interpreting()


def dequant_reference(q, h: HopperFP4) -> torch.Tensor:
    """bf16 [N, K]: the torch reference of the dequantization kernel (the Hopper layout's operand)."""
    return operand(h)


_SCRATCH: dict = {}


def scratch(device, n: int, k: int) -> torch.Tensor:
    """The bf16 [n, k] scratch of this device and shape (see the module doc)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    key = (dev, n, k)
    buf = _SCRATCH.get(key)
    if buf is None:
        if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"fp4 dequant + cuBLAS: the bf16 scratch for a {n}x{k} weight would be allocated "
                               "inside a CUDA-graph capture; run the layer once (at this M) before capturing")
        buf = torch.empty(n, k, dtype=torch.bfloat16, device=key[0])
        _SCRATCH[key] = buf
    return buf


def dequantize_to(q, h: HopperFP4, out: torch.Tensor) -> torch.Tensor:
    """Write the bf16 operand of weight `q` (its Hopper layout `h`) into `out` [N, K]."""
    n, k = h.n, h.k
    if len(q.shape) != 2 or q.format not in ("nvfp4", "mxfp4"):
        raise ValueError(f"fp4 dequant: takes a 2-D nvfp4/mxfp4 weight, got {q.format} {tuple(q.shape)}")
    if not _use_triton(out):
        return out.copy_(operand(h))
    mx = q.format == "mxfp4"
    codes = q.codes.reshape(n, k // 2)
    scales = h.scales if mx else q.scales.reshape(n, k // block_size(q.format)).view(torch.uint8)
    grid = (triton.cdiv(n, BLOCK_N), triton.cdiv(k, BLOCK_K))
    _dequant_kernel[grid](codes, scales, out.view(torch.int16), n, k, codes.stride(0), scales.stride(0), out.stride(0),
                          MX=mx, BN=BLOCK_N, BK=BLOCK_K, num_warps=4)
    return out


def dequant_matmul(x2: torch.Tensor, q, h: HopperFP4, row_scale: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """x2 [M, K] bf16 @ W^T -> [M, N] `out_dtype`, the same math as `fp4_matmul(x2, h, row_scale, bias, out_dtype)`
    up to float32 accumulation order: W dequantized to the scratch, cuBLAS (float32 output), the FP4 epilogue."""
    if x2.shape[1] != h.k:
        raise ValueError(f"dequant_matmul: x has {x2.shape[1]} columns, the weight {h.k}")
    return operand_matmul(x2, dequantize_to(q, h, scratch(x2.device, h.n, h.k)), h, row_scale, bias, out_dtype)


def operand_matmul(x2: torch.Tensor, w: torch.Tensor, h: HopperFP4, row_scale: torch.Tensor | None = None,
                   bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """x2 [M, K] bf16 @ w^T with `w` [N, K] = operand(h) already written (the scratch above, or a persistent
    operand cache: kernels/operand_cache.py): cuBLAS with float32 output, then the FP4 epilogue of `h`."""
    if x2.shape[1] != h.k or tuple(w.shape) != (h.n, h.k):
        raise ValueError(f"operand_matmul: x {tuple(x2.shape)} and operand {tuple(w.shape)} for a {h.n}x{h.k} weight")
    return factor_matmul(x2, w, h.row_factor, row_scale, bias, out_dtype)


def accumulate(x2: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The GEMM of `factor_matmul` before its epilogue: x2 [M, K] @ w[N, K]^T as float32 [M, N] (cuBLAS with float32
    output; also the start of `epilogue_silu_quantize`'s fused path, which must see the same accumulator). E4M3
    operands (the FP8 operand cache, operand_cache_fp8.py): `accumulate_fp8`, cuBLAS FP8 with float32 output."""
    if x2.dtype == torch.float8_e4m3fn or w.dtype == torch.float8_e4m3fn:
        from trace_rl.kernels.operand_cache_fp8 import accumulate_fp8

        return accumulate_fp8(x2, w)
    if x2.is_cuda:
        return torch.mm(x2, w.t(), out_dtype=torch.float32)
    return x2.float() @ w.float().t()   # CPU has no mm.dtype: bf16 x bf16 products are exact in float32


def factor_matmul(x2: torch.Tensor, w: torch.Tensor, rf: torch.Tensor, row_scale: torch.Tensor | None = None,
                  bias: torch.Tensor | None = None, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """`operand_matmul` with the row factor given as float32 `rf` [>= N] instead of read from a layout: cuBLAS
    (float32 output) on x2 [M, K] and the bf16 operand w [N, K] (or both E4M3: `accumulate`), then the FP4
    epilogue (y x rf[n] x row_scale[m] + bias[n], one rounding). Also the stacked operand cache's GEMM
    (operand_cache.stacked_matmul), whose rf holds each stacked part's own factors."""
    M, K = x2.shape
    N = w.shape[0]
    if w.shape[1] != K or rf.shape[0] < N:
        raise ValueError(f"factor_matmul: x {tuple(x2.shape)}, operand {tuple(w.shape)}, {rf.shape[0]} row factors")
    y = accumulate(x2, w)
    if not _use_triton(y):
        y = y * rf[:N]
        if row_scale is not None:
            y = y * row_scale.float()[:, None]
        if bias is not None:
            y = y + bias.float()
        return y.to(out_dtype)
    out = torch.empty(M, N, device=x2.device, dtype=out_dtype)
    grid = (triton.cdiv(M, EPI_BM), triton.cdiv(N, EPI_BN))
    _epilogue_kernel[grid](y, rf, row_scale if row_scale is not None else rf, bias if bias is not None else rf,
                           out, M, N, y.stride(0), out.stride(0), HAS_ROW_SCALE=row_scale is not None,
                           HAS_BIAS=bias is not None, BM=EPI_BM, BN=EPI_BN, num_warps=4)
    return out


__all__ = ["DEQUANT_CUBLAS_MAX_WEIGHT", "DEQUANT_CUBLAS_MIN_M", "ENABLED", "accumulate", "dequant_matmul",
           "dequant_reference", "dequantize_to", "factor_matmul", "operand_matmul", "scratch", "use_dequant_cublas"]


def sass_gate_cases():
    """The compile gate's whole-kernel cases (loop-free: a program dequantizes one BLOCK_N x BLOCK_K tile).
    Budgets: Triton 3.6 (CPU compile, 2026-12-01) gives 18.1 (nvfp4) and 15.4 (mxfp4) SASS per element, +~10%."""
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(codes_ptr="*u8", scales_ptr="*u8", out_ptr="*i16", N="i32", K="i32", stride_c="i32",
               stride_s="i32", stride_o="i32")
    return [GateCase(f"dequant {fmt} {BLOCK_N}x{BLOCK_K}", _dequant_kernel, sig,
                     dict(MX=fmt == "mxfp4", BN=BLOCK_N, BK=BLOCK_K), 4, 1, BLOCK_N * BLOCK_K / 128, budget,
                     divisible=("codes_ptr", "scales_ptr", "out_ptr", "K", "stride_c", "stride_s", "stride_o"),
                     register_a=False, forbid=(), whole_kernel=True)
            for fmt, budget in (("nvfp4", 20.0), ("mxfp4", 17.0))]
