"""GRPO with PPO clipping (asymmetric "clip-higher" bounds as in DAPO).

Per token, with r the ratio π_θ/π_old and A the advantage:

    objective_t = −min(r·A, clip(r, 1 − ε_low, 1 + ε_high)·A),      default (ε_low, ε_high) = (0.2, 0.28)

The clip removes the gradient of tokens that already moved past the bound in the advantage's direction
(r > 1 + ε_high with A > 0, r < 1 − ε_low with A < 0); "clip_fraction" counts them. At r = 1 the gradient
is −A·∇log π_θ: the plain policy gradient.
"""

from __future__ import annotations

import torch

from trace_rl.objectives.policy_gradient import PolicyGradientLoss


class GRPOLoss(PolicyGradientLoss):
    """GRPO / DAPO-style clipped surrogate. See `PolicyGradientLoss` for arguments, keys and outputs."""

    default_clip = (0.2, 0.28)

    def token_objective(
        self, log_ratio: torch.Tensor, advantage: torch.Tensor, log_prob: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        ratio = log_ratio.exp()
        unclipped = ratio * advantage
        clipped = ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high) * advantage
        # min picks the clipped branch exactly when the ratio left the interval in A's direction
        clip_active = clipped < unclipped
        return -torch.minimum(unclipped, clipped), clip_active
