"""Config sources: a file overlays the embedded default, --no-default, list-index --set, one preset namespace."""

import pytest

from trace_rl.audit.drift import resolve_plans
from trace_rl.cli import main
from trace_rl.config import ConfigError
from trace_rl.pipelines import default_config
from trace_rl.pipelines.sources import deep_merge, resolve_config
from trace_rl.plan import PLAN_PRESETS, PRESET_ALIASES, PRESETS, PrecisionPlan


def test_short_file_overlays_the_embedded_default(tmp_path):
    path = tmp_path / "short.yaml"
    path.write_text("loop: {steps: 3}\n")
    resolved = resolve_config(path)
    default = default_config()
    assert resolved.config.loop.steps == 3
    assert resolved.config.loop.prompts_per_step == default.loop.prompts_per_step   # merged, not replaced
    assert resolved.config.precision == default.precision                           # FP4, not silently bf16
    assert resolved.config.corrections == default.corrections
    assert "embedded default" in resolved.describe() and str(path) in resolved.describe()


def test_no_default_starts_from_field_defaults(tmp_path):
    path = tmp_path / "short.yaml"
    path.write_text("loop: {steps: 3}\n")
    cfg = resolve_config(path, use_default=False).config
    assert cfg.precision == PrecisionPlan() and cfg.corrections == () and cfg.loop.steps == 3


def test_a_section_of_another_kind_replaces_the_default_one(tmp_path):
    path = tmp_path / "countdown.yaml"
    path.write_text("task: {kind: countdown}\n")
    assert resolve_config(path).config.task.kind == "countdown"     # arithmetic's ops/digits not merged in
    assert deep_merge({"a": {"x": 1, "l": [1, 2]}}, {"a": {"l": [3]}}) == {"a": {"x": 1, "l": [3]}}


def test_list_index_override():
    cfg = resolve_config(overrides={"corrections.0.params.C": 3}).config
    assert cfg.corrections[0].kind == "token_tis" and cfg.corrections[0].params == {"C": 3}
    assert default_config().with_overrides({"corrections.0.params.C": 5}).corrections[0].params == {"C": 5}


@pytest.mark.parametrize("key,needle", [
    ("corrections.1.params.C", "corrections has 1 entries"),
    ("corrections.x.params.C", "index it with a number"),
    ("loop.steps.0", "is a value"),
    ("trainer.betas.0", "trainer.betas is not set"),
])
def test_bad_list_overrides_say_what_is_wrong(key, needle):
    with pytest.raises(ConfigError, match=needle):
        resolve_config(overrides={key: 1})


def test_cli_set_list_index_and_show_names_the_layers(tmp_path, capsys):
    path = tmp_path / "short.yaml"
    path.write_text("loop: {steps: 3}\n")
    assert main(["validate", str(path), "--set", "corrections.0.params.C=3", "--show"]) == 0
    out = capsys.readouterr().out
    assert "# resolved from: the embedded default" in out and "short.yaml" in out and "--set corrections.0" in out
    assert "C: 3" in out and "rollout_weights: nvfp4" in out
    assert main(["validate", str(path), "--no-default", "--show"]) == 0
    out = capsys.readouterr().out
    assert "field defaults (--no-default)" in out and "rollout_weights: bf16" in out


def test_one_preset_namespace():
    for name in [*PRESETS, *PRESET_ALIASES]:
        plan = PrecisionPlan.preset(name)                            # PrecisionPlan.preset
        assert resolve_plans([name])[0][1] == plan                   # trace-rl drift --plans
        cfg = resolve_config(preset=name).config                     # trace-rl run --preset
        assert cfg.precision == plan
        assert [c.model_dump() for c in cfg.corrections] == [dict(c) for c in PRESETS[
            PRESET_ALIASES.get(name, name)].corrections]
    assert set(PLAN_PRESETS) == {*PRESETS, *PRESET_ALIASES}
    assert PrecisionPlan.preset("w4a4-kv4") == PrecisionPlan.preset("fp4")
    with pytest.raises(ConfigError, match="unknown preset 'fp5'; available: bf16"):
        PrecisionPlan.preset("fp5")


def test_run_preset_w4a16_is_accepted(capsys):
    assert main(["validate", "--preset", "w4a16"]) == 0
    assert "w4a16" in capsys.readouterr().out
