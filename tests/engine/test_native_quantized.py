"""NativeEngine with quantized plans on CPU, against straightforward quantize-dequantize references.

Run in float64: the engine (packed weights, per-token activation quantization, KV quantized on write,
paged decode) and the reference (the trainer's fake quantization over the whole sequence at once) then
agree exactly unless a value lands within float64 noise of an FP4 rounding boundary (~1e-9 per value).
In float32, batch-shape-dependent matmul rounding flips a 4-bit code in about half of such runs (measured
here), which is the trainer/rollout drift TRACE's guided mode exists for, not an engine bug.
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.native_helpers import PAD, random_prompts, trainer_log_probs
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.models import tiny_model
from trace_rl.plan import PrecisionPlan

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _generate(model, plan, rng, max_new: int, lengths=(6, 11), n: int = 2, max_batch: int = 3):
    engine = NativeEngine(model, plan, max_batch=max_batch, max_seq_len=max(lengths) + max_new, block_size=16,
                          pad_token_id=PAD)
    sampling = SamplingParams(n=n, temperature=1.0, max_new_tokens=max_new, ignore_stop=True,
                              seed=int(torch.randint(0, 10**6, (), generator=rng)))
    return engine, sampling, engine.generate(random_prompts(list(lengths), rng), sampling)


@pytest.mark.parametrize("preset", ["w4a4-kv4", "w4a4-kv4-mx", "w4a16"])
def test_fp4_rollout_equals_per_token_reference(preset, rng):
    model, _ = tiny_model("tiny", seed=int(torch.randint(0, 1000, (), generator=rng)), dtype=torch.float64)
    plan = PrecisionPlan.preset(preset)
    engine, sampling, out = _generate(model, plan, rng, max_new=24)
    assert "fp4.emulated" in engine.report()["linear"]["fp4"]      # the CPU path, reported
    rollout = out[K.LOGP_ROLLOUT]
    # Reference: the same weights, fake-quantized per output row; inputs of every quantized Linear per token;
    # K/V quantize-dequantized per token and head (aligned trainer), over the whole sequence at once.
    reference = trainer_log_probs(model.apply_plan(plan.model_copy(update={"trainer": "aligned"})), out, sampling)
    torch.testing.assert_close(rollout, reference, rtol=0, atol=1e-6)
    # The bf16 trainer (plain weights) disagrees: that is the mismatch the corrections see.
    plain = trainer_log_probs(model.apply_plan(None), out, sampling)
    mismatch = (rollout - plain).abs()[out[K.MASK_RESPONSE]]
    print(f"{preset}: |log rollout - log bf16 trainer| mean {mismatch.mean():.3e} max {mismatch.max():.3e}")
    assert mismatch.mean() > 1e-4


@pytest.mark.parametrize("kv", ["nvfp4", "mxfp4", "fp8_e4m3"])
def test_long_generation_kv_error_is_per_token_as_written(kv, rng):
    """Decode with a quantized cache = the reference that quantizes each token's K/V once, when written.

    bf16 weights isolate the cache; 150 tokens past a short prompt make every later token read many
    quantized entries. A cache that re-quantized on read, quantized blocks across tokens, or kept
    prompt K/V unquantized in prefill would drift from this reference."""
    model, _ = tiny_model("tiny", seed=int(torch.randint(0, 1000, (), generator=rng)), dtype=torch.float64)
    plan = PrecisionPlan(kv_cache=kv)
    engine, sampling, out = _generate(model, plan, rng, max_new=150, lengths=(5, 9), n=1, max_batch=2)
    assert engine.cache.k[0].fmt != "bf16"
    for layer in model.model.layers:            # trainer stage, K/V quantize-dequantized per token and head
        layer.self_attn.kv_fake_fmt = kv
    reference = trainer_log_probs(model, out, sampling)
    torch.testing.assert_close(out[K.LOGP_ROLLOUT], reference, rtol=0, atol=1e-6)
    for layer in model.model.layers:
        layer.self_attn.kv_fake_fmt = None
    unquantized = trainer_log_probs(model, out, sampling)
    err = (out[K.LOGP_ROLLOUT] - unquantized).abs()
    assert err[:, 100:].mean() > 1e-5            # the cache's error is there, late in the sequence too
