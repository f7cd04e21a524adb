"""How per-token losses [B, Lr] become one scalar. Only tokens with mask True count, in numerator and
denominator alike (tokens masked by a correction leave the denominator too).

- "token_mean":    Σ_{b,t} m·ℓ / Σ_{b,t} m — every kept token weighs the same (DAPO's token-level mean).
- "sequence_mean": mean over sequences with >= 1 kept token of (Σ_t m·ℓ / Σ_t m) — every sequence weighs
                   the same (the original GRPO).
- "constant":      Σ_{b,t} m·ℓ / (B · normalizer) — a fixed denominator (Dr. GRPO, normalizer = the
                   generation budget), independent of lengths and of masking; B counts every row.

With no kept token the result is 0 (nothing to learn), not NaN; NaN in a kept token stays NaN.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token_mean", "sequence_mean", "constant"]


def aggregate(
    values: torch.Tensor, mask: torch.Tensor, mode: Aggregation = "token_mean", normalizer: float | None = None
) -> torch.Tensor:
    mask = mask.bool()
    kept = torch.where(mask, values, 0.0)  # select, not multiply: NaN * 0 is NaN in padding
    if mode == "token_mean":
        return kept.sum() / mask.sum().clamp_min(1)
    if mode == "sequence_mean":
        count = mask.sum(-1)
        per_seq = kept.sum(-1) / count.clamp_min(1)
        return per_seq.sum() / (count > 0).sum().clamp_min(1)
    if mode == "constant":
        if normalizer is None or normalizer <= 0:
            raise ValueError("aggregation 'constant' needs a positive normalizer (e.g. max_new_tokens)")
        return kept.sum() / (values.shape[0] * normalizer)
    raise ValueError(f"unknown aggregation {mode!r}; use token_mean, sequence_mean or constant")
