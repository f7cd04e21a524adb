"""W4A16 / W4A4 GEMM: y = x @ dequant(W)^T (+ bias), W in NVFP4 or MXFP4, float32 accumulation.

The weight stays in the reference layout (`PackedWeight.q`: [N, K/2] nibble-packed codes, [N, K/16] E4M3
or [N, K/32] E8M0 scales, one float32 global scale for nvfp4), read as int32 words of 8 codes, so a
weight sync needs no re-layout. A program computes out^T[BLOCK_N, BLOCK_M] = W[BLOCK_N, K] @ x^T[K, BLOCK_M]
("swap AB": the weight is the tensor-core A operand, built in registers; the few activation rows are B).
Per K step it loads BLOCK_K/8 words per weight row (16-byte loads), decodes them to bf16 times the
block scale in registers (`fp4x8_to_bf16`: exact), and accumulates a bf16 x bf16 -> fp32 `tl.dot`.
The nvfp4 global scale, the W4A4 per-token activation global scale and the bias are applied once at
the end. Tall-K shapes at small M split K over programs (SPLIT_K) so that enough of them are in flight;
partial sums go to a float32 buffer and a second kernel adds them in a fixed order (deterministic).

W4A4: activations are quantized per token to the weight's FP4 format by the quantize kernel, which
emits code value * block scale in bf16 (exact) and the row's global scale: the GEMM then computes the
FP4 x FP4 products exactly in bf16 x bf16 -> fp32, as the issue's numerics require.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from trace_rl.kernels.fp_bits import (
    DECODE_ASM,
    DECODE_PURE,
    default_decode,
    dot_acc,
    e4m3_to_float,
    e8m0_to_float,
    fp4x8_to_bf16,
    scale_per_word,
)


@triton.jit
def _fp4_gemm_kernel(
    x_ptr, w_ptr, ws_ptr, out_ptr, row_scale_ptr, bias_ptr, w_global_ptr,
    M, N, K, stride_xm, stride_wn, stride_wsn, stride_om,
    SCALE_E8M0: tl.constexpr, HAS_GLOBAL: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DECODE: tl.constexpr, DOT_F32: tl.constexpr, SCALE_WORDS: tl.constexpr,
):
    G: tl.constexpr = 32 if SCALE_E8M0 else 16          # elements per block scale
    pid_n, pid_m, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    n_mask, m_mask = offs_n < N, offs_m < M
    k_per_split = tl.cdiv(tl.cdiv(K, BLOCK_K), SPLIT_K) * BLOCK_K
    k_lo = pid_k * k_per_split
    k_hi = tl.minimum(k_lo + k_per_split, K)
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    s_rows = ws_ptr + offs_n[:, None].to(tl.int64) * stride_wsn
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        kw = k0 // 8 + tl.arange(0, BLOCK_K // 8)
        words = tl.load(w_rows + kw[None, :], mask=n_mask[:, None] & (kw < K // 8)[None, :], other=0)
        if SCALE_WORDS:   # ws_ptr: the scales viewed as int32, 4 per word (K % (4G) == 0)
            ks = k0 // (4 * G) + tl.arange(0, BLOCK_K // (4 * G))
            sw = tl.load(s_rows + ks[None, :], mask=n_mask[:, None] & (ks < K // (4 * G))[None, :], other=0)
            scale = scale_per_word(sw, G, SCALE_E8M0)
        else:             # byte loads (any K multiple of G; not pipelined by Triton)
            ks = k0 // G + tl.arange(0, BLOCK_K // G)
            sc = tl.load(s_rows + ks[None, :], mask=n_mask[:, None] & (ks < K // G)[None, :], other=0).to(tl.int32)
            if SCALE_E8M0:
                scale = e8m0_to_float(sc)
                scale = tl.join(tl.join(scale, scale), tl.join(scale, scale))   # 4 words per scale
            else:
                scale = e4m3_to_float(sc)
                scale = tl.join(scale, scale)                                   # 2 words per scale
            scale = tl.reshape(scale, [BLOCK_N, BLOCK_K // 8])
        w = fp4x8_to_bf16(words, scale, DECODE)
        kx = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_rows + kx[None, :], mask=m_mask[:, None] & (kx < K)[None, :], other=0.0)
        acc = dot_acc(w, tl.trans(x), acc, DOT_F32)
    out_mask = n_mask[:, None] & m_mask[None, :]
    if SPLIT_K == 1:
        acc = _epilogue(acc, offs_m, offs_n, m_mask, n_mask, row_scale_ptr, bias_ptr, w_global_ptr,
                        HAS_GLOBAL, HAS_ROW_SCALE, HAS_BIAS)
        tl.store(out_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None],
                 acc.to(out_ptr.dtype.element_ty), mask=out_mask)
    else:   # out_ptr is the float32 partial buffer [SPLIT_K, M, N]
        part = out_ptr + pid_k.to(tl.int64) * M * N + offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
        tl.store(part, acc, mask=out_mask)


@triton.jit
def _epilogue(acc, offs_m, offs_n, m_mask, n_mask, row_scale_ptr, bias_ptr, w_global_ptr,
              HAS_GLOBAL: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr):
    """acc [N-tile, M-tile] float32 -> * weight global * activation row global + bias."""
    if HAS_GLOBAL:
        acc = acc * tl.load(w_global_ptr)
    if HAS_ROW_SCALE:
        acc = acc * tl.load(row_scale_ptr + offs_m, mask=m_mask, other=1.0)[None, :]
    if HAS_BIAS:
        acc = acc + tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)[:, None]
    return acc


@triton.jit
def _splitk_reduce_kernel(
    part_ptr, out_ptr, row_scale_ptr, bias_ptr, w_global_ptr, M, N, stride_om,
    HAS_GLOBAL: tl.constexpr, HAS_ROW_SCALE: tl.constexpr, HAS_BIAS: tl.constexpr,
    SPLIT_K: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
):
    offs_m = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    m_mask, n_mask = offs_m < M, offs_n < N
    mask = n_mask[:, None] & m_mask[None, :]
    idx = offs_m[None, :].to(tl.int64) * N + offs_n[:, None]
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):   # fixed order: the result does not depend on scheduling
        acc += tl.load(part_ptr + s * M * N + idx, mask=mask, other=0.0)
    acc = _epilogue(acc, offs_m, offs_n, m_mask, n_mask, row_scale_ptr, bias_ptr, w_global_ptr,
                    HAS_GLOBAL, HAS_ROW_SCALE, HAS_BIAS)
    tl.store(out_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None],
             acc.to(out_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    decode: int = DECODE_ASM


def default_config(M: int, N: int, K: int, num_sms: int = 132, interpret: bool = False,
                   decode: int = DECODE_ASM) -> GemmConfig:
    """Tiles by M bucket, then split K until enough programs are in flight, keeping >= 8 K steps per
    split. Chosen from the H200 sweeps (benchmarks/results/kernels_h200_sweep{1,2}.json, nvfp4 W4A16):
    M <= 16: 16x64x128 tiles, 4 warps, split to ~4 programs per SM (K=4096,N=12288: split 4, 26.7 us;
    K=12288,N=4096: split 8, 26.6 us; 256-deep K steps and 128-wide N tiles were slower). M <= 64:
    64x64x128 with split 2 / 4. M > 64: 128x64x128, split only while the N x M tiles leave SMs idle
    (the float32 partials then cost as much as the weight)."""
    if interpret:   # few programs, big tiles: each interpreted program costs milliseconds
        return GemmConfig(max(16, min(64, triton.next_power_of_2(M))), max(16, min(64, triton.next_power_of_2(N))),
                          max(32, min(256, triton.next_power_of_2(K))), decode=DECODE_PURE)
    if M <= 16:
        bm, bn, bk, warps, stages, target = 16, 64, 128, 4, 4, 4 * num_sms
    elif M <= 64:
        bm, bn, bk, warps, stages, target = triton.next_power_of_2(max(M, 32)), 64, 128, 4, 3, 3 * num_sms // 2
    else:
        bm, bn, bk, warps, stages, target = 128, 64, 128, 4, 3, num_sms
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn)
    split = 1
    while tiles * split < target and K // (bk * split * 2) >= 8:
        split *= 2
    return GemmConfig(bm, bn, bk, split, num_warps=warps, num_stages=stages, decode=decode)


def fp4_matmul(x2: torch.Tensor, words: torch.Tensor, scales: torch.Tensor, w_global: torch.Tensor | None,
               scale_e8m0: bool, row_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None,
               out_dtype: torch.dtype = torch.bfloat16, config: GemmConfig | None = None) -> torch.Tensor:
    """x2 [M, K] bf16 @ W^T, W given as `words` int32 [N, K/8] and uint8 `scales` [N, K/G]."""
    from trace_rl.kernels import interpreting

    M, K = x2.shape
    N = words.shape[0]
    if config is None:
        sms = 132 if interpreting() else torch.cuda.get_device_properties(x2.device).multi_processor_count
        config = default_config(M, N, K, sms, interpreting(), default_decode(x2.device))
    c = config
    out = torch.empty(M, N, device=x2.device, dtype=out_dtype)
    dummy = words   # unused pointer arguments
    flags = dict(HAS_GLOBAL=w_global is not None, HAS_ROW_SCALE=row_scale is not None, HAS_BIAS=bias is not None)
    gl, rs, bs = (t if t is not None else dummy for t in (w_global, row_scale, bias))
    grid = (triton.cdiv(N, c.block_n), triton.cdiv(M, c.block_m), c.split_k)
    target = out if c.split_k == 1 else torch.empty(c.split_k, M, N, device=x2.device, dtype=torch.float32)
    G = 32 if scale_e8m0 else 16
    scale_words = K % (4 * G) == 0 and c.block_k % (4 * G) == 0
    _fp4_gemm_kernel[grid](
        x2, words, scales.view(torch.int32) if scale_words else scales, target, rs, bs, gl, M, N, K, x2.stride(0),
        words.stride(0), scales.stride(0) // 4 if scale_words else scales.stride(0),
        out.stride(0), SCALE_E8M0=scale_e8m0, SPLIT_K=c.split_k, BLOCK_M=c.block_m, BLOCK_N=c.block_n,
        BLOCK_K=c.block_k, DECODE=c.decode, DOT_F32=interpreting(), SCALE_WORDS=scale_words, num_warps=c.num_warps,
        num_stages=c.num_stages, **flags)
    if c.split_k > 1:
        bm, bn = min(64, triton.next_power_of_2(M)), 64
        _splitk_reduce_kernel[(triton.cdiv(N, bn), triton.cdiv(M, bm))](
            target, out, rs, bs, gl, M, N, out.stride(0), SPLIT_K=c.split_k, BLOCK_M=bm, BLOCK_N=bn, **flags)
    return out
