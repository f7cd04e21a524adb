"""Group-relative advantages (GRPO family): one scalar per response, from the rewards of its group.

For a group g of size G (the responses to one prompt, rows sharing "group_id") with rewards r_1..r_G:

- baseline "mean":           b_i = mean_j r_j
- baseline "leave_one_out":  b_i = mean_{j != i} r_j   (RLOO; = G/(G-1) * (r_i - mean) after subtraction)
- scale "std":   A_i = (r_i - b_i) / (std_g + eps), std_g the *unbiased* (G-1) sample std of the group's
                 rewards (as in DeepSeek's GRPO); scale "none": A_i = r_i - b_i (Dr. GRPO drops the std).

Exact and honest at the edges (computed in float64, returned as float32):

- a group whose rewards are all equal carries no signal: its advantages are exactly 0, whatever eps (in
  float32 the group mean leaves a one-ulp residue that a near-zero std would blow up to ~0.1);
- a NaN reward makes its whole group's advantages NaN, in every group size (never a made-up 0);
- a group of one response has no baseline: its advantage is 0 (NaN if its reward is NaN). Pipelines refuse
  `loop.group_size: 1`, which would make every advantage 0; a group of one appears only when rows are
  grouped by hand.

Groups need not be contiguous rows.
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import Field
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from trace_rl.config import TraceConfig
from trace_rl.data import schema as K

Baseline = Literal["mean", "leave_one_out"]
Scale = Literal["std", "none"]


def group_advantages(
    reward: torch.Tensor,
    group_id: torch.Tensor,
    *,
    baseline: Baseline = "mean",
    scale: Scale = "std",
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantages [B] (float32) from rewards [B] and group ids [B]; formulas in the module docstring."""
    if baseline not in ("mean", "leave_one_out"):
        raise ValueError(f"unknown baseline {baseline!r}; use 'mean' or 'leave_one_out'")
    if scale not in ("std", "none"):
        raise ValueError(f"unknown scale {scale!r}; use 'std' or 'none'")
    if group_id.device != reward.device:
        raise ValueError(f"group_advantages: reward is on {reward.device} and group_id on {group_id.device}; "
                         f"put both on one device (a TensorDict spanning devices has no .device to follow)")
    r = reward.reshape(-1).to(torch.float64)
    _, inverse = torch.unique(group_id.reshape(-1), return_inverse=True)
    groups = int(inverse.max()) + 1 if inverse.numel() else 0
    per_group = lambda v: torch.zeros(groups, dtype=v.dtype, device=v.device).index_add_(0, inverse, v)  # noqa: E731
    n, s = per_group(torch.ones_like(r))[inverse], per_group(r)[inverse]
    mean = s / n
    if baseline == "mean":
        centred = r - mean
    else:
        centred = r - (s - r) / (n - 1).clamp_min(1)
    if scale == "std":
        std = (per_group((r - mean) ** 2)[inverse] / (n - 1).clamp_min(1)).sqrt()
        centred = centred / (std + eps)
    # degenerate groups, decided explicitly rather than by what the arithmetic leaves: equal rewards (and
    # singletons) carry no signal -> exactly 0; a NaN reward -> its whole group is NaN
    lo = torch.full((groups,), torch.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, inverse, r, "amin")
    hi = torch.full((groups,), -torch.inf, dtype=r.dtype, device=r.device).scatter_reduce_(0, inverse, r, "amax")
    has_nan = per_group(torch.isnan(r).to(r.dtype))[inverse] > 0
    equal = (lo == hi)[inverse]
    out = torch.where(equal, torch.zeros_like(centred), centred)
    out = torch.where(has_nan, torch.full_like(out, torch.nan), out)
    return out.to(torch.float32)


class GroupAdvantageConfig(TraceConfig):
    """Group-relative advantage estimator."""

    baseline: Baseline = Field("mean", description="'mean' (GRPO) or 'leave_one_out' (RLOO) baseline.")
    scale: Scale = Field("std", description="'std': divide by the group's reward std (GRPO); 'none' (Dr. GRPO).")
    eps: float = Field(1e-6, ge=0.0, description="Added to the std before dividing (0 is allowed: groups "
                                                 "with equal rewards get exactly 0 either way).")


class GroupAdvantage(TensorDictModuleBase):
    """TensorDict module: reads "reward" and "group_id", writes "advantage" [B].

    A `tensordict.nn.TensorDictModuleBase` (composes in `TensorDictSequential`), usable as a collector
    `postproc` or on a buffer sample. Keys are configurable (`reward_key`, `group_key`, `advantage_key`).
    """

    def __init__(
        self,
        baseline: Baseline = "mean",
        scale: Scale = "std",
        eps: float = 1e-6,
        *,
        reward_key: NestedKey = K.REWARD,
        group_key: NestedKey = K.GROUP_ID,
        advantage_key: NestedKey = K.ADVANTAGE,
    ):
        super().__init__()
        self.baseline, self.scale, self.eps = baseline, scale, eps
        self.in_keys = [reward_key, group_key]
        self.out_keys = [advantage_key]

    @classmethod
    def from_config(cls, config: GroupAdvantageConfig) -> GroupAdvantage:
        return cls(config.baseline, config.scale, config.eps)

    def forward(self, td: TensorDictBase) -> TensorDictBase:
        reward, group = (td.get(k) for k in self.in_keys)
        td.set(self.out_keys[0], group_advantages(reward, group, baseline=self.baseline, scale=self.scale,
                                                  eps=self.eps))
        return td

    def extra_repr(self) -> str:
        return f"baseline={self.baseline!r}, scale={self.scale!r}, eps={self.eps}"
