"""Log-probs of the response tokens under a causal LM: the trainer's side of ρ = π_trainer / π_rollout.

`response_log_probs` runs the model once on each row packed as [prompt, response, padding] and reads,
for response token t, the logits at the position just before it — the last prompt position for t = 0
(never dropped or zeroed). Logits go through the same `process_logits` as the engines, so with the
rollout's temperature / top-k / top-p the trainer computes log-probs of the *same* distribution the
rollout sampled from: with identical weights ρ = 1 exactly up to float error. (With top-k / top-p a
token outside the trainer's kept set gets log-prob -inf, i.e. ρ = 0: the corrections handle it.)
"""

from __future__ import annotations

from contextlib import ExitStack

import torch
from tensordict import NestedKey, TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn

from trace_rl.data import schema as K
from trace_rl.data.padding import pack_full
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.sampling import process_logits
from trace_rl.models.moe import moe_blocks
from trace_rl.objectives.router_replay import has_routing, router_replay


def response_log_probs(
    model: nn.Module,
    prompt_tokens: torch.Tensor,
    prompt_mask: torch.Tensor,
    response_tokens: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
    return_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log-probs [B, Lr] float32, entropy [B, Lr] detached or None); 0 at padding. Differentiable.

    `model` maps token ids [B, T] -> logits [B, T, V] and must be causal. Every row needs >= 1 prompt
    token. Entropy is that of the processed distribution q at each response position.
    """
    response_mask = response_mask.bool()
    full, _, prompt_len = pack_full(prompt_tokens, prompt_mask, response_tokens, response_mask, pad_token_id)
    logits = model(full)
    rows, width = response_tokens.shape
    vocab = logits.shape[-1]
    # Packed position of real response token t is prompt_len + (#real response tokens before it); its
    # logits sit one position earlier. Holes in the response mask are handled by the cumsum.
    before = torch.cumsum(response_mask.long(), dim=1) - response_mask.long()
    source = (prompt_len.unsqueeze(1) - 1 + before).clamp(0, logits.shape[1] - 1)
    picked = logits.gather(1, source.unsqueeze(-1).expand(rows, width, vocab))
    logq = process_logits(picked.reshape(rows * width, vocab), temperature, top_k, top_p).view(rows, width, vocab)
    token_logq = logq.gather(-1, response_tokens.unsqueeze(-1)).squeeze(-1)
    token_logq = torch.where(response_mask, token_logq, 0.0)
    entropy = None
    if return_entropy:
        with torch.no_grad():
            p = logq.exp()
            entropy = -(p * torch.where(p > 0, logq, 0.0)).sum(-1)
            entropy = torch.where(response_mask, entropy, 0.0)
    return token_logq, entropy


class TrainerLogProbs(TensorDictModuleBase):
    """Recomputes the trainer's log-probs of a batch's responses (no grad) and writes them. A
    `tensordict.nn.TensorDictModuleBase`: composes in `TensorDictSequential`; keys configurable.

    in_keys: ("tokens"|"masks", "prompt"|"response"). out_keys: ("log_probs", "trainer") and, when
    `write_old`, ("log_probs", "old") (the PPO ratio's denominator for every epoch on this batch).

    Mixture-of-experts models: when the batch carries the rollout's routing records (("routing",
    "experts"), "valid"), `router_replay=True` replays them in every forward (see
    `trace_rl.objectives.router_replay`), and either way the trainer's own top-k is written to
    ("routing", "trainer") for the routing drift metrics.

    Use the rollout's sampling parameters (`from_sampling`) so both sides describe one distribution.
    `micro_batch_size` bounds the rows per forward (memory); `chunk_context` wraps each one.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
        write_old: bool = True,
        micro_batch_size: int | None = None,
        trainer_key: NestedKey = K.LOGP_TRAINER,
        old_key: NestedKey = K.LOGP_OLD,
        router_replay: bool = False,
        chunk_context=None,
    ):
        super().__init__()
        # chunk_context(chunk): a context manager entered around each micro-batch's forward (TRACE: the
        # guided trainer serves that micro-batch's rollout records; the pipeline sets its own)
        self.chunk_context = chunk_context
        self.model = model
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.pad_token_id = pad_token_id
        self.write_old = write_old
        self.micro_batch_size = micro_batch_size
        self.router_replay = router_replay
        self.in_keys = [K.TOKENS_PROMPT, K.MASK_PROMPT, K.TOKENS_RESPONSE, K.MASK_RESPONSE]
        self.out_keys = [trainer_key] + ([old_key] if write_old else [])
        if moe_blocks(model):        # MoE: the trainer's own top-k, for the routing drift metrics
            self.out_keys.append(K.ROUTING_TRAINER)

    @classmethod
    def from_sampling(cls, model: nn.Module, sampling: SamplingParams, **kwargs) -> TrainerLogProbs:
        return cls(model, temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p, **kwargs)

    @torch.no_grad()
    def forward(self, td: TensorDictBase) -> TensorDictBase:
        rows = td.batch_size[0]
        step = self.micro_batch_size or rows
        parts, own = [], []
        routed = has_routing(td) and bool(moe_blocks(self.model))
        if self.router_replay and not routed:
            raise ValueError("router_replay=True needs a mixture-of-experts model and a batch with ('routing', "
                             "'experts') records from the rollout engine")
        for start in range(0, rows, step):
            chunk = td[start : start + step]
            with ExitStack() as stack:
                if self.chunk_context is not None:
                    stack.enter_context(self.chunk_context(chunk))
                rr = stack.enter_context(router_replay(self.model, chunk, self.router_replay, track=True)) \
                    if routed else None
                lp, _ = response_log_probs(
                    self.model, *(chunk.get(k) for k in self.in_keys),
                    temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                    pad_token_id=self.pad_token_id,
                )
                if routed:
                    own.append(rr.own_routing())
            parts.append(lp)
        lp = torch.cat(parts) if parts else torch.zeros_like(td.get(K.LOGP_ROLLOUT))
        if own:
            td.set(K.ROUTING_TRAINER, torch.cat(own))
        for key in self.out_keys[:2]:
            if key != K.ROUTING_TRAINER:
                td.set(key, lp.clone() if key != self.out_keys[0] else lp)
        return td
