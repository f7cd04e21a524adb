"""`RolloutCollector`: a TorchRL-style iterable that turns prompts into scored GRPO batches.

Each iteration: take the next prompt batch [P] from the prompt source, sample G = `sampling.n` responses
per prompt with the engine, copy the prompts' extra entries onto their responses, give every prompt a
fresh "group_id" (unique across batches), make sure "policy_version" is stamped, score "reward" with the
task's reward function, run `postproc` (e.g. `GroupAdvantage`), write into the replay buffer if one is
given, and yield the batch [P*G] (responses to prompt i are rows i*G .. i*G+G-1).

Unlike torchrl's collectors, the batch is yielded even when a replay buffer is given (the trainer may
log it); `update_policy_weights_` forwards new weights to the engine, as in torchrl.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
from tensordict import TensorDictBase
from tensordict.base import _is_leaf_nontensor

from trace_rl.data import schema as K
from trace_rl.engine.base import RolloutEngine, SamplingParams

RewardFn = Callable[[TensorDictBase], torch.Tensor]
"""Reads a rollout batch [B] (schema keys plus the prompts' extra entries) and returns rewards [B]."""


class RolloutCollector:
    """Iterable over rollout batches.

    Args:
        engine: any `RolloutEngine`.
        prompts: iterable of prompt batches (see `trace_rl.collectors.prompts`).
        reward_fn: the task's reward, `reward_fn(batch) -> Tensor[B]`.
        sampling: sampling parameters; `n` is the group size. With a `seed`, batch k uses seed + k, so
            batches differ but a run is reproducible.

    Keyword Args:
        total_batches: stop after this many batches (None: until the prompt source ends).
        replay_buffer: a torchrl `ReplayBuffer`; each batch is `extend`ed into it.
        postproc: called on each scored batch before it is stored / yielded (e.g. advantages).
        group_id_start: the first group id (resume a run without reusing ids).

    in_keys: ("tokens", "prompt"), ("masks", "prompt") of the prompt batch. out_keys: the engine's keys
    plus "reward", "group_id", "policy_version" and whatever `postproc` writes.
    """

    in_keys = [K.TOKENS_PROMPT, K.MASK_PROMPT]
    out_keys = [K.TOKENS_RESPONSE, K.MASK_RESPONSE, K.LOGP_ROLLOUT, K.REWARD, K.GROUP_ID, K.POLICY_VERSION]

    def __init__(
        self,
        engine: RolloutEngine,
        prompts: Iterable[TensorDictBase],
        reward_fn: RewardFn,
        sampling: SamplingParams,
        *,
        total_batches: int | None = None,
        replay_buffer=None,
        postproc: Callable[[TensorDictBase], TensorDictBase] | None = None,
        group_id_start: int = 0,
    ):
        self.engine, self.prompts, self.reward_fn, self.sampling = engine, prompts, reward_fn, sampling
        self.total_batches = total_batches
        self.replay_buffer = replay_buffer
        self.postproc = postproc
        self.next_group_id = group_id_start
        self.batches_collected = 0

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def update_policy_weights_(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Send trainer weights to the engine and stamp later samples with `version`."""
        self.engine.load_weights(state_dict, version)

    def _sampling_for(self, index: int) -> SamplingParams:
        if self.sampling.seed is None:
            return self.sampling
        return self.sampling.model_copy(update={"seed": self.sampling.seed + index})

    def collect(self, prompts: TensorDictBase) -> TensorDictBase:
        """One scored batch from one prompt batch (what each iteration does)."""
        num_prompts = prompts.batch_size[0]
        batch = self.engine.generate(prompts.select(K.TOKENS_PROMPT, K.MASK_PROMPT),
                                     self._sampling_for(self.batches_collected))
        index = batch.get(K.PROMPT_INDEX)
        for key in prompts.keys(include_nested=True, leaves_only=True, is_leaf=_is_leaf_nontensor):
            if key not in (K.TOKENS_PROMPT, K.MASK_PROMPT) and key not in batch.keys(True):
                batch.set(key, prompts.get(key)[index.to(prompts.device or "cpu")])
        batch.set(K.GROUP_ID, index.long() + self.next_group_id)
        self.next_group_id += num_prompts
        if K.POLICY_VERSION not in batch.keys():
            batch.set(K.POLICY_VERSION, torch.full(batch.batch_size, self.engine.policy_version,
                                                   dtype=torch.long, device=batch.device))
        reward = torch.as_tensor(self.reward_fn(batch), dtype=torch.float32)
        if reward.shape != batch.batch_size:
            raise ValueError(f"reward_fn returned shape {tuple(reward.shape)}, expected {tuple(batch.batch_size)}")
        batch.set(K.REWARD, reward.to(batch.device or "cpu"))
        if self.postproc is not None:
            batch = self.postproc(batch)
        if self.replay_buffer is not None:
            self.replay_buffer.extend(batch)
        self.batches_collected += 1
        return batch

    def __iter__(self) -> Iterator[TensorDictBase]:
        source = iter(self.prompts)
        while self.total_batches is None or self.batches_collected < self.total_batches:
            prompts = next(source, None)
            if prompts is None:
                return
            yield self.collect(prompts)

    def shutdown(self) -> None:
        """Nothing to release (torchrl collectors' API)."""
