"""Every shipped config and preset loads, validates and builds; YAML -> object -> YAML is lossless."""

import pytest

from trace_rl.config import ConfigError, undocumented_fields
from trace_rl.pipelines import PIPELINE_PRESETS, PipelineConfig, apply_preset, build, default_config
from trace_rl.pipelines.config import DEFAULT_MODEL

SHIPPED = sorted((__import__("pathlib").Path(__file__).parents[2] / "trace_rl" / "pipelines" / "configs").glob("*"))


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_configs_round_trip(path):
    cfg = PipelineConfig.load(path)
    text = cfg.to_yaml()
    again = PipelineConfig.from_yaml(text)
    assert again == cfg and again.to_yaml() == text
    assert PipelineConfig.from_toml(cfg.to_toml()) == cfg


@pytest.mark.parametrize("preset", list(PIPELINE_PRESETS))
def test_presets_validate_and_build(preset, tmp_path):
    data = apply_preset(default_config().to_dict(), preset)
    cfg = PipelineConfig.parse(data).with_overrides({"model.preset": "tiny", "loop.eval_prompts": 4})
    pipeline = build(cfg, run_dir=tmp_path / "run")
    assert pipeline.engine.plan == cfg.precision
    assert not (tmp_path / "run").exists()          # building writes nothing


def test_default_model_is_the_embedded_policy():
    assert default_config().model.preset == DEFAULT_MODEL


def test_every_field_is_documented():
    assert undocumented_fields(PipelineConfig) == []


@pytest.mark.parametrize("data,field", [
    ({"loop": {"stepz": 3}}, "loop.stepz"),
    ({"loop": {"steps": "many"}}, "loop.steps"),
    ({"precision": {"kv_cache": "fp5"}}, "precision.kv_cache"),
    ({"rollout": {"engine": "tgi"}}, "rollout.engine"),
    ({"corrections": [{"kind": "magic"}]}, "corrections.0.kind"),
    ({"task": {"kind": "arithmetic", "max_digits": "x"}}, "task.arithmetic.max_digits"),
])
def test_bad_configs_name_the_field(data, field):
    with pytest.raises(ConfigError) as err:
        PipelineConfig.parse(data)
    assert field in str(err.value), str(err.value)


def test_quantized_plan_with_hf_engine_is_refused():
    with pytest.raises(ConfigError, match="engine 'native'"):
        PipelineConfig.parse({"rollout": {"engine": "hf"}, "precision": {"rollout_weights": "nvfp4"}})


@pytest.mark.parametrize("data,match", [
    ({"rollout": {"attention": "gluon"}}, r"rollout.attention='gluon' reads nvfp4 or mxfp4 KV caches only; "
                                          r"precision.kv_cache is 'bf16'"),
    ({"rollout": {"attention": "gluon"}, "precision": {"kv_cache": "fp8_e4m3"}}, "precision.kv_cache is 'fp8_e4m3'"),
    ({"rollout": {"attention": "kernels", "engine": "vllm"}}, "rollout.attention='kernels' chooses the native"),
    ({"rollout": {"attention": "flash_varlen"}}, "rollout.attention: Input should be"),
])
def test_bad_attention_is_refused_naming_the_field(data, match):
    with pytest.raises(ConfigError, match=match):
        PipelineConfig.parse(data)


def test_gluon_attention_refused_at_build_where_it_cannot_run(tmp_path):
    """A valid config (nvfp4 KV) whose model or machine the Gluon kernel cannot take: a ConfigError naming
    rollout.attention when the engine is built, not a silent fallback to another attention."""
    cfg = PipelineConfig.parse({"rollout": {"attention": "gluon"}, "precision": {"kv_cache": "nvfp4"},
                                "model": {"preset": "tiny"}, "loop": {"eval_prompts": 4}})
    assert cfg.rollout.attention == "gluon"
    with pytest.raises(ConfigError, match="rollout.attention: attention='gluon': the Gluon decode attention") as err:
        build(cfg, run_dir=tmp_path / "run")
    assert err.value.fields == ("rollout.attention",)
    ok = cfg.with_overrides({"rollout.attention": "auto"})
    assert build(ok, run_dir=tmp_path / "run").engine.cache.attention_path != "kernels.decode_attention_gluon"


@pytest.mark.parametrize("data,match", [
    ({"rollout": {"operand_cache": True}}, r"rollout.operand_cache holds the bf16 operand of FP4 weights; "
                                           r"precision.rollout_weights is 'bf16'"),
    ({"rollout": {"operand_cache": True}, "precision": {"rollout_weights": "fp8_e4m3:row"}}, "is 'fp8_e4m3:row'"),
    ({"rollout": {"operand_cache": True, "engine": "vllm"}, "precision": {"rollout_weights": "nvfp4"}},
     "rollout.operand_cache is the native engine's"),
    ({"rollout": {"operand_cache": "fp8"}, "precision": {"rollout_weights": "nvfp4", "rollout_activations": "nvfp4"}},
     r"rollout.operand_cache='fp8' holds mxfp4 operands exactly in E4M3 .* 'nvfp4' weights .* "
     r"rollout.operand_cache='bf16'"),
    ({"rollout": {"operand_cache": "fp8"}, "precision": {"rollout_weights": "mxfp4"}},
     r"'mxfp4' weights and 'bf16' activations .* --preset w4a4-kv4-mx"),
    ({"rollout": {"operand_cache": "fp16"}, "precision": {"rollout_weights": "mxfp4"}},
     r"rollout.operand_cache.*Input should be 'bf16' or 'fp8'"),
])
def test_bad_operand_cache_is_refused_naming_the_field(data, match):
    with pytest.raises(ConfigError, match=match):
        PipelineConfig.parse(data)


def test_operand_cache_kinds_parse():
    mx = {"rollout_weights": "mxfp4", "rollout_activations": "mxfp4", "kv_cache": "mxfp4"}
    assert PipelineConfig.parse({"rollout": {"operand_cache": "fp8"}, "precision": mx}).rollout.operand_cache == "fp8"
    assert PipelineConfig.parse({"rollout": {"operand_cache": "bf16"}, "precision": mx}).rollout.operand_cache == "bf16"
    assert PipelineConfig.parse({"rollout": {"operand_cache": True}, "precision": mx}).rollout.operand_cache is True
    assert PipelineConfig.parse({}).rollout.operand_cache is False


def test_operand_cache_refused_at_build_without_a_gpu(tmp_path):
    """FP4 weights on CPU (emulated: the cache would never be read): a ConfigError naming rollout.operand_cache."""
    cfg = PipelineConfig.parse({"rollout": {"operand_cache": True}, "precision": {"rollout_weights": "nvfp4"},
                                "model": {"preset": "tiny"}, "loop": {"eval_prompts": 4}})
    with pytest.raises(ConfigError, match="rollout.operand_cache: the operand cache feeds") as err:
        build(cfg, run_dir=tmp_path / "run")
    assert err.value.fields == ("rollout.operand_cache",)
