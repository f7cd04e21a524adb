"""Drift corrections: the base class, the registry decorator, and `Corrections`, which composes them.

The rollout samples from π_rollout (low precision) while the trainer computes π_trainer; the per-token
importance ratio is ρ_t = π_trainer(y_t) / π_rollout(y_t), i.e. log ρ_t = log_probs.trainer − log_probs.rollout.
A correction maps log ρ [B, Lr] and the response mask to an importance weight and/or a keep-mask.

`Corrections([...])` reads ("log_probs", "rollout"), ("log_probs", "trainer") and ("masks", "response")
and writes ("correction", "weight") and ("correction", "mask"):

- weights multiply, masks AND (starting from weight 1 and the response mask);
- the weight is detached and clamped to [0, max_weight];
- tokens with mask False leave the loss (numerator and denominator);
- a NaN log-ratio at a real token is never masked away: its weight is NaN and it stays in the loss, so
  a broken log-prob shows up as a NaN loss instead of silently vanishing.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from trace_rl.config import TraceConfig
from trace_rl.data import schema as K

CORRECTION_REGISTRY: dict[str, type[Correction]] = {}


def register_correction(kind: str):
    """Class decorator: make a `Correction` buildable by name from configs (`build_correction(kind, ...)`)."""

    def wrap(cls: type[Correction]) -> type[Correction]:
        if kind in CORRECTION_REGISTRY and CORRECTION_REGISTRY[kind] is not cls:
            raise ValueError(f"correction kind {kind!r} is already registered")
        cls.kind = kind
        CORRECTION_REGISTRY[kind] = cls
        return cls

    return wrap


@dataclass
class CorrectionResult:
    """What one correction contributes: a weight [B, Lr] (float32) and/or a keep-mask [B, Lr] (bool)."""

    weight: torch.Tensor | None = None
    keep: torch.Tensor | None = None


class Correction(ABC):
    """One correction. Subclasses define `Params` (a documented pydantic config) and `compute`.

    `compute(log_ratio, mask)` receives log ρ [B, Lr] (float32, detached, 0 at padding) and the response
    mask [B, Lr] (bool) and returns a `CorrectionResult`. Called on a TensorDict, a single correction
    behaves like `Corrections([self])`.
    """

    kind: ClassVar[str] = ""
    Params: ClassVar[type[TraceConfig]]

    def __init__(self, **params):
        self.params = self.Params(**params)

    @abstractmethod
    def compute(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> CorrectionResult: ...

    def truncated(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
        """Tokens whose importance weight this correction cut (bool [B, Lr]; logged per step as
        `correction/<kind>/frac_truncated`). None: it cuts no weight (it only masks, or keeps weights whole)."""
        return None

    def __call__(self, td: TensorDictBase) -> TensorDictBase:
        return Corrections([self])(td)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.model_dump().items())
        return f"{type(self).__name__}({args})"


# -- per-sequence reductions over real tokens (padding positions of log_ratio are 0) --
def sequence_sum(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ over the real tokens of each row: [B, Lr] -> [B]."""
    return torch.where(mask, values, 0.0).sum(-1)


def sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over the real tokens of each row (0 for a row without real tokens): [B, Lr] -> [B]."""
    return sequence_sum(values, mask) / mask.sum(-1).clamp_min(1)


def per_token(row_values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Broadcast one value per row [B] to every position [B, Lr]."""
    return row_values.unsqueeze(-1).expand_as(like)


def log_bound(x: float) -> float:
    """log x, with log 0 = -inf (bounds on ρ compared in log space)."""
    return math.log(x) if x > 0 else -math.inf


def log_ratio(
    td: TensorDictBase,
    rollout_key: NestedKey = K.LOGP_ROLLOUT,
    trainer_key: NestedKey = K.LOGP_TRAINER,
    mask_key: NestedKey = K.MASK_RESPONSE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(log ρ = trainer − rollout [B, Lr] float32, detached, 0 at padding; response mask [B, Lr] bool)."""
    mask = td.get(mask_key).bool()
    diff = td.get(trainer_key).detach().float() - td.get(rollout_key).detach().float()
    return torch.where(mask, diff, 0.0), mask


class Corrections(TensorDictModuleBase):
    """A list of corrections applied together (weights multiply, masks AND). A `tensordict.nn`
    `TensorDictModuleBase`: it composes in `TensorDictSequential` and its keys are configurable.

    Args:
        corrections: the corrections, in any order (the composition is commutative).
        max_weight: the combined weight is clamped to [0, max_weight] (NaN stays NaN).

    Keyword Args:
        rollout_key, trainer_key, mask_key: the keys read (`in_keys`).
        weight_key, keep_key: the keys written (`out_keys`).
    """

    def __init__(
        self,
        corrections: Sequence[Correction] = (),
        max_weight: float = 100.0,
        *,
        rollout_key: NestedKey = K.LOGP_ROLLOUT,
        trainer_key: NestedKey = K.LOGP_TRAINER,
        mask_key: NestedKey = K.MASK_RESPONSE,
        weight_key: NestedKey = K.CORRECTION_WEIGHT,
        keep_key: NestedKey = K.CORRECTION_MASK,
    ):
        if max_weight <= 0:
            raise ValueError(f"max_weight must be > 0, got {max_weight}")
        super().__init__()
        self.corrections = list(corrections)
        self.max_weight = max_weight
        self.in_keys = [rollout_key, trainer_key, mask_key]
        self.out_keys = [weight_key, keep_key]

    def compute(self, log_ratio: torch.Tensor, mask: torch.Tensor) -> CorrectionResult:
        weight = torch.ones_like(log_ratio)
        keep = mask.clone()
        for correction in self.corrections:
            result = correction.compute(log_ratio, mask)
            if result.weight is not None:
                weight = weight * result.weight
            if result.keep is not None:
                keep = keep & result.keep
        broken = mask & torch.isnan(log_ratio)  # never let a NaN be masked into a finite loss
        keep = keep | broken
        weight = torch.where(broken, torch.nan, weight.clamp(0.0, self.max_weight))
        weight = torch.where(keep, weight, 0.0)
        return CorrectionResult(weight=weight.detach(), keep=keep)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        lr, mask = log_ratio(td, *self.in_keys)
        result = self.compute(lr, mask)
        td.set(self.out_keys[0], result.weight)
        td.set(self.out_keys[1], result.keep)
        return td

    def __len__(self) -> int:
        return len(self.corrections)

    def __repr__(self) -> str:
        return f"Corrections({self.corrections!r}, max_weight={self.max_weight})"
