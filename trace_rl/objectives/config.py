"""Pydantic config for the losses, so a pipeline file can name one."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from torch import nn

from trace_rl.config import TraceConfig
from trace_rl.objectives.cispo import CISPOLoss
from trace_rl.objectives.grpo import GRPOLoss
from trace_rl.objectives.policy_gradient import PolicyGradientLoss

LOSSES: dict[str, type[PolicyGradientLoss]] = {"grpo": GRPOLoss, "cispo": CISPOLoss}


class LossConfig(TraceConfig):
    """A GRPO-family loss."""

    kind: Literal["grpo", "cispo"] = Field("grpo", description="'grpo' (PPO clip, DAPO clip-higher) or 'cispo'.")
    clip_epsilon: tuple[float, float] | None = Field(
        None, description="(low, high): ratios clipped to [1-low, 1+high]. None: (0.2, 0.28) for grpo, "
        "(1.0, 0.28) for cispo."
    )
    aggregation: Literal["token_mean", "sequence_mean", "constant"] = Field(
        "token_mean", description="How per-token losses are averaged (masked tokens leave the denominator)."
    )
    normalizer: float | None = Field(
        None, gt=0, description="Constant per-sequence denominator for aggregation 'constant' (e.g. max_new_tokens)."
    )
    kl_to_ref_coeff: float | None = Field(
        None, ge=0, description="Weight of the k3 KL to the reference policy's log-probs (None: off)."
    )

    def build(self, actor_network: nn.Module | None = None, **sampling) -> PolicyGradientLoss:
        """The loss; `sampling` may pass temperature / top_k / top_p / pad_token_id of the rollout."""
        return LOSSES[self.kind](
            actor_network, clip_epsilon=self.clip_epsilon, aggregation=self.aggregation,
            normalizer=self.normalizer, kl_to_ref_coeff=self.kl_to_ref_coeff, **sampling,
        )
