"""Truncated importance sampling (TIS): reweight tokens by the trainer/rollout ratio, truncated at C.

- token TIS:    w_t = min(ρ_t, C)
- sequence TIS: w_t = min(Π_s ρ_s, C) for every token t of the sequence (product over its real tokens)

Products are taken in log space (Σ log ρ), so long sequences cannot overflow before truncation.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from trace_rl.config import TraceConfig
from trace_rl.correction.base import Correction, CorrectionResult, per_token, register_correction, sequence_sum


class TISParams(TraceConfig):
    """Parameters of token and sequence TIS."""

    C: float = Field(2.0, gt=0.0, description="Truncation level: importance weights above C are cut to C.")


@register_correction("token_tis")
class TokenTIS(Correction):
    """w_t = min(ρ_t, C)."""

    Params = TISParams

    def __init__(self, C: float = 2.0):
        super().__init__(C=C)

    def compute(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> CorrectionResult:
        return CorrectionResult(weight=log_ratio.clamp(max=math.log(self.params.C)).exp())

    def truncated(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return mask & (log_ratio > math.log(self.params.C))


@register_correction("seq_tis")
class SequenceTIS(Correction):
    """w_t = min(Π_{s in sequence} ρ_s, C), the same for every token of a sequence."""

    Params = TISParams

    def __init__(self, C: float = 2.0):
        super().__init__(C=C)

    def compute(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> CorrectionResult:
        seq = sequence_sum(log_ratio, mask).clamp(max=math.log(self.params.C)).exp()
        return CorrectionResult(weight=per_token(seq, log_ratio))

    def truncated(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return mask & per_token(sequence_sum(log_ratio, mask) > math.log(self.params.C), log_ratio)
