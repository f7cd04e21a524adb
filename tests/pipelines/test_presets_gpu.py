"""Every preset's pipeline on the GPU: two steps of the embedded job with the bf16 reference evaluation.

The CPU suite runs every preset on the CPU, where every tensor of a batch lives on one device; on the GPU a
guided batch spans devices (records in pinned host memory, the rest on the GPU), and the study's fp4-guided
run crashed there at its first step (2026-12-01/02) while every CPU test passed. This is the check that
would have caught it, for each preset."""

import math

import pytest

from trace_rl.pipelines import PIPELINE_PRESETS, PipelineConfig, apply_preset, build, default_config


@pytest.mark.gpu
@pytest.mark.parametrize("preset", [p for p in PIPELINE_PRESETS if p not in ("w4a4-kv4", "w4a4-kv4-mx")])
def test_preset_pipeline_steps_on_the_gpu(preset, tmp_path):
    data = apply_preset(default_config().to_dict(), preset)
    cfg = PipelineConfig.parse(data).with_overrides({
        "model.device": "cuda", "loop.steps": 2, "loop.prompts_per_step": 4, "loop.group_size": 2,
        "loop.eval_every": 1, "loop.eval_prompts": 4, "loop.eval_reference": True,
        "logging.progress": False, "logging.plot": False})
    pipe = build(cfg, run_dir=tmp_path / "run")
    assert next(pipe.model.parameters()).is_cuda
    for _ in range(2):
        record = pipe.train_step()
        assert math.isfinite(record["loss"]) and math.isfinite(record["grad_norm"]), record
        evaluation = pipe.evaluate()
        assert 0.0 <= evaluation["eval_accuracy"] <= 1.0
        if preset == "bf16":        # the rollout already is the bf16 reference: no second evaluation (2026-12-02)
            assert "eval_ref_accuracy" not in evaluation
        else:
            assert 0.0 <= evaluation["eval_ref_accuracy"] <= 1.0
