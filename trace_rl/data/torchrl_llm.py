"""Our batch in torchrl's LLM layout, so torchrl's LLM losses (`torchrl.objectives.llm.GRPOLoss`, DAPO) and
wrappers (`TransformersWrapper`, `vLLMWrapper`) run on it.

Our schema right-pads prompts and responses separately and aligns per-token tensors with the response.
torchrl's LLM tensorclasses (`Tokens`, `Masks`, `LogProbs`) describe each row by its full sequence: the
prompt left-padded, then the response right-padded, so the response starts at column Lp in every row.
`to_torchrl_llm(batch)` returns a new TensorDict with:

| torchrl key | shape | from |
|---|---|---|
| ("tokens", "prompt") | [B, Lp] left-padded | ("tokens", "prompt") |
| ("tokens", "response") | [B, Lr] | ("tokens", "response") |
| ("tokens", "full") | [B, Lp+Lr] | both |
| ("masks", "all_attention_mask") | [B, Lp+Lr] | prompt and response masks |
| ("masks", "all_assistant_mask") | [B, Lp+Lr] | response mask AND ("correction", "mask") |
| ("log_probs", "full") | [B, Lp+Lr], 0 off the response | `old_log_prob_key` (("log_probs", "old")) |
| ("next", "ref_log_probs", "full") | [B, Lp+Lr] | ("log_probs", "ref"), when present |
| "advantage" | [B, Lp+Lr, 1] | "advantage" ([B] broadcast, or [B, Lr] per token) |

plus "reward", "group_id" and "policy_version" as they are. torchrl's GRPOLoss with `masking_strategy="rlhf"`
then skips the tokens our corrections masked; it has no per-token importance weight, so a correction's
*weight* (TIS) has no torchrl counterpart. `old_log_prob_key=("log_probs", "rollout")` gives torchrl's own
convention (the inference engine's log-probs as the ratio's denominator).

With equal inputs torchrl's GRPOLoss equals our `GRPOLoss` (token_mean, no weights) to float rounding
(tests/data/test_torchrl_llm.py runs it through `TransformersWrapper` on an exported checkpoint).
"""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDict, TensorDictBase
from tensordict.nn import TensorDictModuleBase

from trace_rl.data import schema as K

TL_TOKENS_PROMPT = ("tokens", "prompt")
TL_TOKENS_RESPONSE = ("tokens", "response")
TL_TOKENS_FULL = ("tokens", "full")
TL_ATTENTION_MASK = ("masks", "all_attention_mask")
TL_ASSISTANT_MASK = ("masks", "all_assistant_mask")
TL_LOG_PROBS_FULL = ("log_probs", "full")
TL_REF_LOG_PROBS_FULL = ("next", "ref_log_probs", "full")
PASSTHROUGH = (K.REWARD, K.GROUP_ID, K.POLICY_VERSION)


def left_pad(tokens: torch.Tensor, mask: torch.Tensor, pad_value) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded [B, L] (mask a prefix of each row) -> left-padded, same width."""
    mask = mask.bool()
    width = tokens.shape[1]
    shift = width - mask.sum(1, keepdim=True)                      # leading pads of each row
    cols = torch.arange(width, device=tokens.device).expand_as(mask)
    real = cols >= shift
    src = (cols - shift).clamp(min=0)
    return torch.where(real, tokens.gather(1, src), torch.full_like(tokens, pad_value)), real


def to_torchrl_llm(batch: TensorDictBase, *, old_log_prob_key: NestedKey = K.LOGP_OLD,
                   pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT) -> TensorDict:
    """A new TensorDict in torchrl's LLM layout (table in the module docstring); `batch` is not changed."""
    prompt, prompt_mask = left_pad(batch.get(K.TOKENS_PROMPT), batch.get(K.MASK_PROMPT), pad_token_id)
    response, response_mask = batch.get(K.TOKENS_RESPONSE), batch.get(K.MASK_RESPONSE).bool()
    rows, lp = prompt.shape
    keep = response_mask
    if K.CORRECTION_MASK in batch.keys(True):
        keep = keep & batch.get(K.CORRECTION_MASK).bool()
    none = torch.zeros_like(prompt_mask)

    def full(per_response: torch.Tensor) -> torch.Tensor:    # response-aligned [B, Lr] -> [B, Lp+Lr]
        per_response = torch.where(response_mask, per_response.float(), 0.0)
        return torch.cat([per_response.new_zeros(rows, lp), per_response], 1)

    if old_log_prob_key not in batch.keys(True):
        raise KeyError(f"{old_log_prob_key} is missing: run TrainerLogProbs (write_old=True) first, or pass "
                       f"old_log_prob_key={K.LOGP_ROLLOUT} for the inference engine's log-probs")
    out = TensorDict({
        TL_TOKENS_PROMPT: prompt,
        TL_TOKENS_RESPONSE: response,
        TL_TOKENS_FULL: torch.cat([prompt, response], 1),
        TL_ATTENTION_MASK: torch.cat([prompt_mask, response_mask], 1),
        TL_ASSISTANT_MASK: torch.cat([none, keep], 1),
        TL_LOG_PROBS_FULL: full(batch.get(old_log_prob_key).detach()),
    }, batch_size=batch.batch_size, device=batch.device)
    if K.LOGP_REF in batch.keys(True):
        out.set(TL_REF_LOG_PROBS_FULL, full(batch.get(K.LOGP_REF).detach()))
    if K.ADVANTAGE in batch.keys():
        adv = batch.get(K.ADVANTAGE).float()
        adv = adv.reshape(rows, 1).expand_as(response_mask) if adv.dim() == 1 else adv
        out.set(K.ADVANTAGE, full(adv).unsqueeze(-1))
    for key in PASSTHROUGH:
        if key in batch.keys():
            out.set(key, batch.get(key))
    return out


class TorchRLLLMLayout(TensorDictModuleBase):
    """`to_torchrl_llm` as a TensorDict module (last in a `TensorDictSequential` before a torchrl LLM loss).
    Its forward returns the new TensorDict; the input batch is left as it is."""

    def __init__(self, *, old_log_prob_key: NestedKey = K.LOGP_OLD, pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT):
        super().__init__()
        self.old_log_prob_key, self.pad_token_id = old_log_prob_key, pad_token_id
        self.in_keys = [K.TOKENS_PROMPT, K.MASK_PROMPT, K.TOKENS_RESPONSE, K.MASK_RESPONSE, old_log_prob_key]
        self.out_keys = [TL_TOKENS_PROMPT, TL_TOKENS_RESPONSE, TL_TOKENS_FULL, TL_ATTENTION_MASK, TL_ASSISTANT_MASK,
                         TL_LOG_PROBS_FULL, K.ADVANTAGE]

    def forward(self, batch: TensorDictBase) -> TensorDict:
        return to_torchrl_llm(batch, old_log_prob_key=self.old_log_prob_key, pad_token_id=self.pad_token_id)
