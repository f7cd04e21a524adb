"""Group-relative advantages checked against values worked by hand."""

import math

import pytest
import torch
from tensordict import TensorDict

from trace_rl.data import schema as K
from trace_rl.data.advantages import GroupAdvantage, GroupAdvantageConfig, group_advantages

# two groups, interleaved on purpose: group 7 = rewards [1, 0, 2], group 3 = rewards [4, 4]
REWARD = torch.tensor([1.0, 4.0, 0.0, 4.0, 2.0])
GROUP = torch.tensor([7, 3, 7, 3, 7])


def test_mean_baseline_without_std():
    got = group_advantages(REWARD, GROUP, scale="none")
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -1.0, 0.0, 1.0]))


def test_mean_baseline_with_unbiased_std():
    got = group_advantages(REWARD, GROUP, scale="std", eps=0.0)
    # group 7: mean 1, unbiased std sqrt(((0)^2 + 1 + 1) / 2) = 1; group 3: equal rewards -> exactly 0, eps 0 too
    assert got[[0, 2, 4]].tolist() == pytest.approx([0.0, -1.0, 1.0])
    assert got[[1, 3]].tolist() == [0.0, 0.0]
    got = group_advantages(REWARD, GROUP, scale="std", eps=1e-6)
    assert got[[1, 3]].tolist() == [0.0, 0.0]  # identical rewards: no signal, no blow-up


def test_leave_one_out_baseline():
    got = group_advantages(REWARD, GROUP, baseline="leave_one_out", scale="none")
    # row 0: 1 - (0 + 2)/2 = 0; row 2: 0 - (1+2)/2 = -1.5; row 4: 2 - (1+0)/2 = 1.5
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, -1.5, 0.0, 1.5]))
    # identity: LOO = G/(G-1) * (r - mean)
    plain = group_advantages(REWARD, GROUP, scale="none")
    torch.testing.assert_close(got[[0, 2, 4]], plain[[0, 2, 4]] * 3 / 2)


def test_leave_one_out_with_std():
    got = group_advantages(REWARD, GROUP, baseline="leave_one_out", scale="std", eps=0.0)
    torch.testing.assert_close(got[[0, 2, 4]], torch.tensor([0.0, -1.5, 1.5]))


def test_singleton_group_gets_zero():
    got = group_advantages(torch.tensor([3.0, 1.0, 2.0]), torch.tensor([0, 1, 1]))
    assert got[0] == 0.0
    # rewards [1, 2]: mean 1.5, unbiased std sqrt((.25 + .25) / 1)
    assert got[1].item() == pytest.approx(-0.5 / math.sqrt(0.5), rel=1e-5)


def test_transform_reads_and_writes_schema_keys():
    td = TensorDict({K.REWARD: REWARD, K.GROUP_ID: GROUP}, batch_size=[5])
    GroupAdvantage.from_config(GroupAdvantageConfig(scale="none"))(td)
    torch.testing.assert_close(td[K.ADVANTAGE], torch.tensor([0.0, 0.0, -1.0, 0.0, 1.0]))


def test_unknown_options_raise():
    with pytest.raises(ValueError):
        group_advantages(REWARD, GROUP, baseline="median")


@pytest.mark.parametrize("baseline", ["mean", "leave_one_out"])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_equal_rewards_give_exactly_zero(baseline, eps):
    """16 all-correct answers at reward 1.1: the float32 mean leaves a one-ulp residue that (std + 1e-6)
    blew up to A = -0.106; such a group must contribute exactly nothing, with eps = 0 too (not 0/0)."""
    reward = torch.cat([torch.full((16,), 1.1), torch.tensor([0.3, 0.3, 0.3, 1e-8]), torch.full((5,), -7.25)])
    group = torch.tensor([0] * 16 + [1] * 4 + [2] * 5)
    got = group_advantages(reward, group, baseline=baseline, scale="std", eps=eps)
    assert got.dtype == torch.float32
    assert torch.equal(got[:16], torch.zeros(16)) and torch.equal(got[20:], torch.zeros(5))
    assert torch.isfinite(got[16:20]).all() and (got[16:20] != 0).all()   # a real difference keeps its signal


@pytest.mark.parametrize("size", [1, 2, 5])
def test_nan_reward_stays_nan_in_every_group_size(size):
    reward = torch.cat([torch.tensor([math.nan] + [1.0] * (size - 1)), torch.tensor([0.0, 1.0])])
    group = torch.tensor([4] * size + [9, 9])
    for scale in ("std", "none"):
        got = group_advantages(reward, group, scale=scale)
        assert torch.isnan(got[:size]).all(), (scale, got)
        assert torch.isfinite(got[size:]).all()                               # other groups untouched


def test_group_size_one_is_refused_by_the_pipeline_config():
    from trace_rl.config import ConfigError
    from trace_rl.pipelines import default_config

    with pytest.raises(ConfigError, match=r"loop.group_size: must be at least 2, got 1: a group of one"):
        default_config().with_overrides({"loop.group_size": 1})


def test_reward_and_group_ids_on_different_devices_are_refused():
    with pytest.raises(ValueError, match="put both on one device"):
        group_advantages(REWARD, GROUP.to("meta"))
