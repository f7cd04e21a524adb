"""`RolloutCollector`: a torchrl collector (`torchrl.collectors.BaseCollector`) that turns prompts into scored
GRPO batches.

Each iteration: take the next prompt batch [P] from the prompt source, sample G = `sampling.n` responses
per prompt with the engine, copy the prompts' extra entries onto their responses, give every prompt a
fresh "group_id" (unique across batches), make sure "policy_version" is stamped, score "reward" with the
task's reward function, run `postproc` (e.g. `GroupAdvantage`), write into the replay buffer if one is
given, and yield the batch [P*G] (responses to prompt i are rows i*G .. i*G+G-1).

The torchrl collector API: iterate it (`for batch in collector`), `set_seed(seed, static_seed=False)`,
`update_policy_weights_(weights, version=...)` (forwards new weights to the engine, which re-quantizes them),
`state_dict()` / `load_state_dict()` (counters, for resuming), `shutdown()`. Unlike torchrl's collectors, the
batch is yielded even when a replay buffer is given (the trainer may log it), and the policy is the
engine's own copy of the weights, so `update_policy_weights_()` needs the weights passed to it.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping

import torch
from tensordict import TensorDictBase
from tensordict.base import _is_leaf_nontensor

with warnings.catch_warnings():          # torchrl's own weight updaters warn about their deprecation on import
    warnings.simplefilter("ignore", DeprecationWarning)
    from torchrl.collectors import BaseCollector

from trace_rl.data import schema as K
from trace_rl.engine.base import RolloutEngine, SamplingParams

RewardFn = Callable[[TensorDictBase], torch.Tensor | TensorDictBase]
"""Reads a rollout batch [B] (schema keys plus the prompts' extra entries) and returns rewards [B], or is a
TensorDict module that writes its `out_keys[0]` (e.g. `TaskReward`, which writes "reward")."""


class RolloutCollector(BaseCollector):
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
        super().__init__()
        self.engine, self.prompts, self.reward_fn, self.sampling = engine, prompts, reward_fn, sampling
        self.total_batches = total_batches
        self.replay_buffer = replay_buffer
        self.postproc = postproc
        self.next_group_id = group_id_start
        self.batches_collected = 0
        self.static_seed = False
        # torchrl's frame counters, in rows (sampled responses); -1: no set total
        self.total_frames = -1
        self.requested_frames_per_batch = self.frames_per_batch = 0

    @property
    def policy_version(self) -> int:
        return self.engine.policy_version

    def update_policy_weights_(self, policy_or_weights=None, version: int | None = None, **kwargs) -> None:
        """Send trainer weights to the engine (which re-quantizes them) and stamp later samples with
        `version` (default: the current version + 1). `policy_or_weights`: a state dict, a TensorDict of
        parameters (`TensorDict.from_module(model)`) or the trainer's module itself."""
        if kwargs:
            raise TypeError(f"update_policy_weights_: unsupported arguments {sorted(kwargs)} (the engine holds "
                            f"the only copy of the rollout weights: pass them, and a version)")
        if policy_or_weights is None:
            raise ValueError("update_policy_weights_: pass the trainer's weights (a state dict, a TensorDict of "
                             "parameters or the module): the engine keeps its own quantized copy")
        if isinstance(policy_or_weights, torch.nn.Module):
            weights = policy_or_weights.state_dict()
        elif isinstance(policy_or_weights, TensorDictBase):
            weights = policy_or_weights.flatten_keys(".").to_dict()
        elif isinstance(policy_or_weights, Mapping):
            weights = policy_or_weights
        else:
            raise TypeError(f"update_policy_weights_: expected a state dict, TensorDict or module, got "
                            f"{type(policy_or_weights).__name__}")
        self.engine.load_weights(weights, self.engine.policy_version + 1 if version is None else version)

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        """Seed the sampling: batch k samples with seed + k (with `static_seed`, every batch with `seed`).
        Returns `seed` (torchrl's convention: the seed the next component may use)."""
        self.sampling = self.sampling.model_copy(update={"seed": int(seed)})
        self.static_seed = static_seed
        return int(seed)

    def state_dict(self) -> OrderedDict:
        """Counters a resumed run needs (batches collected, next group id, policy version)."""
        return OrderedDict(batches_collected=self.batches_collected, next_group_id=self.next_group_id,
                           policy_version=self.engine.policy_version)

    def load_state_dict(self, state_dict: Mapping) -> None:
        self.batches_collected = int(state_dict["batches_collected"])
        self.next_group_id = int(state_dict["next_group_id"])

    def __len__(self) -> int:
        if self.total_batches is None:
            raise RuntimeError("a RolloutCollector without total_batches has no length")
        return self.total_batches

    def _sampling_for(self, index: int) -> SamplingParams:
        if self.sampling.seed is None or self.static_seed:
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
        reward = self.reward_fn(batch)
        if isinstance(reward, TensorDictBase):       # a TensorDict module (TaskReward) wrote its key
            reward = reward.get(getattr(self.reward_fn, "out_keys", [K.REWARD])[0])
        reward = torch.as_tensor(reward, dtype=torch.float32)
        if reward.shape != batch.batch_size:
            raise ValueError(f"reward_fn returned shape {tuple(reward.shape)}, expected {tuple(batch.batch_size)}")
        # beside the group ids: a batch that spans devices (guided rollout: records in pinned host memory, the
        # rest on the engine's device) has no device of its own, and the advantage needs both on one
        batch.set(K.REWARD, reward.to(batch.device or batch.get(K.GROUP_ID).device))
        if self.postproc is not None:
            batch = self.postproc(batch)
        if self.replay_buffer is not None:
            self.replay_buffer.extend(batch)
        self.batches_collected += 1
        return batch

    def iterator(self) -> Iterator[TensorDictBase]:
        """What `for batch in collector` runs (torchrl's `BaseCollector.__iter__` calls it)."""
        source = iter(self.prompts)
        while self.total_batches is None or self.batches_collected < self.total_batches:
            prompts = next(source, None)
            if prompts is None:
                return
            yield self.collect(prompts)

    def shutdown(self, timeout: float | None = None, close_env: bool = True, raise_on_error: bool = True) -> None:
        """torchrl's API. The engine belongs to whoever built it (it may serve several collectors), so it is
        not closed here."""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(engine={type(self.engine).__name__}, group_size={self.sampling.n}, "
                f"batches_collected={self.batches_collected}, policy_version={self.policy_version})")
