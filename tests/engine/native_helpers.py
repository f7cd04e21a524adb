"""Shared pieces of the native-engine tests: prompt batches and the trainer's recomputation."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.objectives.logprobs import response_log_probs

PAD = 0


def random_prompts(lengths: list[int], generator: torch.Generator, low: int = 4, high: int = 100) -> TensorDict:
    """Right-padded prompts of the given lengths, random ids in [low, high)."""
    width = max(lengths)
    tokens = torch.full((len(lengths), width), PAD)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    tokens[mask] = torch.randint(low, high, (int(mask.sum()),), generator=generator)
    return TensorDict({K.TOKENS_PROMPT: tokens, K.MASK_PROMPT: mask}, batch_size=[len(lengths)])


@torch.no_grad()
def trainer_log_probs(model, out: TensorDict, sampling: SamplingParams) -> torch.Tensor:
    """The trainer's log-probs of the engine's responses under the same sampling distribution."""
    logp, _ = response_log_probs(model, out[K.TOKENS_PROMPT], out[K.MASK_PROMPT], out[K.TOKENS_RESPONSE],
                                 out[K.MASK_RESPONSE], temperature=sampling.temperature, top_k=sampling.top_k,
                                 top_p=sampling.top_p, pad_token_id=PAD)
    return logp

