"""Replay buffer: torchrl interop (batches come back unchanged), whole-group sampling, staleness bound."""

import pytest
import torch
from tensordict import TensorDict
from torchrl.data import ReplayBuffer

from trace_rl.data import schema as K
from trace_rl.data.replay_buffer import GroupSampler, ReplayBufferConfig, make_replay_buffer, set_policy_version


def make_batch(groups: list[int], group_size: int, width: int, version: int) -> TensorDict:
    rows = len(groups) * group_size
    gen = torch.Generator().manual_seed(sum(groups) + width)
    mask = torch.arange(width).expand(rows, width) < torch.randint(1, width + 1, (rows, 1), generator=gen)
    return TensorDict(
        {
            K.TOKENS_PROMPT: torch.randint(1, 9, (rows, 3), generator=gen),
            K.MASK_PROMPT: torch.ones(rows, 3, dtype=torch.bool),
            K.TOKENS_RESPONSE: torch.where(mask, torch.randint(1, 9, (rows, width), generator=gen), 0),
            K.MASK_RESPONSE: mask,
            K.LOGP_ROLLOUT: torch.where(mask, -torch.rand(rows, width, generator=gen), 0.0),
            K.REWARD: torch.rand(rows, generator=gen),
            K.GROUP_ID: torch.tensor(groups).repeat_interleave(group_size),
            K.POLICY_VERSION: torch.full((rows,), version),
        },
        batch_size=[rows],
    )


@pytest.mark.parametrize("storage", ["stack", "tensor"])
def test_batches_go_through_torchrl_buffer_unchanged(storage):
    batch = make_batch([0, 1], group_size=3, width=5, version=0)
    rb = make_replay_buffer(16, storage=storage)
    assert isinstance(rb, ReplayBuffer)
    rb.extend(batch)
    out = rb.sample(6)
    assert set(out[K.GROUP_ID].tolist()) == {0, 1}
    # row by row, every sampled row is identical to exactly one input row, and all rows come back
    matches = [[bool((out[i] == batch[j]).all()) for j in range(6)] for i in range(6)]
    assert all(sum(m) == 1 for m in matches)
    assert sorted(m.index(True) for m in matches) == list(range(6))
    if storage == "tensor":
        assert (rb.storage[:6] == batch).all()


def test_ragged_batches_come_back_right_padded():
    rb = make_replay_buffer(32, batch_size=4)
    small, big = make_batch([0], 2, width=3, version=0), make_batch([1], 2, width=6, version=0)
    rb.extend(small)
    rb.extend(big)
    out = rb.sample()
    assert out[K.TOKENS_RESPONSE].shape == (4, 6)
    for i in range(4):
        src = small if int(out[K.GROUP_ID][i]) == 0 else big
        j = int((src[K.REWARD] == out[K.REWARD][i]).nonzero()[0])
        w = src[K.TOKENS_RESPONSE].shape[1]
        assert torch.equal(out[K.TOKENS_RESPONSE][i, :w], src[K.TOKENS_RESPONSE][j])
        assert not out[K.MASK_RESPONSE][i, w:].any()


def test_samples_whole_groups_only():
    rb = make_replay_buffer(64)
    rb.extend(make_batch([0, 1, 2, 3], group_size=4, width=4, version=0))
    for _ in range(5):
        out = rb.sample(8)
        ids = out[K.GROUP_ID]
        assert ids.unique().numel() == 2
        for g in ids.unique():
            assert int((ids == g).sum()) == 4
    with pytest.raises(ValueError):
        rb.sample(6)  # not a multiple of the group size


def test_samples_per_group_subsamples():
    rb = make_replay_buffer(64, samples_per_group=2)
    rb.extend(make_batch([0, 1, 2], group_size=4, width=4, version=0))
    out = rb.sample(6)
    assert out[K.GROUP_ID].unique().numel() == 3


def test_staleness_bound_drops_old_groups():
    rb = make_replay_buffer(64, max_staleness=1)
    rb.extend(make_batch([0, 1], 2, 4, version=0))
    rb.extend(make_batch([2, 3], 2, 4, version=1))
    rb.extend(make_batch([4, 5], 2, 4, version=2))
    set_policy_version(rb, 2)  # versions 1 and 2 are fresh, 0 is too old
    seen = set()
    for _ in range(20):
        seen |= set(rb.sample(4)[K.GROUP_ID].tolist())
    assert seen == {2, 3, 4, 5}
    with pytest.raises(RuntimeError):
        rb.sample(10)  # only 4 fresh groups
    set_policy_version(rb, 10)
    with pytest.raises(RuntimeError, match="stale"):
        rb.sample(2)


def test_ring_overwrites_oldest():
    rb = make_replay_buffer(4)
    for g in range(4):
        rb.extend(make_batch([g], 2, 3, version=g))
    assert sorted(set(rb.storage[:][K.GROUP_ID].tolist())) == [2, 3]


def test_config_builds_a_buffer_and_sampler_state_round_trips(tmp_path):
    rb = ReplayBufferConfig(capacity=8, storage="tensor", batch_size=4, max_staleness=0).build()
    assert isinstance(rb.sampler, GroupSampler) and rb.sampler.max_staleness == 0
    rb.sampler.consumer_version = 5
    rb.sampler.dumps(tmp_path)
    other = GroupSampler()
    other.loads(tmp_path)
    assert other.consumer_version == 5
