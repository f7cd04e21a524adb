"""Router replay: the trainer's forward routes each token to the experts the rollout used.

A token routed to different experts in the rollout and in the trainer is the largest single source of
trainer/rollout mismatch in MoE RL, and low precision makes near-ties in the router flip. With replay,
each MoE block takes the rollout's expert ids (("routing", "experts"), recorded by the engine) instead of
its own top-k, and weights them with *its own* router probabilities gathered at those experts
(renormalised over them when the model has `norm_topk_prob`), so the router still receives gradients
through the weights. Positions without a record (("routing", "valid") False: the last response token,
padding) use the trainer's own top-k.

`router_replay(model, td, replay=..., track=...)` is a context manager over one forward on `td`'s rows
(packed as `pack_full` lays them out): with `track`, `own_routing()` returns the trainer's own top-k at
every position afterwards, the other half of the routing drift metrics.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase

from trace_rl.data import schema as K
from trace_rl.models.moe import moe_blocks


def has_routing(td: TensorDictBase) -> bool:
    return K.ROUTING_EXPERTS in td.keys(include_nested=True)


def packed_width(td: TensorDictBase) -> int:
    return td.get(K.TOKENS_PROMPT).shape[1] + td.get(K.TOKENS_RESPONSE).shape[1]


def routing_records(td: TensorDictBase, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(experts [B, W, M, k], valid [B, W]) cut or padded (invalid) to the packed width W of `td`.

    Records are written at the width of the batch that produced them; a replay-buffer sample of several
    batches, or a trimmed response, packs to another width. Positions past the packed width hold no real
    token, so cutting them loses nothing."""
    experts, valid = td.get(K.ROUTING_EXPERTS), td.get(K.ROUTING_VALID).bool()
    width = packed_width(td) if width is None else width
    have = experts.shape[1]
    if have >= width:
        return experts[:, :width], valid[:, :width]
    pad = width - have
    return (torch.cat([experts, experts.new_zeros(experts.shape[0], pad, *experts.shape[2:])], 1),
            torch.cat([valid, valid.new_zeros(valid.shape[0], pad)], 1))


class router_replay:  # noqa: N801  (a context manager: `with router_replay(model, td): model(...)`)
    def __init__(self, model, td: TensorDictBase, replay: bool = True, track: bool = False):
        self.model, self.td, self.replay, self.track = model, td, replay, track
        self.blocks = moe_blocks(model)

    def __enter__(self) -> router_replay:
        if not self.blocks:
            raise ValueError("router replay needs a mixture-of-experts model; this one has no MoE layers "
                             "(set model.router_replay to false for dense models)")
        if self.replay:
            if not has_routing(self.td):
                raise ValueError("router replay: the batch has no ('routing', 'experts') records; the rollout "
                                 "engine must record them (NativeEngine(record_routing=True), on by default "
                                 "for MoE models)")
            experts, valid = routing_records(self.td)
            b = self.blocks[0]
            if experts.shape[2:] != (len(self.blocks), b.top_k):
                raise ValueError(f"router replay: records for {experts.shape[2]} MoE layers x top-{experts.shape[3]}, "
                                 f"the model has {len(self.blocks)} MoE layers x top-{b.top_k}")
            bad = valid & ((experts < 0) | (experts >= b.num_experts)).any(-1).any(-1)
            if bool(bad.any()):
                raise ValueError(f"router replay: expert ids outside [0, {b.num_experts}) in the records")
            for i, block in enumerate(self.blocks):
                block.replay = (experts[:, :, i], valid)
        for block in self.blocks:
            block.track_routing = self.track
        return self

    def own_routing(self) -> torch.Tensor:
        """The trainer's own top-k of the last forward, [B, T, M, k] int16 (needs `track=True`)."""
        if any(b.own_ids is None for b in self.blocks):
            raise RuntimeError("own_routing: no tracked forward ran inside this context (track=True?)")
        return torch.stack([b.own_ids for b in self.blocks], dim=2).to(torch.int16)

    def __exit__(self, *exc) -> bool:
        for block in self.blocks:
            block.replay, block.track_routing, block.own_ids = None, False, None
        return False


class MoETrainerForward:
    """Around one training forward on `td` (the loss's): router replay when `replay`, and the router logits
    collected for transformers' auxiliary load-balancing loss when `aux_coef > 0` (`aux_loss()` inside the
    block gives {"loss_router_aux": coef x loss, "router_aux_loss": the unweighted loss, detached (logged)} over
the real tokens of the packed batch). A no-op for
    dense models with both off."""

    def __init__(self, model, td: TensorDictBase, replay: bool, aux_coef: float = 0.0,
                 pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT):
        self.model, self.td, self.replay, self.aux_coef, self.pad_token_id = model, td, replay, aux_coef, pad_token_id
        self.blocks = moe_blocks(model)
        self._replay: router_replay | None = None

    def __enter__(self) -> MoETrainerForward:
        if self.replay:
            self._replay = router_replay(self.model, self.td).__enter__()
        for block in self.blocks:
            block.collect_router_logits = self.aux_coef > 0
        return self

    def aux_loss(self) -> dict[str, torch.Tensor]:
        if self.aux_coef <= 0:
            return {}
        from trace_rl.data.padding import pack_full
        from trace_rl.models.moe import load_balancing_loss

        _, mask, _ = pack_full(*(self.td.get(k) for k in (K.TOKENS_PROMPT, K.MASK_PROMPT, K.TOKENS_RESPONSE,
                                                           K.MASK_RESPONSE)), self.pad_token_id)
        b = self.blocks[0]
        loss = load_balancing_loss([blk.router_logits for blk in self.blocks], b.num_experts, b.top_k, mask)
        return {"loss_router_aux": self.aux_coef * loss, "router_aux_loss": loss.detach()}

    def __exit__(self, *exc) -> bool:
        if self._replay is not None:
            self._replay.__exit__(*exc)
        for block in self.blocks:
            block.collect_router_logits, block.router_logits = False, None
        return False
