"""A pipeline config with `rollout.engine: vllm` trains: vLLM samples every step (W4A4 FP4 through the plugin,
FP8 KV cache), the trainer recomputes, and weights sync back into vLLM after each optimizer step.

vLLM runs with its default process layout here (engine core and worker in their own processes), so weights
travel to the worker by vLLM's RPC: the other transport than the in-process engines of the other tests."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm")

from trace_rl.engine.vllm_engine import VLLMEngine  # noqa: E402
from trace_rl.pipelines import PipelineConfig, build  # noqa: E402
from trace_rl.pipelines.run_log import read_history  # noqa: E402

pytestmark = pytest.mark.vllm

CONFIG = """
seed: 3
model: {preset: default}
task: {kind: arithmetic, ops: [add], min_digits: 1, max_digits: 2}
precision: {rollout_weights: nvfp4, rollout_activations: nvfp4, kv_cache: fp8_e4m3, trainer: bf16}
rollout:
  engine: vllm
  sampling: {temperature: 1.0, max_new_tokens: 6}
  max_batch: 32
  max_seq_len: 32
trainer: {lr: 3.0e-4, micro_batch_size: 32}
corrections:
  - kind: token_tis
    params: {C: 2.0}
loop: {steps: 3, prompts_per_step: 4, group_size: 4, eval_every: 0, eval_prompts: 8}
logging: {progress: false, plot: false}
"""


def test_vllm_pipeline_trains_a_few_steps(tmp_path):
    config = tmp_path / "vllm.yaml"
    config.write_text(CONFIG)
    pipeline = build(PipelineConfig.load(config), run_dir=tmp_path / "run")
    assert isinstance(pipeline.engine, VLLMEngine) and not pipeline.engine._rpc_in_process
    try:
        pipeline.run()
    finally:
        pipeline.engine.shutdown()     # stop vLLM's processes now, not at interpreter exit
    history = read_history(tmp_path / "run")
    train = [r for r in history if r["kind"] == "train"]
    assert [r["step"] for r in train] == [1, 2, 3]
    assert all(math.isfinite(r["loss"]) for r in train)
    # Each step's batch was sampled by the weights synced after the previous step.
    assert [r["policy_version"] for r in train] == [1, 2, 3]
    assert all(r["mismatch_k3"] > 0 for r in train)        # FP4 rollout vs bf16 trainer: drift is measured
    assert any(r["kind"] == "eval" for r in history)
