"""PrecisionPlan: presets, validation messages that name the field and allowed values, round-trips."""

import pytest
from pydantic import ValidationError

from trace_rl.config import ConfigError, undocumented_fields
from trace_rl.plan import PLAN_PRESETS, PrecisionPlan


@pytest.mark.parametrize("name", list(PLAN_PRESETS))
def test_presets_round_trip_yaml_and_toml(name):
    plan = PrecisionPlan.preset(name)
    assert PrecisionPlan.from_yaml(plan.to_yaml()) == plan
    assert PrecisionPlan.from_toml(plan.to_toml()) == plan


def test_invalid_value_names_field_and_allowed_values():
    with pytest.raises(ConfigError) as err:
        PrecisionPlan.parse({"kv_cache": "fp5"})
    assert "kv_cache" in str(err.value) and "'nvfp4'" in str(err.value) and "fp5" in str(err.value)
    assert err.value.fields == ("kv_cache",)


def test_unknown_key_is_named():
    with pytest.raises(ConfigError, match="kv_cach: unknown key"):
        PrecisionPlan.from_yaml("kv_cach: nvfp4\n")


@pytest.mark.parametrize("data,msg", [
    ({"rollout_activations": "nvfp4"}, "needs rollout_weights='nvfp4'"),
    ({"rollout_weights": "nvfp4", "rollout_activations": "fp8_e4m3:row"}, "needs FP8 weights"),
    ({"rollout_weights": "nvfp4", "trainer": "guided"}, "guided"),
    ({"trainer": "aligned"}, "nothing to align"),
])
def test_unsupported_combinations(data, msg):
    with pytest.raises(ConfigError, match=msg):
        PrecisionPlan.parse(data)


def test_keep_high_precision_globs():
    plan = PrecisionPlan.preset("fp4")
    assert plan.weight_format("lm_head") == "bf16"
    assert plan.weight_format("model.embed_tokens") == "bf16"
    assert plan.weight_format("model.layers.3.post_attention_layernorm") == "bf16"
    assert plan.weight_format("model.layers.3.mlp.up_proj") == "nvfp4"
    custom = plan.model_copy(update={"keep_high_precision": ("model.layers.0.*",)})
    assert custom.weight_format("model.layers.0.mlp.up_proj") == "bf16"
    assert custom.activation_format("model.layers.1.mlp.up_proj") == "nvfp4"


def test_plan_is_frozen_and_documented():
    plan = PrecisionPlan()
    with pytest.raises(ValidationError):
        plan.kv_cache = "nvfp4"
    assert undocumented_fields(PrecisionPlan) == []


def test_labels():
    assert PrecisionPlan.preset("w4a4-kv4").label == "w4a4-kv4(nvfp4)"
    assert PrecisionPlan.preset("fp8").label == "w8a8-kv8"
    assert PrecisionPlan.preset("bf16").label == "bf16"
