"""VLLMEngine with an FP8 KV cache (vLLM's kv_cache_dtype='fp8_e4m3') and mxfp4 weights through the plugin.

vLLM's FP8 cache is not trace_rl's `fp8_e4m3` KV format: it scales per tensor (1.0 without a calibrated
checkpoint) where ours scales per token and head, and vllm-cpu 0.32.0 rounds toward zero where ours rounds
to nearest. The reference here reproduces vLLM's cache (`helpers.vllm_cpu_fp8_kv`) in the trainer's
forward, on top of the aligned trainer's mxfp4 weights: then the log-probs agree to 1e-4, except after a
K/V value that float32 noise moved across an E4M3 step (round toward zero makes every grid point a
boundary): the sequence's later tokens then differ by ~1e-4..1e-3 (seen: 4 of 480 tokens, max 5.7e-4).
"""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("vllm")

import trace_rl.models.attention as attention  # noqa: E402
from tests.vllm.helpers import default_policy, make_engine, prompts, sampling, trainer_log_probs, vllm_cpu_fp8_kv  # noqa: E402
from trace_rl.data import schema as K  # noqa: E402
from trace_rl.plan import PrecisionPlan  # noqa: E402

pytestmark = pytest.mark.vllm
PLAN = PrecisionPlan(rollout_weights="mxfp4", kv_cache="fp8_e4m3")


@pytest.fixture(scope="module")
def policy():
    return default_policy()


@pytest.fixture(scope="module")
def engine(policy):
    engine = make_engine(*policy, PLAN)
    yield engine
    engine.shutdown()


class _VLLMCacheBackend:
    """Stands in for the KV format's backend in the trainer's attention (its `fake_quantize` is all it calls)."""

    def fake_quantize(self, x: torch.Tensor, fmt: str, guidance=None) -> torch.Tensor:
        assert guidance is None, "vLLM's cache records no guidance"
        return vllm_cpu_fp8_kv(x)


def _reference(model, out, s, monkeypatch, kv: str | None):
    trainer = copy.deepcopy(model).apply_plan(PLAN.model_copy(update={"trainer": "aligned", "kv_cache": "bf16"}))
    with monkeypatch.context() as m:
        if kv == "vllm":
            m.setattr(attention, "backend_for_format", lambda name: _VLLMCacheBackend())
        for layer in trainer.model.layers:
            layer.self_attn.kv_fake_fmt = None if kv is None else "fp8_e4m3"
        return trainer_log_probs(trainer, out, s)


def test_fp8_kv_cache_equals_its_reference(engine, policy, rng, monkeypatch):
    model, _ = policy
    s = sampling(rng, temperature=1.0, top_p=1.0, max_new_tokens=40)   # no truncation: every error finite
    out = engine.generate(prompts(rng), s)
    mask = out[K.MASK_RESPONSE]
    err = (out[K.LOGP_ROLLOUT] - _reference(model, out, s, monkeypatch, "vllm")).abs()[mask]
    print(f"FP8 KV: {int((err > 1e-4).sum())} of {err.numel()} tokens off the reference by > 1e-4 "
          f"(max {err.max():.2e})")
    assert err.median() < 1e-5 and (err <= 1e-4).float().mean() >= 0.9 and err.max() < 1e-2
    unquantized = (out[K.LOGP_ROLLOUT] - _reference(model, out, s, monkeypatch, None)).abs()[mask]
    ours = (out[K.LOGP_ROLLOUT] - _reference(model, out, s, monkeypatch, "fp8_e4m3")).abs()[mask]
    # (-inf where a token falls outside another distribution's top-p set: counted as 10)
    print(f"mean |log-prob difference|: {unquantized.clamp(max=10).mean():.2e} against no KV quantization, "
          f"{ours.clamp(max=10).mean():.2e} against trace_rl's per-token-head FP8 KV")
    assert unquantized.clamp(max=10).mean() > 1e-3 and ours.clamp(max=10).mean() > 1e-3   # FP8, not our format
    worker = engine.report()["workers"][0]
    assert worker["kv_cache_dtype"] == "fp8_e4m3"
    assert worker["linear"]["fp4"].get("fp4.emulated", 0) > 0
