"""The shared body of our GRPO-family losses: a torchrl `LossModule` over right-padded response tokens.

Per kept token (response mask AND ("correction", "mask")), with r_t = π_θ(y_t) / π_old(y_t), A the
advantage (one per sequence [B], or per token [B, Lr] aligned with the response) and w_t the detached
correction weight ("correction", "weight"; 1 if absent):

    ℓ_t = w_t · objective_t(r_t, A, log π_θ(y_t))        (objective: see GRPOLoss, CISPOLoss)

aggregated by `aggregate` (token_mean / sequence_mean / constant). Optional KL to a reference policy:
k3_t = exp(d_t) − d_t − 1 with d_t = log π_ref − log π_θ, aggregated the same way, times `kl_to_ref_coeff`.

Current log-probs come from `actor_network` (a causal LM: token ids [B, T] -> logits [B, T, V]) through
`response_log_probs`, or, without an actor, from the ("log_probs", "current") entry (with grad).

Unlike torchrl 0.14's `GRPOLoss`, per-token tensors are aligned position by position with the
right-padded response (no left-padding of ragged advantages) and the first response token's log-prob
(predicted from the last prompt position) is used like any other.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from torch import nn
from torchrl.objectives import LossModule

from trace_rl.data import schema as K
from trace_rl.objectives.aggregation import Aggregation, aggregate
from trace_rl.objectives.logprobs import response_log_probs


def _clip_bounds(clip_epsilon: float | tuple[float, float]) -> tuple[float, float]:
    low, high = (clip_epsilon, clip_epsilon) if isinstance(clip_epsilon, (int, float)) else clip_epsilon
    if not (0 <= low <= 1 and high >= 0):
        raise ValueError(f"clip_epsilon must be (low in [0, 1], high >= 0), got {clip_epsilon}")
    return float(low), float(high)


class PolicyGradientLoss(LossModule):
    """Base of GRPOLoss / CISPOLoss. Subclasses implement `token_objective`.

    Args:
        actor_network: causal LM mapping token ids to logits, or None to read ("log_probs", "current").

    Keyword Args:
        clip_epsilon: (low, high): ratios are clipped to [1 - low, 1 + high]; a float is symmetric.
        aggregation: "token_mean" | "sequence_mean" | "constant" (see `trace_rl.objectives.aggregation`).
        normalizer: the constant denominator per sequence for aggregation "constant".
        kl_to_ref_coeff: weight of the k3 KL to ("log_probs", "ref"); None or 0 disables it.
        temperature, top_k, top_p: the rollout's sampling parameters, so π_θ is the sampled distribution.
        pad_token_id: pad id used to pack prompt + response for the actor.

    Returns from forward: a TensorDict with "loss_objective" (and "loss_kl_to_ref" when enabled) plus
    detached metrics: "clip_fraction" (kept tokens whose gradient the clip removed), "ratio_mean",
    "kl_old" (mean of r − 1 − log r), "kept_tokens", "entropy" (with an actor), "kl_to_ref".
    """

    @dataclass
    class _AcceptedKeys:
        prompt_tokens: NestedKey = K.TOKENS_PROMPT
        prompt_mask: NestedKey = K.MASK_PROMPT
        response_tokens: NestedKey = K.TOKENS_RESPONSE
        response_mask: NestedKey = K.MASK_RESPONSE
        advantage: NestedKey = K.ADVANTAGE
        old_log_prob: NestedKey = K.LOGP_OLD
        ref_log_prob: NestedKey = K.LOGP_REF
        log_prob: NestedKey = K.LOGP_CURRENT
        correction_weight: NestedKey = K.CORRECTION_WEIGHT
        correction_mask: NestedKey = K.CORRECTION_MASK

    default_clip: tuple[float, float] = (0.2, 0.28)

    def __init__(
        self,
        actor_network: nn.Module | None = None,
        *,
        clip_epsilon: float | tuple[float, float] | None = None,
        aggregation: Aggregation = "token_mean",
        normalizer: float | None = None,
        kl_to_ref_coeff: float | None = None,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
    ):
        super().__init__()
        self.actor_network = actor_network
        self.clip_low, self.clip_high = _clip_bounds(
            self.default_clip if clip_epsilon is None else clip_epsilon)
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), aggregation, normalizer)  # validate early
        self.aggregation, self.normalizer = aggregation, normalizer
        self.kl_to_ref_coeff = kl_to_ref_coeff
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.pad_token_id = pad_token_id
        self._set_in_keys()

    # -- torchrl key plumbing --
    def _set_in_keys(self) -> None:
        k = self.tensor_keys
        keys = [k.response_mask, k.advantage, k.old_log_prob, k.correction_weight, k.correction_mask]
        if self.actor_network is not None:
            keys = [k.prompt_tokens, k.prompt_mask, k.response_tokens] + keys
        else:
            keys.append(k.log_prob)
        if self.kl_to_ref_coeff:
            keys.append(k.ref_log_prob)
        self._in_keys = keys

    @property
    def in_keys(self) -> list[NestedKey]:
        return self._in_keys

    @property
    def out_keys(self) -> list[str]:
        keys = ["loss_objective", "clip_fraction", "ratio_mean", "kl_old", "kept_tokens"]
        if self.actor_network is not None:
            keys.append("entropy")
        if self.kl_to_ref_coeff:
            keys += ["loss_kl_to_ref", "kl_to_ref"]
        return keys

    def default_keys(self) -> _AcceptedKeys:
        """Defaults that `set_keys(name=None)` restores (torchrl's `set_keys` calls this)."""
        return self._AcceptedKeys()

    def _forward_value_estimator_keys(self, **kwargs) -> None:
        self._set_in_keys()  # no value estimator: only refresh in_keys after set_keys

    # -- the objective --
    def token_objective(
        self, log_ratio: torch.Tensor, advantage: torch.Tensor, log_prob: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(per-token loss [B, Lr], bool [B, Lr]: tokens whose gradient the clip removed)."""
        raise NotImplementedError

    def _current_log_prob(self, td: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor | None]:
        k = self.tensor_keys
        if self.actor_network is None:
            return td.get(k.log_prob).float(), None
        return response_log_probs(
            self.actor_network, td.get(k.prompt_tokens), td.get(k.prompt_mask), td.get(k.response_tokens),
            td.get(k.response_mask), temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
            pad_token_id=self.pad_token_id, return_entropy=True,
        )

    def _advantage(self, td: TensorDictBase, like: torch.Tensor) -> torch.Tensor:
        adv = td.get(self.tensor_keys.advantage).detach().float()
        if adv.shape == like.shape[:1] or adv.shape == (*like.shape[:1], 1):
            return adv.reshape(-1, 1).expand_as(like)
        if adv.shape == like.shape:
            return adv  # per token, right-padded like the response
        raise ValueError(f"advantage of shape {tuple(adv.shape)} fits neither [B]={tuple(like.shape[:1])} "
                         f"nor the response [B, Lr]={tuple(like.shape)}")

    def forward(self, tensordict: TensorDictBase) -> TensorDict:
        k = self.tensor_keys
        mask = tensordict.get(k.response_mask).bool()
        keep = tensordict.get(k.correction_mask, None)
        if keep is not None:
            mask = mask & keep.bool()
        weight = tensordict.get(k.correction_weight, None)
        weight = torch.ones(mask.shape, device=mask.device) if weight is None else weight.detach().float()
        old = tensordict.get(k.old_log_prob, None)
        if old is None:
            raise KeyError(f"{k.old_log_prob} is missing: run TrainerLogProbs (write_old=True) on the batch "
                           "before the first epoch, or set_keys(old_log_prob=...)")
        old = old.detach().float()

        log_prob, entropy = self._current_log_prob(tensordict)
        log_ratio = torch.where(mask, log_prob - old, 0.0)
        advantage = self._advantage(tensordict, log_prob)
        per_token, clipped = self.token_objective(log_ratio, advantage, log_prob)
        loss = aggregate(weight * per_token, mask, self.aggregation, self.normalizer)

        with torch.no_grad():
            n = mask.sum().clamp_min(1)
            ratio = log_ratio.exp()
            out = {
                "loss_objective": loss,
                "clip_fraction": (clipped & mask).sum() / n,
                "ratio_mean": torch.where(mask, ratio, 0.0).sum() / n,
                "kl_old": torch.where(mask, ratio - 1 - log_ratio, 0.0).sum() / n,
                "kept_tokens": mask.sum().float(),
            }
            if entropy is not None:
                out["entropy"] = torch.where(mask, entropy, 0.0).sum() / n
        if self.kl_to_ref_coeff:
            ref = tensordict.get(k.ref_log_prob).detach().float()
            d = torch.where(mask, ref - log_prob, 0.0)
            kl = aggregate(torch.expm1(d) - d, mask, self.aggregation, self.normalizer)
            out["loss_kl_to_ref"] = self.kl_to_ref_coeff * kl
            out["kl_to_ref"] = kl.detach()
        return TensorDict(out, batch_size=[])
