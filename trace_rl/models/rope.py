"""Rotary position embeddings, computed from positions on the fly (no table: static shapes, any position).

Numerics follow transformers: inverse frequencies and angles in float32, cos/sin cast to the activation
dtype, `x * cos + rotate_half(x) * sin` with the half-split (not interleaved) pairing.
"""

from __future__ import annotations

import math

import torch

from trace_rl.models.config import ModelConfig


def inverse_frequencies(config: ModelConfig, device: torch.device | str | None = None) -> torch.Tensor:
    """float32 [head_dim / 2]: base^(-2i/d), with Llama 3's long-context rescaling when configured."""
    d = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    # rope_type == "llama3": low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype):
    """cos, sin [..., head_dim] for integer positions [...], in `dtype`."""
    freqs = positions[..., None].float() * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, T, H, D]; cos/sin [B, T, D] (broadcast over heads)."""
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
