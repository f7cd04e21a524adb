"""RolloutCollector is a torchrl collector: BaseCollector, iterable, set_seed, update_policy_weights_,
state_dict, shutdown; TaskReward is a TensorDict module."""

import pytest
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase

from tests.collectors.test_collector import make_collector
from tests.tiny_lm import TinyLM
from trace_rl.collectors import TaskReward
from trace_rl.data import schema as K


def tokens(batches):
    return [b[K.TOKENS_RESPONSE].tolist() for b in batches]


def test_is_a_torchrl_collector():
    from torchrl.collectors import BaseCollector  # imported here: trace_rl silences its import warnings

    collector = make_collector(total_batches=2)
    assert isinstance(collector, BaseCollector) and len(collector) == 2
    assert len(list(collector)) == 2
    collector.shutdown()
    with pytest.raises(RuntimeError, match="no length"):
        len(make_collector())


def test_set_seed_makes_batches_reproducible():
    a, b, c = (make_collector(total_batches=3) for _ in range(3))
    assert a.set_seed(11) == 11 and b.set_seed(11) == 11 and c.set_seed(12) == 12
    first, second, other = (tokens(list(x)) for x in (a, b, c))
    assert first == second and first != other
    assert first[0] != first[1]                      # batch k samples with seed + k
    static = make_collector(total_batches=2)
    static.set_seed(11, static_seed=True)
    assert static._sampling_for(0).seed == static._sampling_for(5).seed == 11


@pytest.mark.parametrize("form", ["state_dict", "tensordict", "module"])
def test_update_policy_weights_accepts_torchrl_forms(form):
    collector = make_collector(total_batches=2)
    new = TinyLM(vocab_size=12, seed=9)
    weights = {"state_dict": new.state_dict(), "tensordict": TensorDict.from_module(new), "module": new}[form]
    collector.update_policy_weights_(weights)                  # version defaults to current + 1
    assert collector.policy_version == 1
    collector.update_policy_weights_(weights, version=7)
    assert collector.policy_version == 7
    assert next(iter(collector))[K.POLICY_VERSION].tolist() == [7] * 6
    reference = make_collector(total_batches=1)
    reference.engine.load_weights(new.state_dict(), 7)
    assert tokens([next(iter(reference))]) == tokens([next(iter(make_collector_with(new)))])
    with pytest.raises(ValueError, match="pass the trainer's weights"):
        collector.update_policy_weights_()


def make_collector_with(model):
    collector = make_collector(total_batches=1)
    collector.update_policy_weights_(model, version=7)
    return collector


def test_state_dict_round_trip_continues_group_ids():
    collector = make_collector(total_batches=2)
    list(collector)
    state = collector.state_dict()
    assert state["batches_collected"] == 2 and state["next_group_id"] == 4
    fresh = make_collector(total_batches=3)
    fresh.load_state_dict(state)
    batch = next(iter(fresh))
    assert batch[K.GROUP_ID].min().item() == 4 and fresh.batches_collected == 3


def test_task_reward_is_a_tensordict_module():
    from tests.collectors.test_collector import DigitTokenizer, EchoTask

    reward = TaskReward(EchoTask(), DigitTokenizer())
    assert isinstance(reward, TensorDictModuleBase)
    assert reward.out_keys == [K.REWARD] and "problem" in reward.in_keys
