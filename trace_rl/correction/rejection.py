"""Sequence rejection by a length-normalised mismatch score: reject (mask) whole sequences.

- geometric rejection: g = exp(mean_t log ρ_t) (the geometric mean of the ratios); keep iff lo <= g <= hi.
  Unlike Π ρ_t it does not drift with length, so one bound fits short and long answers.
- K3 rejection: k3_t = ρ_t − log ρ_t − 1 >= 0 (the k3 estimator of KL(π_rollout || π_trainer) at token t);
  reject iff mean_t k3_t > threshold (reduce="mean") or max_t k3_t > threshold (reduce="max").

Means and maxima run over the sequence's real tokens.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field

from trace_rl.config import TraceConfig
from trace_rl.correction.base import (
    Correction,
    CorrectionResult,
    per_token,
    register_correction,
    sequence_mean,
)
from trace_rl.correction.masks import BoundsParams


class GeometricParams(BoundsParams):
    """Accepted interval [lo, hi] for the geometric mean of a sequence's ratios."""

    lo: float = Field(0.999, ge=0.0, description="Lowest accepted geometric-mean ratio (inclusive).")
    hi: float = Field(1.001, gt=0.0, description="Highest accepted geometric-mean ratio (inclusive).")


@register_correction("geo_reject")
class GeometricRejection(Correction):
    """Keep a sequence iff lo <= exp(mean_t log ρ_t) <= hi."""

    Params = GeometricParams

    def __init__(self, lo: float = 0.999, hi: float = 1.001):
        super().__init__(lo=lo, hi=hi)

    def compute(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> CorrectionResult:
        return CorrectionResult(keep=per_token(self.params.admits(sequence_mean(log_ratio, mask)), mask))


class K3Params(TraceConfig):
    """Threshold on a sequence's k3 mismatch."""

    threshold: float = Field(0.01, ge=0.0, description="Reject a sequence whose k3 score exceeds this.")
    reduce: Literal["mean", "max"] = Field("mean", description="Score = mean or max over the sequence of k3_t.")


def k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """ρ − log ρ − 1, written as expm1(log ρ) − log ρ for accuracy near ρ = 1."""
    return torch.expm1(log_ratio) - log_ratio


@register_correction("k3_reject")
class K3Rejection(Correction):
    """Reject a sequence iff mean_t (or max_t) of ρ_t − log ρ_t − 1 exceeds `threshold`."""

    Params = K3Params

    def __init__(self, threshold: float = 0.01, reduce: Literal["mean", "max"] = "mean"):
        super().__init__(threshold=threshold, reduce=reduce)

    def compute(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> CorrectionResult:
        values = k3(log_ratio)
        if self.params.reduce == "mean":
            score = sequence_mean(values, mask)
        else:
            score = torch.where(mask, values, -torch.inf).amax(-1)
        # NaN scores compare False; the composer keeps NaN tokens in the loss so they are not hidden.
        return CorrectionResult(keep=per_token(~(score > self.params.threshold), mask))
