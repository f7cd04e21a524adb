"""Weight-sync payloads without Ray: packed buffers (quantized once on the trainer) install exactly what a
worker's own re-quantization of the state dict would; the byte transport round-trips every dtype."""

import pytest
import torch

from tests.engine.native_helpers import random_prompts
from trace_rl.distributed.transport import from_wire, to_wire
from trace_rl.distributed.weight_sync import TrainerSidePacker, load_packed, payload_bytes, unique_state_keys
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.models.presets import tiny_model
from trace_rl.plan import PrecisionPlan

PLANS = {
    "bf16": PrecisionPlan(),
    "nvfp4": PrecisionPlan(rollout_weights="nvfp4", rollout_activations="nvfp4", kv_cache="nvfp4"),
    "fp8": PrecisionPlan(rollout_weights="fp8_e4m3:row", rollout_activations="fp8_e4m3:row", kv_cache="fp8_e4m3"),
}


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().reshape(-1).view(torch.uint8)


def perturbed(model, rng):
    return {k: v + 0.01 * torch.randn(v.shape, generator=rng) for k, v in model.state_dict().items()}


@pytest.mark.parametrize("preset,plan", [("tiny", "bf16"),            # tied bf16 lm_head: an alias, shipped once
                                         ("tiny-llama", "nvfp4"), ("tiny-llama", "fp8")])
def test_packed_sync_installs_the_same_buffers_as_requantizing(preset, plan, rng):
    model, _ = tiny_model(preset, seed=int(torch.randint(0, 1000, (), generator=rng)))
    plan = PLANS[plan]
    worker_a = NativeEngine(model, plan, max_batch=2, max_seq_len=32)
    worker_b = NativeEngine(model, plan, max_batch=2, max_seq_len=32)
    packer = TrainerSidePacker(model, plan, "cpu", torch.float32)
    new = perturbed(model, rng)

    worker_a.load_weights(new, 7)
    load_packed(worker_b, from_wire(to_wire(packer.pack(new, 7))), 7)

    a, b = worker_a.model.state_dict(), worker_b.model.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(bits(a[key]), bits(b[key])), key
    assert worker_b.policy_version == 7
    before = worker_b.model.state_dict()["model.layers.0.mlp.down_proj.quant." +
                                         ("weight" if plan.rollout_weights == "bf16" else "w_codes")].clone()
    load_packed(worker_b, packer.pack(model.state_dict(), 8), 8)     # the old weights again: buffers change
    after = worker_b.model.state_dict()["model.layers.0.mlp.down_proj.quant." +
                                        ("weight" if plan.rollout_weights == "bf16" else "w_codes")]
    assert not torch.equal(before, after)


def test_packed_payload_is_smaller_for_fp4(rng):
    model, _ = tiny_model("tiny", seed=0)
    sd = model.state_dict()
    full = payload_bytes({k: sd[k] for k in unique_state_keys(model)})
    packer = TrainerSidePacker(model, PLANS["nvfp4"], "cpu", torch.float32)
    packed = payload_bytes(packer.pack(perturbed(model, rng), 1))
    # float32 trainer weights: 4 bytes each; nvfp4 linears ~0.56 bytes, embeddings/norms stay float32
    assert packed < 0.6 * full


def test_generation_after_packed_sync_matches_requantized_engine(rng):
    model, _ = tiny_model("tiny-llama", seed=3)
    plan = PLANS["nvfp4"]
    a, b = (NativeEngine(model, plan, max_batch=4, max_seq_len=16) for _ in range(2))
    new = perturbed(model, rng)
    a.load_weights(new, 1)
    load_packed(b, TrainerSidePacker(model, plan, "cpu", torch.float32).pack(new, 1), 1)
    params = SamplingParams(n=2, max_new_tokens=4, seed=11)
    prompts = random_prompts([3, 6], rng)
    out_a, out_b = a.generate(prompts, params), b.generate(prompts, params)
    assert torch.equal(out_a.get(("tokens", "response")), out_b.get(("tokens", "response")))
    assert torch.equal(out_a.get(("log_probs", "rollout")), out_b.get(("log_probs", "rollout")))


def test_packed_sync_refreshes_moe_experts(rng):
    """MoE: the experts' derived state (the loop's dequantized copies here; the grouped FP4 kernel's layout on a
    GPU) follows a packed sync, as it follows the engine's own re-quantization."""
    model, _ = tiny_model("tiny-moe", seed=3)
    plan = PLANS["nvfp4"]
    a, b = (NativeEngine(model, plan, max_batch=2, max_seq_len=16) for _ in range(2))
    tokens = torch.randint(4, 100, (2, 6), generator=rng)
    with torch.no_grad():
        old = b.model(tokens)                    # derives the experts' caches from the old weights
        new = perturbed(model, rng)
        a.load_weights(new, 1)
        load_packed(b, TrainerSidePacker(model, plan, "cpu", torch.float32).pack(new, 1), 1)
        assert torch.equal(b.model(tokens), a.model(tokens)) and not torch.equal(b.model(tokens), old)


def test_load_packed_rejects_a_payload_of_another_layout():
    model, _ = tiny_model("tiny", seed=0)
    engine = NativeEngine(model, PLANS["nvfp4"], max_batch=2, max_seq_len=32)
    payload = TrainerSidePacker(model, PLANS["fp8"], "cpu", torch.float32).pack(model.state_dict(), 1)
    with pytest.raises((KeyError, ValueError), match="load_packed"):
        load_packed(engine, payload, 1)


def test_wire_round_trip_keeps_dtype_shape_and_bits(rng):
    tensors = {
        "f32": torch.randn(3, 5, generator=rng),
        "bf16": torch.randn(7, generator=rng).bfloat16(),
        "e4m3": torch.randn(2, 9, generator=rng).to(torch.float8_e4m3fn),
        "u8": torch.randint(0, 255, (4, 3), generator=rng, dtype=torch.uint8),
        "bool": torch.rand(5, generator=rng) > 0.5,
        "scalar": torch.tensor(0.37),
        "strided": torch.randn(6, 4, generator=rng).t(),
    }
    back = from_wire(to_wire(tensors))
    for key, t in tensors.items():
        assert back[key].dtype == t.dtype and back[key].shape == t.shape, key
        assert torch.equal(bits(back[key]), bits(t)), key
