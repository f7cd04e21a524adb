"""CISPO (MiniMax-M1): clip the importance weight, not the update — every token keeps its gradient.

Per token, with r = π_θ/π_old and sg the stop-gradient:

    objective_t = −sg(clip(r, 1 − ε_low, 1 + ε_high)) · A · log π_θ(y_t),   default (ε_low, ε_high) = (1.0, 0.28)

(ε_low = 1 means no lower bound, as in the paper.) The gradient is −clip(r)·A·∇log π_θ; at r = 1 it is
the plain policy gradient. "clip_fraction" counts tokens whose weight was clipped (their gradient is
scaled, not removed).
"""

from __future__ import annotations

import torch

from trace_rl.objectives.policy_gradient import PolicyGradientLoss


class CISPOLoss(PolicyGradientLoss):
    """CISPO. See `PolicyGradientLoss` for arguments, keys and outputs."""

    default_clip = (1.0, 0.28)

    def token_objective(
        self, log_ratio: torch.Tensor, advantage: torch.Tensor, log_prob: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ratio = log_ratio.detach().exp()
        weight = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        return -weight * advantage * log_prob, weight != ratio
