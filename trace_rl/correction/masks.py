"""Masking corrections: drop tokens (or whole sequences) whose importance ratio leaves [lo, hi].

- token mask:    keep token t iff lo <= ρ_t <= hi
- sequence mask: keep every token of a sequence iff lo <= Π_t ρ_t <= hi (compared in log space)

Masked tokens leave the loss, numerator and denominator.
"""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from trace_rl.config import TraceConfig
from trace_rl.correction.base import (
    Correction,
    CorrectionResult,
    log_bound,
    per_token,
    register_correction,
    sequence_sum,
)


class BoundsParams(TraceConfig):
    """An accepted interval [lo, hi] for an importance ratio."""

    lo: float = Field(0.5, ge=0.0, description="Lowest accepted ratio (inclusive).")
    hi: float = Field(2.0, gt=0.0, description="Highest accepted ratio (inclusive).")

    @model_validator(mode="after")
    def _ordered(self):
        if self.lo > self.hi:
            raise ValueError(f"lo ({self.lo}) must be <= hi ({self.hi})")
        return self

    def admits(self, log_value: torch.Tensor) -> torch.Tensor:
        """lo <= exp(log_value) <= hi, elementwise (bool). Compared in log space: a ratio statistic given as
        its log (log ρ_t, Σ log ρ_t, mean log ρ_t) needs no exp, which could overflow."""
        return (log_value >= log_bound(self.lo)) & (log_value <= log_bound(self.hi))


@register_correction("token_mask")
class TokenMask(Correction):
    """Keep token t iff lo <= ρ_t <= hi."""

    Params = BoundsParams

    def __init__(self, lo: float = 0.5, hi: float = 2.0):
        super().__init__(lo=lo, hi=hi)

    def compute(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> CorrectionResult:
        return CorrectionResult(keep=self.params.admits(log_ratio))


@register_correction("seq_mask")
class SequenceMask(Correction):
    """Keep a whole sequence iff lo <= Π_t ρ_t <= hi."""

    Params = BoundsParams

    def __init__(self, lo: float = 0.5, hi: float = 2.0):
        super().__init__(lo=lo, hi=hi)

    def compute(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> CorrectionResult:
        return CorrectionResult(keep=per_token(self.params.admits(sequence_sum(log_ratio, mask)), mask))
