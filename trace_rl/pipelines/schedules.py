"""Learning-rate schedules: warmup, then constant, linear or cosine decay, as a torch `LambdaLR`.

The learning rate of RL step k (0-based; one step = one collected batch, `trainer.epochs_per_batch`
optimizer steps at that rate) is `trainer.lr * factor(k)` with W = warmup_steps, T = loop.steps,
m = min_lr_ratio:

    k < W:             factor = k / W                                   (linear warmup from 0)
    constant:          factor = 1
    linear:            factor = m + (1 - m) * max(0, (T - k) / (T - W))
    cosine:            factor = m + (1 - m) * 0.5 * (1 + cos(pi * (k - W) / (T - W)))

These are transformers' `get_{constant,linear,cosine}_schedule_with_warmup` (with m = 0; tested equal), the
schedules TRL and verl users know. The factor is a closed form of k, so a resumed run continues the
schedule exactly (the scheduler is set to the checkpoint's step).
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from pydantic import Field

from trace_rl.config import TraceConfig


class LRScheduleSection(TraceConfig):
    """How the learning rate changes over the run (trainer.lr is the peak)."""

    kind: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="After the warmup: constant, linear decay or cosine decay to min_lr_ratio * lr "
                                "at loop.steps.")
    warmup_steps: int = Field(0, ge=0, description="Steps of linear warmup from 0 to trainer.lr.")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="Linear/cosine: the final lr as a fraction "
                                                                 "of trainer.lr.")


def lr_factor(step: int, schedule: LRScheduleSection, total_steps: int) -> float:
    """factor(k) of the module docstring."""
    w = schedule.warmup_steps
    if step < w:
        return step / max(1, w)
    if schedule.kind == "constant":
        return 1.0
    m = schedule.min_lr_ratio
    span = max(1, total_steps - w)
    if schedule.kind == "linear":
        return m + (1 - m) * max(0.0, (total_steps - step) / span)
    progress = min(1.0, (step - w) / span)
    return m + (1 - m) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_lr_scheduler(optimizer: torch.optim.Optimizer, schedule: LRScheduleSection,
                      total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """A `LambdaLR` over `optimizer`; call `.step()` once per RL step (the Pipeline does)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: lr_factor(k, schedule, total_steps))


def seek(scheduler: torch.optim.lr_scheduler.LRScheduler, step: int) -> None:
    """Put a scheduler at `step` (after a resume restored the optimizer): the rate of `step` from its base
    rates (the optimizer groups' `initial_lr`)."""
    if not hasattr(scheduler, "lr_lambdas"):
        raise TypeError(f"resuming needs a LambdaLR-style scheduler (a closed form of the step); got "
                        f"{type(scheduler).__name__}: build it with trace_rl.pipelines.schedules.make_lr_scheduler")
    scheduler.base_lrs = [group["initial_lr"] for group in scheduler.optimizer.param_groups]
    scheduler.last_epoch = step
    rates = [base * fn(step) for base, fn in zip(scheduler.base_lrs, scheduler.lr_lambdas)]
    for group, lr in zip(scheduler.optimizer.param_groups, rates):
        group["lr"] = lr
    scheduler._last_lr = rates
