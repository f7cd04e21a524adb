"""Rollout collection (TorchRL-style): prompt sources, the collector, task reward adapters."""

from trace_rl.collectors.prompts import PROBLEM, PromptBatches, TaskPrompts, prompt_batch
from trace_rl.collectors.rewards import TaskReward
from trace_rl.collectors.rollout import RewardFn, RolloutCollector

__all__ = ["PROBLEM", "PromptBatches", "RewardFn", "RolloutCollector", "TaskPrompts", "TaskReward", "prompt_batch"]
