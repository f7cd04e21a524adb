"""The trace_rl vLLM quantization plugin without an engine: its linear method against QuantLinear (the native
engine's layer) on every weight format at odd shapes, its config, and the plans the vllm engine refuses."""

from __future__ import annotations

import pytest
import torch
from torch import nn

pytest.importorskip("vllm")

from trace_rl.backends import QuantLinear  # noqa: E402
from trace_rl.config import ConfigError  # noqa: E402
from trace_rl.engine.vllm_engine import check_plan  # noqa: E402
from trace_rl.plan import PrecisionPlan  # noqa: E402
from trace_rl.vllm_plugin import QUANT_METHOD, quantization_config  # noqa: E402

pytestmark = pytest.mark.vllm

# (weight format, activation format, part sizes of a fused layer, in_features): odd row counts; in_features a
# multiple of each format's block (16 nvfp4, 32 mxfp4, 128 fp8 blocks).
CASES = [
    ("nvfp4", "bf16", (40, 24, 24), 80),
    ("nvfp4", "nvfp4", (40, 24, 24), 80),
    ("mxfp4", "mxfp4", (37, 11), 96),
    ("fp8_e4m3:row", "fp8_e4m3:row", (29, 13, 13), 64),
    ("fp8_e4m3:tensor", "fp8_e4m3:tensor", (21, 7), 48),
    ("fp8_e4m3:block", "fp8_e4m3:block", (128, 256), 256),
]


@pytest.fixture(autouse=True)
def single_rank(monkeypatch):
    """vLLM's parameters read the tensor-parallel rank at creation; outside an engine there is none."""
    import vllm.model_executor.parameter as parameter

    monkeypatch.setattr(parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(parameter, "get_tensor_model_parallel_world_size", lambda: 1)


def _layer(method, parts, k, weight, bias=None):
    """A bare module set up and loaded the way vLLM's linear layers do it (create, load, process)."""
    layer = nn.Module()
    layer.params_dtype = torch.float32
    method.create_weights(layer, k, list(parts), k, sum(parts), torch.float32,
                          weight_loader=lambda param, w: param.data.copy_(w))
    layer.weight.weight_loader(layer.weight, weight)
    method.process_weights_after_loading(layer)
    return layer


@pytest.mark.parametrize("weight_fmt,act_fmt,parts,k", CASES)
def test_linear_method_equals_quant_linear(weight_fmt, act_fmt, parts, k, rng):
    from trace_rl.models.linear import FUSABLE_WEIGHT_FORMATS
    from trace_rl.vllm_plugin.linear_method import TraceLinearMethod

    weight = torch.randn(sum(parts), k, generator=rng) * 0.05
    bias = torch.randn(sum(parts), generator=rng)
    x = torch.randn(7, k, generator=rng)
    method = TraceLinearMethod(weight_fmt, act_fmt)
    layer = _layer(method, parts, k, weight)
    assert "weight" not in dict(layer.named_parameters())          # only the packed buffers remain
    got = method.apply(layer, x, bias)
    # The native engine's layers: one QuantLinear per part, or one for the stack when rows quantize alone.
    groups = (sum(parts),) if weight_fmt in FUSABLE_WEIGHT_FORMATS else parts
    want = torch.cat([QuantLinear(w, weight_fmt, act_fmt, b)(x)
                      for w, b in zip(weight.split(groups), bias.split(groups))], dim=-1)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    for i, w in enumerate(weight.split(groups)):                   # the codes are trace_rl's, bit for bit
        ref = QuantLinear(w, weight_fmt, act_fmt)
        assert torch.equal(getattr(layer, f"trace_w{i}_codes").view(torch.uint8), ref.w_codes.view(torch.uint8))
    assert method.backend.paths.last.endswith("emulated")          # CPU: the reference path, reported


def test_reprocessing_after_a_reload_uses_the_new_weight(rng):
    """vLLM's reload re-creates the weight, loads and processes again on the same layer: the next forward must
    read the new codes (the cached PackedWeight views and dequantized copy are dropped)."""
    from trace_rl.vllm_plugin.linear_method import TraceLinearMethod

    method = TraceLinearMethod("nvfp4", "nvfp4")
    old, new = (torch.randn(48, 64, generator=rng) for _ in range(2))
    x = torch.randn(5, 64, generator=rng)
    layer = _layer(method, (16, 32), 64, old)
    method.apply(layer, x)
    method.create_weights(layer, 64, [16, 32], 64, 48, torch.float32, weight_loader=lambda p, w: p.data.copy_(w))
    layer.weight.weight_loader(layer.weight, new)
    method.process_weights_after_loading(layer)
    want = torch.cat([QuantLinear(w, "nvfp4", "nvfp4")(x) for w in new.split((16, 32))], dim=-1)
    torch.testing.assert_close(method.apply(layer, x), want, rtol=0, atol=1e-6)


def test_config_round_trip_and_fused_layer_formats():
    from trace_rl.vllm_plugin.quant_config import TraceQuantConfig

    plan = PrecisionPlan(rollout_weights="nvfp4", rollout_activations="nvfp4",
                         keep_high_precision=("lm_head", "embed_tokens", "*norm*", "model.layers.0.*"))
    entry = quantization_config(plan)
    assert entry["quant_method"] == QUANT_METHOD == TraceQuantConfig.from_config(entry).get_name()
    config = TraceQuantConfig.from_config(entry)
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                     "gate_up_proj": ["gate_proj", "up_proj"]}
    assert config._formats("model.layers.1.self_attn.qkv_proj") == ("nvfp4", "nvfp4")
    assert config._formats("model.layers.0.mlp.gate_up_proj") == ("bf16", "bf16")
    split = TraceQuantConfig(plan.model_copy(update={"keep_high_precision": ("lm_head", "embed_tokens", "*k_proj")}))
    split.packed_modules_mapping = config.packed_modules_mapping
    with pytest.raises(ValueError, match="one fused layer"):
        split._formats("model.layers.2.self_attn.qkv_proj")
    with pytest.raises(ValueError, match="needs a 'plan' entry"):
        TraceQuantConfig.from_config({"quant_method": QUANT_METHOD})


@pytest.mark.parametrize("plan,match", [
    (PrecisionPlan.preset("fp4"), "no KV cache in trace_rl's nvfp4"),
    (PrecisionPlan.preset("fp4-guided"), "guided"),
    (PrecisionPlan(rollout_weights="nvfp4", keep_high_precision=("embed_tokens",)), "quantizes 'lm_head'"),
])
def test_plans_vllm_cannot_run_are_refused(plan, match):
    with pytest.raises(ValueError, match=match):
        check_plan(plan)


def test_pipeline_config_with_an_unsupported_plan_is_a_config_error():
    from trace_rl.pipelines import build, default_config

    fp4 = PrecisionPlan.preset("fp4").model_dump()
    cfg = default_config().with_overrides({"rollout.engine": "vllm", "precision": fp4})
    with pytest.raises(ConfigError, match="kv_cache='nvfp4'"):
        build(cfg)
