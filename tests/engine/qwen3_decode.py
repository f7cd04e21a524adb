"""Shared by the engine's GPU tests at the fixed 8k workload's batch: a few Qwen3-8B-shaped rollout layers of a
plan, and one primed decode step's logits."""

from __future__ import annotations

import torch

B, L = 313, 257      # the fixed workload's batch (above the operand-cache threshold) at its first context


def qwen3_layers(preset: str, layers: int = 2):
    """(model, plan): `layers` random layers of the Qwen3-8B shape built for `preset` on the GPU."""
    from trace_rl.bench.measure import build_rollout_model
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan.preset(preset)
    return build_rollout_model("qwen3-8b", plan, torch.device("cuda"), torch.bfloat16, 0, layers), plan


def decode_logits(engine, batch: int = B, context: int = L) -> torch.Tensor:
    """float32 logits of one decode step of `batch` sequences at `context` tokens (graph primed first)."""
    from trace_rl.bench.decode_grid import prime_decode

    prime_decode(engine, batch, context)
    path = engine.attention_path(batch, context)
    with torch.no_grad():
        return engine._decode_forward(batch, path, engine.attention_span(path, context)).float().clone()
