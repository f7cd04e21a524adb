"""Prompt sources: iterables of prompt batches, the input a `RolloutCollector` consumes.

A prompt batch is a TensorDict [P] with ("tokens", "prompt") [P, Lp] right-padded and ("masks",
"prompt"), plus any per-prompt entries the reward function needs (tensors, or non-tensor data such as
`tasks.Problem` objects under "problem"). The collector copies those extra entries onto every response.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import torch
from tensordict import NonTensorStack, TensorDict

from trace_rl.data import schema as K
from trace_rl.data.padding import pad_right

PROBLEM = "problem"  # key of the per-prompt `tasks.Problem` written by `TaskPrompts`


class TextTokenizer(Protocol):
    """What the prompt/reward adapters need of a tokenizer (CharTokenizer and HF tokenizers both fit)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def prompt_batch(
    prompts: Sequence[Sequence[int]],
    extras: dict[str, Sequence[Any] | torch.Tensor] | None = None,
    pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
) -> TensorDict:
    """One prompt batch from token lists; `extras` maps a key to one value per prompt (numbers become a
    tensor, anything else a NonTensorStack)."""
    tokens, mask = pad_right([torch.as_tensor(list(p), dtype=torch.long) for p in prompts], pad_token_id)
    td = TensorDict({K.TOKENS_PROMPT: tokens, K.MASK_PROMPT: mask}, batch_size=[len(prompts)])
    for key, values in (extras or {}).items():
        if isinstance(values, torch.Tensor):
            td.set(key, values)
        elif all(isinstance(v, (bool, int, float)) for v in values):  # numbers become a tensor
            td.set(key, torch.as_tensor(list(values)))
        else:
            td.set(key, NonTensorStack(*values, batch_size=[len(prompts)]))
    return td


class PromptBatches:
    """Batches of `batch_size` prompts from a fixed list, reshuffled each epoch (seeded), cycling forever
    unless `epochs` is set. The last partial batch of an epoch is dropped (GRPO batches keep one shape)."""

    def __init__(
        self,
        prompts: Sequence[Sequence[int]],
        batch_size: int,
        *,
        extras: dict[str, Sequence[Any]] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        epochs: int | None = None,
        pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
    ):
        if not 1 <= batch_size <= len(prompts):
            raise ValueError(f"batch_size must be in [1, {len(prompts)}], got {batch_size}")
        self.prompts, self.batch_size, self.extras = list(prompts), batch_size, extras or {}
        self.shuffle, self.seed, self.epochs, self.pad_token_id = shuffle, seed, epochs, pad_token_id

    def __iter__(self) -> Iterator[TensorDict]:
        epoch = 0
        while self.epochs is None or epoch < self.epochs:
            order = list(range(len(self.prompts)))
            if self.shuffle:
                random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            for start in range(0, len(order) - self.batch_size + 1, self.batch_size):
                idx = order[start : start + self.batch_size]
                extras = {k: [v[i] for i in idx] for k, v in self.extras.items()}
                yield prompt_batch([self.prompts[i] for i in idx], extras, self.pad_token_id)
            epoch += 1


class TaskPrompts:
    """Prompt batches drawn from a `trace_rl.tasks.Task`: fresh problems each batch (seeded), encoded with
    `tokenizer`; each batch carries the `Problem`s under "problem" for `TaskReward`."""

    def __init__(self, task, tokenizer: TextTokenizer, batch_size: int, *, split: str = "train", seed: int = 0,
                 num_batches: int | None = None, add_bos: bool = False,
                 pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT):
        self.task, self.tokenizer, self.batch_size = task, tokenizer, batch_size
        self.split, self.seed, self.num_batches = split, seed, num_batches
        self.add_bos, self.pad_token_id = add_bos, pad_token_id

    def _encode(self, text: str) -> list[int]:
        bos = getattr(self.tokenizer, "bos_token_id", None)
        ids = list(self.tokenizer.encode(text))
        return [bos, *ids] if self.add_bos and bos is not None else ids

    def __iter__(self) -> Iterator[TensorDict]:
        index = 0
        while self.num_batches is None or index < self.num_batches:
            problems = self.task.problems(self.batch_size, self.seed * 1_000_003 + index, self.split)
            yield prompt_batch([self._encode(p.prompt) for p in problems], {PROBLEM: problems}, self.pad_token_id)
            index += 1
