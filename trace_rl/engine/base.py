"""The `RolloutEngine` interface every engine (native, hf, vllm) implements: its sampling parameters, and
`rollout_output`, the TensorDict every engine's `generate` returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch
from pydantic import Field
from tensordict import TensorDict

from trace_rl.config import TraceConfig
from trace_rl.data import schema as K


class SamplingParams(TraceConfig):
    """How responses are sampled. Log-probs reported are those of the distribution actually sampled from:
    logits / temperature, then top-k, then top-p (nucleus) renormalisation."""

    n: int = Field(1, ge=1, description="Responses sampled per prompt (the GRPO group size).")
    temperature: float = Field(1.0, ge=0.0, description="Softmax temperature; 0 means greedy decoding.")
    top_k: int = Field(0, ge=0, description="Keep the k most likely tokens (0 keeps all).")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling mass (1.0 keeps all).")
    max_new_tokens: int = Field(64, ge=1, description="Most tokens generated per response.")
    stop_token_ids: tuple[int, ...] = Field((), description="Generation of a response ends after any of these.")
    ignore_stop: bool = Field(False, description="Generate exactly max_new_tokens (benchmarks).")
    seed: int | None = Field(None, description="Seed of the sampling generator (None: not reseeded).")


class RolloutEngine(ABC):
    """Samples responses. Input: a TensorDict with ("tokens","prompt") [B, Lp] right-padded and
    ("masks","prompt"). Output: B*n rows in the schema of `trace_rl.data.schema` (responses of prompt i
    are rows i*n .. i*n+n-1), including ("log_probs","rollout") and "policy_version"."""

    policy_version: int = 0

    @abstractmethod
    def generate(self, prompts: TensorDict, sampling: SamplingParams) -> TensorDict: ...

    @abstractmethod
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Swap in new (trainer) weights, re-quantizing them to the plan's formats, and stamp `version`."""


def rollout_output(
    *,
    prompt_tokens: torch.Tensor,
    prompt_mask: torch.Tensor,
    prompt_index: torch.Tensor,
    response_tokens: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    num_generated: torch.Tensor,
    policy_version: int,
    device: torch.device,
) -> TensorDict:
    """What `RolloutEngine.generate` returns: one row per response, row r answering prompt `prompt_index[r]`.

    `prompt_tokens`/`prompt_mask` are the prompt batch [num_prompts, Lp]; each row gets its prompt's by
    `prompt_index`. The response tensors [rows, Lr] and `num_generated` [rows] are stored as given;
    `policy_version` is stamped on every row. Every tensor must already be on `device`, the TensorDict's.
    """
    rows = prompt_index.shape[0]
    return TensorDict({
        K.TOKENS_PROMPT: prompt_tokens[prompt_index],
        K.MASK_PROMPT: prompt_mask[prompt_index],
        K.TOKENS_RESPONSE: response_tokens,
        K.MASK_RESPONSE: response_mask,
        K.LOGP_ROLLOUT: rollout_log_probs,
        K.POLICY_VERSION: torch.full((rows,), policy_version, dtype=torch.long, device=device),
        K.NUM_GENERATED: num_generated,
        K.PROMPT_INDEX: prompt_index,
    }, batch_size=[rows], device=device)
