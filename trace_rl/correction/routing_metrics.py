"""Routing drift (mixture-of-experts): how often the trainer's router picks other experts than the rollout's.

Inputs: the rollout's recorded experts ("routing", "experts") and the trainer's own top-k ("routing",
"trainer", written by `TrainerLogProbs`), both [B, T, M, k] per packed [prompt, response] position and
MoE layer, and ("routing", "valid") [B, T]. With replay on, the trainer's own top-k is what its router
would have chosen on the replayed forward (the replay itself routes to the rollout's experts).

| name                        | formula (over valid positions; per layer: its MoE layers only)     | identical |
|-----------------------------|---------------------------------------------------------------------|-----------|
| routing_mismatch            | fraction of (token, layer) whose top-k *sets* differ                | 0 |
| routing_overlap             | mean |rollout set ∩ trainer set| / k                                | 1 |
| routing_mismatch/moe{j}     | the same for the j-th MoE layer (j = 0, 1, ...; not the layer index) | 0 |
| routing_overlap/moe{j}      |                                                                     | 1 |

`by_position` bins the response tokens' positions (the same edges as the log-prob mismatch) and reports
the token count and mismatch fraction (over all layers) per bin. No valid position: NaN, never 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class RoutingDrift:
    metrics: dict[str, float]              # routing_mismatch, routing_overlap, and per MoE layer
    edges: list[int]
    count: list[int]                       # response tokens per position bin
    mismatch_by_position: list[float]

    def flat(self, prefix: str = "routing_by_position") -> dict[str, float]:
        out = dict(self.metrics)
        for i, c in enumerate(self.count):
            span = f"{self.edges[i]}-{self.edges[i + 1]}"
            out[f"{prefix}/count/{span}"] = float(c)
            out[f"{prefix}/mismatch/{span}"] = self.mismatch_by_position[i]
        return out


def _to_width(t: torch.Tensor, width: int) -> torch.Tensor:
    if t.shape[1] >= width:
        return t[:, :width]
    return torch.cat([t, t.new_zeros(t.shape[0], width - t.shape[1], *t.shape[2:])], 1)


def routing_drift(rollout: torch.Tensor, trainer: torch.Tensor, valid: torch.Tensor, prompt_len: torch.Tensor,
                  edges: Sequence[int]) -> RoutingDrift:
    """Metrics of the module table. `rollout`/`trainer` [B, T, M, k], `valid` [B, T], `prompt_len` [B]
    (packed position p >= prompt_len is response token p - prompt_len); `edges` bin response positions."""
    width = trainer.shape[1]
    rollout, valid = _to_width(rollout, width), _to_width(valid.bool(), width)   # records keep their batch's width
    k = rollout.shape[-1]
    differs = (rollout.sort(-1).values != trainer.sort(-1).values).any(-1).double()          # [B, T, M]
    overlap = (rollout.unsqueeze(-1) == trainer.unsqueeze(-2)).any(-1).sum(-1).double() / k  # [B, T, M]
    v = valid.unsqueeze(-1).double()
    n = valid.sum()
    layers = rollout.shape[2]
    per_layer = torch.stack([(differs * v).sum((0, 1)), (overlap * v).sum((0, 1))]) / n       # [2, M]
    overall = torch.stack([(differs * v).sum(), (overlap * v).sum()]) / (n * layers)
    pos = torch.arange(width, device=valid.device)[None, :] - prompt_len[:, None]              # response index
    edge_t = torch.tensor(list(edges), device=valid.device)
    bins = torch.searchsorted(edge_t, pos.clamp(min=0), right=True) - 1
    in_resp = valid & (pos >= 0) & (pos < edges[-1])
    nb = len(edges) - 1
    b = bins.clamp(0, nb - 1)[in_resp]
    zeros = torch.zeros(nb, dtype=torch.float64, device=valid.device)
    count = zeros.index_add(0, b, torch.ones_like(b, dtype=torch.float64))
    miss = zeros.index_add(0, b, differs.mean(-1)[in_resp])
    metrics = {"routing_mismatch": float(overall[0]), "routing_overlap": float(overall[1])}
    mism, over = per_layer.tolist()
    for j in range(layers):
        metrics[f"routing_mismatch/moe{j}"] = mism[j]
        metrics[f"routing_overlap/moe{j}"] = over[j]
    return RoutingDrift(metrics, list(edges), [int(c) for c in count.tolist()], (miss / count).tolist())
