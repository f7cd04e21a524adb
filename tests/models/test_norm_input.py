"""`models.norm_input.norm_into_group`: the decoder layer asks the attention projections' backend for the input norm
and the W4A4 quantization at once (`Backend.norm_quantize_input`) and hands the quantized input to `shared_input`.
On CPU the fp4 backend does not fuse (its kernel is GPU-only: tests/kernels/test_rmsnorm_quantize.py, and the engine
A/B in tests/engine/test_norm_quantize_gpu.py), so a CPU stand-in for the backend method (the torch norm, then
`quantize_input`) checks the plumbing: same logits with the switch on and off, nvfp4 (q/k/v apart) and mxfp4 (one
stacked qkv_proj), activation hooks see the same x, h not produced when nothing hooks it; the same for the MLP input
(post_attention_layernorm -> gate/up: [gate_proj, up_proj] for nvfp4, one gate_up_proj for mxfp4), with the SiLU x
mul / stacked-epilogue fusions after it still taken (their CPU stand-ins)."""

import pytest
import torch

from trace_rl.backends import get_backend
from trace_rl.kernels.rmsnorm import add_rms_norm_reference
from trace_rl.models import build, norm_input, preset
from trace_rl.models.linear import shared_input, w4a4_group
from trace_rl.plan import PrecisionPlan


def _rollout(plan_name):
    model = build(preset("tiny"), dtype=torch.float32, plan=PrecisionPlan.preset(plan_name))
    model.init_random(generator=torch.Generator().manual_seed(0))
    return model.to_rollout()


def _stand_in(calls):
    """A CPU `norm_quantize_input` with the contract of the fp4 backend's kernel version."""
    def fused(self, x, residual, weight, eps, packed, act_fmt, keep_h=True):
        calls.append(keep_h)
        h, r = add_rms_norm_reference(x, residual, weight, eps)
        return (h if keep_h else None), r, self.quantize_input(h, packed, act_fmt)
    return fused


@pytest.mark.parametrize("plan", ["w4a4-kv4", "w4a4-kv4-mx"])
def test_fused_norm_same_logits_and_hooks(plan, monkeypatch):
    model = _rollout(plan)
    attn = model.model.layers[0].self_attn
    assert (attn.qkv_proj is None) == (plan == "w4a4-kv4")           # nvfp4 apart, mxfp4 stacked
    backend = get_backend("fp4")
    calls = []
    monkeypatch.setattr(type(backend), "norm_quantize_input", _stand_in(calls))
    tokens = torch.randint(0, 128, (3, 9), generator=torch.Generator().manual_seed(1))
    hooked = attn.input_projections()[-1]
    seen = []
    hooked.activation_hook = lambda layer, x: seen.append(x.clone())
    n = len(model.model.layers)
    with torch.no_grad():
        fused = model(tokens)
        assert calls == [True] + [False] * (2 * n - 1)               # attention + MLP input per layer; h kept
                                                                      # only for the hooked layer
        monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", False)
        separate = model(tokens)
    assert len(calls) == 2 * n and len(seen) == 2
    assert torch.equal(seen[0], seen[1])
    assert torch.equal(fused, separate)


def test_trainer_w4a16_and_unfused_norms_do_not_ask(monkeypatch):
    calls = []
    backend = get_backend("fp4")
    monkeypatch.setattr(type(backend), "norm_quantize_input", _stand_in(calls))
    tokens = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    trainer = build(preset("tiny"), dtype=torch.float32, plan=PrecisionPlan.preset("w4a4-kv4"))
    trainer.init_random(generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trainer(tokens)                                               # trainer stage: no QuantLinear
        _rollout("w4a16")(tokens)                                     # W4A16: nothing to quantize
    assert not calls


def test_fp4_backend_does_not_fuse_off_the_kernels():
    model = _rollout("w4a4-kv4")
    layer = model.model.layers[0]
    first = w4a4_group(layer.self_attn.input_projections())
    x = torch.randn(2, 3, model.config.hidden_size)
    assert first.backend.norm_quantize_input(x, None, layer.input_layernorm.weight, 1e-6, first.packed,
                                             first.act_fmt) is None


def test_shared_input_rejects_a_quantized_input_for_another_group():
    model = _rollout("w4a16")
    attn = model.model.layers[0].self_attn
    with pytest.raises(ValueError, match="do not share one W4A4"):
        shared_input(attn.input_projections(), torch.zeros(1, 1, model.config.hidden_size), xq=object())


@pytest.mark.parametrize("plan", ["w4a4-kv4", "w4a4-kv4-mx"])
def test_fused_mlp_norm_same_logits_and_hooks(plan, monkeypatch):
    """The MLP input: a hook on its last input projection keeps h for that norm only (every layer's attention
    norm and the other MLP norms drop it), the hook sees the same x and the logits equal the switch off."""
    model = _rollout(plan)
    mlp = model.model.layers[1].mlp
    assert (mlp.gate_up_proj is None) == (plan == "w4a4-kv4")          # nvfp4 apart, mxfp4 stacked
    assert mlp.input_projections() == ([mlp.gate_proj, mlp.up_proj] if plan == "w4a4-kv4" else [mlp.gate_up_proj])
    calls = []
    monkeypatch.setattr(type(get_backend("fp4")), "norm_quantize_input", _stand_in(calls))
    tokens = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(3))
    seen = []
    mlp.input_projections()[-1].activation_hook = lambda layer, x: seen.append(x.clone())
    n = len(model.model.layers)
    with torch.no_grad():
        fused = model(tokens)
        assert calls == [False, False, False, True] + [False] * (2 * n - 4)   # layer 1's MLP norm is call 4
        monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", False)
        separate = model(tokens)
    assert len(calls) == 2 * n and len(seen) == 2 and torch.equal(seen[0], seen[1])
    assert torch.equal(fused, separate)


def test_fused_mlp_norm_keeps_the_silu_and_epilogue_fusions(monkeypatch):
    """nvfp4 gate/up with the norm's quantized input: the stacked-epilogue SiLU quantize (its stand-in: the stacked
    outputs, torch's SiLU x mul, `quantize_input`) runs once per layer, and the logits equal every switch off."""
    from trace_rl.models import decoder

    model = _rollout("w4a4-kv4")
    backend = type(get_backend("fp4"))
    calls, fused = [], []

    def stacked_silu(self, xq, packeds, down, act_fmt):
        fused.append(xq.shape)
        gate, up = (self.linear_quantized(xq, p) for p in packeds)
        return self.quantize_input(torch.nn.functional.silu(gate) * up, down, act_fmt)

    monkeypatch.setattr(backend, "norm_quantize_input", _stand_in(calls))
    monkeypatch.setattr(backend, "linear_stacked_silu_mul_quantize", stacked_silu)
    tokens = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(4))
    n = len(model.model.layers)
    with torch.no_grad():
        on = model(tokens)
        assert len(fused) == n and len(calls) == 2 * n
        monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", False)
        monkeypatch.setattr(decoder, "FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE", False)
        off = model(tokens)
    assert len(fused) == n and len(calls) == 2 * n
    assert torch.equal(on, off)
