"""Torch reference of paged decode attention over a quantized KV cache (the spec the kernel is tested
against, and the native engine's CPU path). No Triton here."""

from __future__ import annotations

import torch

from trace_rl.formats.paged_kv import PagedKV, slots_for


def decode_attention_reference(q: torch.Tensor, k: PagedKV, v: PagedKV, block_table: torch.Tensor,
                               seq_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """One decode step of grouped-query attention: q [B, Hq, D] attends, per sequence b, over its first
    seq_lens[b] cached tokens (pages listed in block_table[b]). K/V are gathered and dequantized with
    `PagedKV.read_reference`; scores and softmax in float32. A sequence of length 0 gives zeros.
    Returns [B, Hq, D] in q.dtype."""
    B, Hq, D = q.shape
    hkv = k.heads
    if Hq % hkv:
        raise ValueError(f"grouped-query attention needs query heads ({Hq}) to be a multiple of KV heads ({hkv})")
    out = torch.zeros(B, Hq, D, dtype=q.dtype, device=q.device)
    for b in range(B):
        length = int(seq_lens[b])
        if length == 0:
            continue
        pos = torch.arange(length, device=block_table.device)
        slots = slots_for(block_table[b : b + 1], pos[None], k.block_size)[0]
        kb = k.read_reference(slots).float()                               # [L, Hkv, D]
        vb = v.read_reference(slots).float()
        qb = q[b].float().reshape(hkv, Hq // hkv, D)
        scores = torch.einsum("hgd,lhd->hgl", qb, kb) * scale
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("hgl,lhd->hgd", probs, vb).reshape(Hq, D).to(q.dtype)
    return out


def qk_norm_rope_kv_write_reference(q, k, v, cos, sin, k_cache: PagedKV, v_cache: PagedKV, slots,
                                    q_norm_weight=None, k_norm_weight=None, eps: float = 1e-6):
    """Torch reference of `kernels.qk_norm_rope_kv_write`: RMSNorm as trace_rl/models/norm.py (float32
    statistics, cast back, times the weight), RoPE as trace_rl/models/rope.py (`x cos + rotate_half(x) sin`
    in the activation dtype), then `write_reference` of k and v. Returns (q_out, k_out)."""
    def norm(x, w):
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        return w * h.to(x.dtype)

    def rope(x):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos[:, None, :] + rotated * sin[:, None, :]

    if q_norm_weight is not None:
        q, k = norm(q, q_norm_weight), norm(k, k_norm_weight)
    q, k = rope(q), rope(k)
    k_cache.write_reference(slots, k)
    v_cache.write_reference(slots, v)
    return q, k
