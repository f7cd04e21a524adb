"""Decode attention over a paged KV cache in torch: the reference (any format) and two fast bf16 paths.

All take one new query per sequence, q [B, Hq, D], the layer's K and V `PagedKV`, block tables
[B, pages] and `seq_lens` [B] (tokens to attend, the new one included), and return [B, Hq, D].

- `reference`: gathers every position of the block table through `PagedKV.read_reference`
  (dequantizing), masks positions >= seq_len, softmax in float32 (float64 for float64 inputs). Works
  for every format and any block table; on a GPU it reads and dequantizes the whole table each step, so
  it is a correctness path, not a fast one.
- `flash_varlen` (bf16 cache on CUDA, slot-contiguous pages: row b's pages are b*P .. b*P+P-1): FlashAttention's
  varlen kernel through `torch.ops.aten._flash_attention_forward`, with `seqused_k` so that it reads
  only the live tokens; a KV head's query heads ride as query rows (K/V read once). No gather, no mask.
- `sdpa_masked` (same layout): `scaled_dot_product_attention` over the slot's whole capacity with a
  length mask; query heads of a KV group ride in the query-length dimension (no K/V repeat).
- `efficient_varlen` (same layout): the CUTLASS memory-efficient kernel
  (`torch.ops.aten._efficient_attention_forward`) with per-sequence key lengths (`seqlen_k`), reading the
  cache in its native [tokens, heads, D] layout; query heads of a KV head ride as query rows, as above.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trace_rl.formats.paged_kv import PagedKV, slots_for


def _compute_dtype(q: torch.Tensor) -> torch.dtype:
    return torch.float64 if q.dtype == torch.float64 else torch.float32


def reference(q: torch.Tensor, k_cache: PagedKV, v_cache: PagedKV, block_table: torch.Tensor,
              seq_lens: torch.Tensor, scale: float, max_len: int | None = None) -> torch.Tensor:
    b, hq, d = q.shape
    length = max_len if max_len is not None else block_table.shape[1] * k_cache.block_size
    pos = torch.arange(length, device=q.device)
    slots = slots_for(block_table, pos.expand(b, length), k_cache.block_size).reshape(-1)
    hkv = k_cache.heads
    ct = _compute_dtype(q)
    k = k_cache.read_reference(slots).view(b, length, hkv, d).to(ct)
    v = v_cache.read_reference(slots).view(b, length, hkv, d).to(ct)
    qg = q.to(ct).view(b, hkv, hq // hkv, d)
    scores = torch.einsum("bhgd,blhd->bhgl", qg, k) * scale
    dead = (pos[None, :] >= seq_lens.view(b, 1).long()).view(b, 1, 1, length)
    probs = torch.softmax(scores.masked_fill(dead, float("-inf")), dim=-1)
    return torch.einsum("bhgl,blhd->bhgd", probs, v).reshape(b, hq, d).to(q.dtype)


def flash_varlen(q: torch.Tensor, k_cache: PagedKV, v_cache: PagedKV, seq_lens: torch.Tensor, scale: float,
                 capacity: int) -> torch.Tensor:
    b, hq, d = q.shape
    hkv = k_cache.heads
    g = hq // hkv
    # The G query heads of a KV head become G query *rows* of a sequence (FlashAttention's own decode
    # trick): one program per (sequence, KV head) reads that head's K/V once instead of G times.
    qg = q.view(b, hkv, g, d).transpose(1, 2).reshape(b * g, hkv, d)
    k = k_cache.codes.view(-1, hkv, d)
    v = v_cache.codes.view(-1, hkv, d)
    rows = torch.arange(b + 1, device=q.device, dtype=torch.int32)
    out = torch.ops.aten._flash_attention_forward(
        qg, k, v, rows * g, rows * capacity, g, capacity, 0.0, False, False,
        scale=scale, seqused_k=seq_lens.to(torch.int32))[0]
    return out.view(b, g, hkv, d).transpose(1, 2).reshape(b, hq, d)


def sdpa_masked(q: torch.Tensor, k_cache: PagedKV, v_cache: PagedKV, seq_lens: torch.Tensor, scale: float,
                capacity: int, span: int | None = None, backend: str | None = None) -> torch.Tensor:
    """SDPA over the first `span` positions of each slot (default: its capacity) with a length mask;
    `backend` "cudnn" forces cuDNN's kernel (the fastest bf16 decode attention measured on the H200 at
    long contexts), None lets SDPA choose."""
    from contextlib import nullcontext

    b, hq, d = q.shape
    hkv = k_cache.heads
    span = span or capacity
    k = k_cache.codes.view(-1, hkv, d)[: b * capacity].view(b, capacity, hkv, d)[:, :span].transpose(1, 2)  # a view
    v = v_cache.codes.view(-1, hkv, d)[: b * capacity].view(b, capacity, hkv, d)[:, :span].transpose(1, 2)
    live = torch.arange(span, device=q.device)[None, :] < seq_lens.view(b, 1)
    if backend is not None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        chosen = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION}[backend]
        context = sdpa_kernel(chosen)
    else:
        context = nullcontext()
    with context:
        out = F.scaled_dot_product_attention(q.view(b, hkv, hq // hkv, d), k, v, attn_mask=live.view(b, 1, 1, span),
                                             scale=scale)
    return out.reshape(b, hq, d)


def efficient_varlen(q: torch.Tensor, k_cache: PagedKV, v_cache: PagedKV, seq_lens: torch.Tensor, scale: float,
                     capacity: int) -> torch.Tensor:
    b, hq, d = q.shape
    hkv = k_cache.heads
    g = hq // hkv
    qg = q.view(b, hkv, g, d).transpose(1, 2).reshape(1, b * g, hkv, d)
    k = k_cache.codes.view(1, -1, hkv, d)
    v = v_cache.codes.view(1, -1, hkv, d)
    rows = torch.arange(b + 1, device=q.device, dtype=torch.int32)
    out = torch.ops.aten._efficient_attention_forward(
        qg, k, v, None, rows * g, rows * capacity, g, capacity, 0.0, 0, False, scale=scale,
        seqlen_k=seq_lens.to(torch.int32))[0]
    return out.view(b, g, hkv, d).transpose(1, 2).reshape(b, hq, d)
