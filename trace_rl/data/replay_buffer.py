"""Replay buffers for trajectory batches: torchrl `ReplayBuffer` + group-aware, staleness-bounded sampling.

Assembled from torchrl parts (storage / sampler / writer):

- storage: `LazyStackStorage` (default; rows of different response widths are fine — samples are
  right-padded back into a dense batch by `densify`) or `LazyTensorStorage` (rows must share shapes,
  e.g. responses padded to `max_new_tokens`; faster, preallocated).
- sampler: `GroupSampler` below — draws whole GRPO groups (all responses to one prompt), never splits
  them, and never draws a group sampled more than `max_staleness` policy versions ago.
- writer: torchrl's `RoundRobinWriter` (a ring: the oldest rows are overwritten first).

Staleness: the trainer tells the sampler its current policy version (`set_policy_version(buffer, v)`);
a group whose rows carry "policy_version" < v - max_staleness is dropped from sampling (it stays in
storage until the writer overwrites it; torchrl storages have no cheap delete). Prioritized samplers are
not used: torchrl's C++ extension does not load with torch 2.13.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import Field
from tensordict import NestedKey, TensorDict, TensorDictBase
from torchrl.data import LazyStackStorage, LazyTensorStorage, ReplayBuffer, RoundRobinWriter
from torchrl.data.replay_buffers.samplers import Sampler
from torchrl.data.replay_buffers.storages import Storage, TensorStorage

from trace_rl.config import TraceConfig
from trace_rl.data import schema as K
from trace_rl.data.padding import densify


class GroupSampler(Sampler):
    """Samples whole groups of rows sharing `group_key`, skipping groups older than `max_staleness` versions.

    `ReplayBuffer.sample(batch_size)` returns `batch_size // G` distinct groups of G rows each, G being
    `samples_per_group` or, when None, the size every stored group has (all groups must then be of one
    size). Groups are drawn uniformly without replacement within a call; rows of a group come out
    contiguous, in storage order. A group's version is the oldest "policy_version" of its rows.

    Keyword Args:
        group_key: key holding the group id (default "group_id").
        version_key: key holding the policy version that sampled a row (default "policy_version").
        max_staleness: drop groups with version < consumer_version - max_staleness (None: keep all).
        samples_per_group: rows drawn per group (None: whole groups).

    Attributes:
        consumer_version: the trainer's current policy version (set it after each weight update).
    """

    def __init__(
        self,
        *,
        group_key: NestedKey = K.GROUP_ID,
        version_key: NestedKey = K.POLICY_VERSION,
        max_staleness: int | None = None,
        samples_per_group: int | None = None,
    ):
        if max_staleness is not None and max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0 or None, got {max_staleness}")
        if samples_per_group is not None and samples_per_group < 1:
            raise ValueError(f"samples_per_group must be >= 1 or None, got {samples_per_group}")
        self.group_key = group_key
        self.version_key = version_key
        self.max_staleness = max_staleness
        self.samples_per_group = samples_per_group
        self.consumer_version = 0
        self._index: tuple[list[torch.Tensor], torch.Tensor] | None = None

    # -- the group index (rebuilt lazily after writes) --
    def _read(self, storage: Storage, key: NestedKey) -> torch.Tensor:
        n = len(storage)
        if isinstance(storage, TensorStorage):  # read the two columns only, no copy of the rows
            return storage._storage.get(key)[:n].reshape(n).cpu()
        return storage[:n].get(key).reshape(n).cpu()

    def _groups(self, storage: Storage) -> tuple[list[torch.Tensor], torch.Tensor]:
        if self._index is None:
            ids = self._read(storage, self.group_key)
            versions = self._read(storage, self.version_key)
            unique, inverse = torch.unique(ids, return_inverse=True)
            order = torch.argsort(inverse, stable=True)
            counts = torch.bincount(inverse, minlength=unique.numel())
            members = list(torch.split(order, counts.tolist()))
            oldest = torch.full((unique.numel(),), torch.iinfo(torch.int64).max, dtype=torch.int64)
            oldest = oldest.scatter_reduce(0, inverse, versions.long(), reduce="amin")
            self._index = (members, oldest)
        return self._index

    def fresh_groups(self, storage: Storage) -> list[torch.Tensor]:
        """Storage positions of each group young enough to be sampled."""
        members, oldest = self._groups(storage)
        if self.max_staleness is None:
            return members
        fresh = (oldest >= self.consumer_version - self.max_staleness).tolist()
        return [m for m, keep in zip(members, fresh) if keep]

    def _group_size(self, groups: list[torch.Tensor]) -> int:
        if self.samples_per_group is not None:
            return self.samples_per_group
        sizes = {int(g.numel()) for g in groups}
        if len(sizes) > 1:
            raise RuntimeError(f"groups of different sizes {sorted(sizes)} are stored; set samples_per_group")
        return sizes.pop()

    # -- Sampler API --
    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        if len(storage) == 0:
            raise RuntimeError("cannot sample from an empty replay buffer")
        groups = self.fresh_groups(storage)
        if not groups:
            raise RuntimeError(
                f"every stored group is stale (older than {self.max_staleness} versions before "
                f"{self.consumer_version}); collect fresh data"
            )
        size = self._group_size(groups)
        if batch_size % size:
            raise ValueError(f"batch_size {batch_size} is not a multiple of the group size {size}")
        num = batch_size // size
        if num > len(groups):
            raise RuntimeError(f"asked for {num} groups but only {len(groups)} fresh groups are stored")
        chosen = torch.randperm(len(groups), generator=self._rng)[:num].tolist()
        rows = []
        for i in chosen:
            g = groups[i]
            if g.numel() > size:
                g = g[torch.randperm(g.numel(), generator=self._rng)[:size]].sort().values
            elif g.numel() < size:
                raise RuntimeError(f"a group has {g.numel()} rows, fewer than samples_per_group={size}")
            rows.append(g)
        return torch.cat(rows), {}

    def _sampleable_count(self, storage: Storage, batch_size: int) -> int:
        return sum(int(g.numel()) for g in self.fresh_groups(storage)) if len(storage) else 0

    def add(self, index: int) -> None:
        self._index = None

    def extend(self, index: torch.Tensor) -> None:
        self._index = None

    def mark_update(self, index, *, storage: Storage | None = None) -> None:
        self._index = None

    def _empty(self) -> None:
        self._index = None

    def state_dict(self) -> dict[str, Any]:
        return {"consumer_version": self.consumer_version}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.consumer_version = int(state_dict.get("consumer_version", 0))
        self._index = None

    def dumps(self, path) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        torch.save(self.state_dict(), path / "group_sampler.pt")

    def loads(self, path) -> None:
        self.load_state_dict(torch.load(Path(path) / "group_sampler.pt", weights_only=True))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(group_key={self.group_key!r}, max_staleness={self.max_staleness}, "
                f"samples_per_group={self.samples_per_group}, consumer_version={self.consumer_version})")


class ReplayBufferConfig(TraceConfig):
    """A trajectory replay buffer: torchrl storage + `GroupSampler` + round-robin writer."""

    capacity: int = Field(4096, ge=1, description="Rows (sampled responses) the buffer holds.")
    storage: Literal["stack", "tensor"] = Field(
        "stack",
        description="'stack': LazyStackStorage (rows may differ in response width); "
        "'tensor': LazyTensorStorage (preallocated; rows must share shapes).",
    )
    batch_size: int | None = Field(None, ge=1, description="Rows per sample() call (a multiple of the group size).")
    max_staleness: int | None = Field(
        None, ge=0, description="Drop groups sampled more than this many policy versions ago (None: keep all)."
    )
    samples_per_group: int | None = Field(
        None, ge=1, description="Rows drawn from each group (None: whole groups)."
    )
    pad_token_id: int = Field(K.PAD_TOKEN_ID_DEFAULT, description="Pad id used when densifying ragged samples.")

    def build(self, device: torch.device | str | None = None) -> ReplayBuffer:
        return make_replay_buffer(**self.model_dump(), device=device)


def make_replay_buffer(
    capacity: int,
    *,
    storage: Literal["stack", "tensor"] = "stack",
    batch_size: int | None = None,
    max_staleness: int | None = None,
    samples_per_group: int | None = None,
    pad_token_id: int = K.PAD_TOKEN_ID_DEFAULT,
    device: torch.device | str | None = None,
) -> ReplayBuffer:
    """A torchrl `ReplayBuffer` of trajectory rows with group-aware, staleness-bounded sampling.

    Samples come out as dense `TensorDict`s (ragged response widths right-padded by `densify`).
    """
    if storage == "stack":
        store = LazyStackStorage(capacity, device=device)
    elif storage == "tensor":
        store = LazyTensorStorage(capacity, device=device or "cpu")
    else:
        raise ValueError(f"unknown storage {storage!r}; use 'stack' or 'tensor'")

    def collate(data: TensorDictBase) -> TensorDict:
        return densify(data, pad_token_id)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchrl warns about the unused C++ extension
        return ReplayBuffer(
            storage=store,
            sampler=GroupSampler(max_staleness=max_staleness, samples_per_group=samples_per_group),
            writer=RoundRobinWriter(),
            collate_fn=collate,
            batch_size=batch_size,
        )


def set_policy_version(buffer: ReplayBuffer, version: int) -> None:
    """Tell the buffer's `GroupSampler` the trainer's current policy version (for the staleness bound)."""
    sampler = buffer.sampler
    if not isinstance(sampler, GroupSampler):
        raise TypeError(f"buffer sampler is {type(sampler).__name__}, not GroupSampler")
    sampler.consumer_version = int(version)
