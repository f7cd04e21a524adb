"""A few RL steps of a tiny mixture-of-experts policy on CPU with an FP4 rollout and router replay."""

import math

import pytest
import torch

from tests.pipelines.test_run import small
from trace_rl.config import ConfigError
from trace_rl.data import schema as K
from trace_rl.pipelines import build
from trace_rl.pipelines.run_log import read_history

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def moe(steps: int, **extra):
    return small(steps, **{"model.preset": "tiny-moe", "precision": {"rollout_weights": "nvfp4",
                                                                     "rollout_activations": "nvfp4",
                                                                     "kv_cache": "nvfp4"},
                           "rollout.sampling.max_new_tokens": 8, "loop.eval_prompts": 4, **extra})


def test_moe_steps_with_replay_log_routing_drift(tmp_path):
    pipe = build(moe(2, **{"model.router_aux_loss_coef": 0.01}), run_dir=tmp_path / "r")
    assert pipe.router_replay and pipe.trainer_logprobs.router_replay     # default on for MoE
    pipe.run()
    train = [r for r in read_history(tmp_path / "r") if r["kind"] == "train"]
    assert len(train) == 2 and all(math.isfinite(r["loss"]) for r in train)
    for key in ("routing_mismatch", "routing_overlap", "routing_mismatch/moe0", "routing_mismatch/moe2",
                "routing_by_position/mismatch/0-1", "router_aux_loss"):
        assert key in train[0], key
    assert 0 <= train[0]["routing_mismatch"] <= 1 and 0 < train[0]["routing_overlap"] <= 1
    assert train[0]["router_aux_loss"] > 0


def test_replay_off_and_optimizer_sees_replayed_routing(tmp_path):
    pipe = build(moe(1, **{"model.router_replay": False}), run_dir=tmp_path / "off")
    assert not pipe.router_replay and not pipe.trainer_logprobs.router_replay
    batch = pipe.collect_batch()
    assert batch.get(K.ROUTING_EXPERTS).dtype == torch.int16          # the engine records either way
    sample = pipe.draw_sample(batch)
    report = pipe.score_sample(sample)
    assert "routing_mismatch" in report.flat()


@pytest.mark.parametrize("overrides,field", [
    ({"model.preset": "tiny", "model.router_replay": True}, "model.router_replay"),
    ({"model.preset": "tiny", "model.router_aux_loss_coef": 0.01}, "model.router_aux_loss_coef"),
    ({"model.preset": "tiny-moe", "rollout.engine": "recompute", "precision": {}}, "model.router_replay"),
])
def test_moe_options_refused_where_they_cannot_work(overrides, field, tmp_path):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")) as err:
        build(small(1, **overrides), run_dir=tmp_path / "x")
    assert err.value.fields == (field,)
    assert not (tmp_path / "x").exists()
