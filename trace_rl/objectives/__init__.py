"""GRPO-family losses as torchrl LossModules, the trainer's log-prob recomputation, loss aggregation."""

from trace_rl.objectives.aggregation import aggregate
from trace_rl.objectives.cispo import CISPOLoss
from trace_rl.objectives.config import LOSSES, LossConfig
from trace_rl.objectives.grpo import GRPOLoss
from trace_rl.objectives.logprobs import TrainerLogProbs, response_log_probs
from trace_rl.objectives.policy_gradient import PolicyGradientLoss
from trace_rl.objectives.reference import ReferencePolicy

__all__ = [
    "LOSSES",
    "CISPOLoss",
    "GRPOLoss",
    "LossConfig",
    "PolicyGradientLoss",
    "ReferencePolicy",
    "TrainerLogProbs",
    "aggregate",
    "response_log_probs",
]
