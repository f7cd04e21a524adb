"""The `RolloutEngine` interface every engine (native, hf, vllm) implements, and its sampling parameters."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping

import torch
from pydantic import Field
from tensordict import TensorDict

from trace_rl.config import TraceConfig


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
