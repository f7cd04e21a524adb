"""`causal_attention`: causal SDPA from position 0 over [B, T, H, D] tensors, grouped-query heads allowed.
The trainer's attention (every layer, forward and backward) and prefill over the K/V read back from the
cache (`KVStep.attend`) both call it.

How SDPA is called (`attention_plan`), never changing the result beyond float rounding:
- "sdpa": as many K/V heads as query heads.
- "sdpa_gqa": `enable_gqa=True`, SDPA broadcasts each K/V head to its group of query heads. CPU (its flash
  kernel takes GQA in float32), and CUDA in bf16/fp16, autocast's included (FlashAttention and cuDNN take GQA).
- "expand_kv": on CUDA in float32, K/V are repeated to the query heads first (`repeat_interleave` on the
  head dim: query head h reads K/V head h // (Hq / Hkv), what `enable_gqa` means) and SDPA is called
  without `enable_gqa`. Why: FlashAttention and cuDNN take only fp16/bf16, and the memory-efficient kernel,
  the one fused kernel that takes float32, refuses `enable_gqa` in torch <= 2.13 (sdp_utils.cpp instantiates
  `check_batch_size_and_num_heads_dense<false>` for it), so SDPA falls back to its math kernel, which
  materialises the B x Hq x T x T scores in float32 and keeps the softmax for backward: 2.3 GiB per layer at
  the stability study's micro-batch (64 x 1274 tokens, 6 heads). With equal head counts the efficient kernel
  applies; the repeat costs Hq/Hkv copies of K/V (the math kernel makes the same copies itself).
  Skipped where the efficient kernel takes GQA itself (`efficient_takes_gqa`: torch builds with
  pytorch#191085).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

PLANS = ("sdpa", "sdpa_gqa", "expand_kv")


def attention_plan(device_type: str, dtype: torch.dtype, q_heads: int, kv_heads: int,
                   efficient_gqa: bool = False) -> str:
    """How `causal_attention` calls SDPA (one of `PLANS`; see the module docstring). `efficient_gqa`:
    whether SDPA's memory-efficient kernel takes `enable_gqa` on this device (`efficient_takes_gqa`)."""
    if q_heads == kv_heads:
        return "sdpa"
    if q_heads % kv_heads:
        raise ValueError(f"{kv_heads} K/V heads do not divide {q_heads} query heads")
    if device_type == "cuda" and dtype == torch.float32 and not efficient_gqa:
        return "expand_kv"
    return "sdpa_gqa"


@functools.cache
def efficient_takes_gqa(device: torch.device) -> bool:
    """Whether SDPA's memory-efficient kernel accepts a float32 causal call with 4 query / 2 K/V heads and
    `enable_gqa` on this CUDA device (asked of torch's own dispatch checks, once per device)."""
    q = torch.zeros(1, 4, 8, 64, device=device)
    k = torch.zeros(1, 2, 8, 64, device=device)
    params = torch.backends.cuda.SDPAParams(q, k, k, None, 0.0, True, True)
    return bool(torch.backends.cuda.can_use_efficient_attention(params, False))


def plan_for(q: torch.Tensor, k: torch.Tensor) -> str:
    """`attention_plan` for q [B, T, Hq, D], k [B, T, Hkv, D] in the dtype SDPA will see: under CUDA autocast
    (bf16 SFT) SDPA casts its inputs to the autocast dtype (it is on autocast's lower-precision list), where
    FlashAttention takes GQA, so float32 q (RoPE's float32 cos/sin promote it) is not expanded there. Torch
    is asked (`efficient_takes_gqa`) only where the answer matters: float32 GQA on CUDA."""
    dev = q.device.type
    dtype = torch.get_autocast_dtype(dev) if dev == "cuda" and torch.is_autocast_enabled(dev) else q.dtype
    ask = dev == "cuda" and dtype == torch.float32 and q.shape[2] != k.shape[2]
    return attention_plan(dev, dtype, q.shape[2], k.shape[2], ask and efficient_takes_gqa(q.device))


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """[B, T, H, D] layout in and out; GQA by head groups; causal from position 0 (the trainer's attention
    and prefill over the K/V read back from the cache)."""
    plan = plan_for(q, k)
    if plan == "expand_kv":
        group = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(group, dim=2), v.repeat_interleave(group, dim=2)
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                         is_causal=True, scale=scale, enable_gqa=plan == "sdpa_gqa")
    return out.transpose(1, 2)
