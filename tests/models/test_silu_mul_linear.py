"""`models.linear.silu_mul_linear` in the rollout MLP (`decoder.FUSE_ROLLOUT_SILU_QUANTIZE`): where the stacked
gate/up GEMM gives gate | up as one buffer, the SiLU x mul goes into the down projection's W4A4 input quantization.
On CPU the fp4 backend emulates and neither stacks nor fuses, so this test stands both in (the stack: the parts'
outputs concatenated; the fused quantize: `quantize_input` of torch's product) to check the wiring: the fused path
runs once per layer, the logits equal the switch off, an activation hook on the down projection keeps the product
path (it reads the product). The kernels' bits: tests/kernels/test_silu_exact_gpu.py (engine A/B included)."""

import torch
import torch.nn.functional as F

from trace_rl.backends import get_backend
from trace_rl.models import build, decoder, linear, preset
from trace_rl.models.linear import shared_input_joined
from trace_rl.plan import PrecisionPlan


def _rollout(plan: str = "w4a4-kv4"):
    model = build(preset("tiny"), dtype=torch.float32, plan=PrecisionPlan.preset(plan))
    model.init_random(generator=torch.Generator().manual_seed(0))
    return model.to_rollout()


def _stand_ins(monkeypatch):
    backend = type(get_backend("fp4"))
    fused = []

    def linear_stacked(self, xq, packeds, biases=None):
        return torch.cat([self.linear_quantized(xq, p, b) for p, b in zip(packeds, biases)], dim=-1)

    def quantize_silu_mul_input(self, gate_up, packed, act_fmt):
        fused.append(gate_up.shape)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.quantize_input(F.silu(gate) * up, packed, act_fmt)

    monkeypatch.setattr(backend, "linear_stacked", linear_stacked)
    monkeypatch.setattr(backend, "quantize_silu_mul_input", quantize_silu_mul_input)
    monkeypatch.setattr(linear, "SILU_QUANTIZE_MIN_ROWS", 1)     # the tiny batches here: fused at every M
    return fused


def test_fused_silu_quantize_wiring_same_logits(monkeypatch):
    model = _rollout()
    mlp = model.model.layers[0].mlp
    assert mlp.gate_up_proj is None                         # nvfp4: gate/up apart, shared_input runs them
    fused = _stand_ins(monkeypatch)
    tokens = torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(1))
    n = len(model.model.layers)
    with torch.no_grad():
        joined = shared_input_joined([mlp.gate_proj, mlp.up_proj], torch.randn(2, mlp.gate_proj.in_features))
        assert isinstance(joined, torch.Tensor) and joined.shape == (2, 2 * mlp.gate_proj.out_features)
        on = model(tokens)
        assert len(fused) == n and fused[0][-1] == 2 * mlp.down_proj.in_features
        monkeypatch.setattr(decoder, "FUSE_ROLLOUT_SILU_QUANTIZE", False)
        off = model(tokens)
        assert len(fused) == n
        monkeypatch.setattr(decoder, "FUSE_ROLLOUT_SILU_QUANTIZE", True)
        seen = []
        mlp.down_proj.activation_hook = lambda layer, x: seen.append(x.shape)
        hooked = model(tokens)
    assert torch.equal(on, off) and torch.equal(on, hooked)
    assert len(fused) == 2 * n - 1 and seen == [(3, 7, mlp.down_proj.in_features)]


def test_emulated_backend_does_not_fuse():
    """Without the stand-ins (CPU, emulated): shared_input_joined gives the parts apart and the backend's
    quantize_silu_mul_input says None (the caller runs SiLU, multiply, linear)."""
    model = _rollout()
    mlp = model.model.layers[0].mlp
    x = torch.randn(2, mlp.gate_proj.in_features)
    with torch.no_grad():
        parts = shared_input_joined([mlp.gate_proj, mlp.up_proj], x)
        q = mlp.down_proj.quant
        assert isinstance(parts, list) and len(parts) == 2
        assert q.backend.quantize_silu_mul_input(torch.cat(parts, -1), q.packed, q.act_fmt) is None


def test_stacked_epilogue_fusion_wiring(monkeypatch):
    """`decoder.FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE` (the stacked GEMM's epilogue fused into the SiLU x mul quantize,
    `Backend.linear_stacked_silu_mul_quantize`; stood in on CPU): taken once per layer, before the stacked GEMM +
    `silu_mul_linear`; not with an activation hook on the down projection (it reads the product); same logits as
    with it off (then the SiLU-only fusion runs)."""
    model = _rollout()
    mlp = model.model.layers[0].mlp
    fused = _stand_ins(monkeypatch)
    epilogue = []

    def stacked_silu(self, xq, packeds, down, act_fmt):
        epilogue.append(xq.shape)
        gate, up = (self.linear_quantized(xq, p) for p in packeds)
        return self.quantize_input(F.silu(gate) * up, down, act_fmt)

    monkeypatch.setattr(type(get_backend("fp4")), "linear_stacked_silu_mul_quantize", stacked_silu)
    tokens = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(5))
    n = len(model.model.layers)
    with torch.no_grad():
        on = model(tokens)
        assert len(epilogue) == n and not fused
        monkeypatch.setattr(decoder, "FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE", False)
        off = model(tokens)
        assert len(epilogue) == n and len(fused) == n
        monkeypatch.setattr(decoder, "FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE", True)
        mlp.down_proj.activation_hook = lambda layer, x: None
        hooked = model(tokens)
    assert len(epilogue) == 2 * n - 1
    assert torch.equal(on, off) and torch.equal(on, hooked)


def test_stacked_gate_up_fuses_silu_quantize(monkeypatch):
    """mxfp4 stacks gate/up into one Linear (`gate_up_proj`): its SiLU x mul goes into the down projection's
    quantize too (it used to run silu_mul, then a separate quantize), once per layer, the same logits as off."""
    model = _rollout("w4a4-kv4-mx")
    mlp = model.model.layers[0].mlp
    assert mlp.gate_up_proj is not None
    fused = _stand_ins(monkeypatch)
    tokens = torch.randint(0, 128, (3, 7), generator=torch.Generator().manual_seed(2))
    n = len(model.model.layers)
    with torch.no_grad():
        on = model(tokens)
        assert len(fused) == n and fused[0][-1] == 2 * mlp.down_proj.in_features
        monkeypatch.setattr(decoder, "FUSE_ROLLOUT_SILU_QUANTIZE", False)
        off = model(tokens)
    assert len(fused) == n and torch.equal(on, off)


def test_small_batches_keep_the_two_launches(monkeypatch):
    """Below SILU_QUANTIZE_MIN_ROWS rows the fused SiLU x mul quantize loses to silu_mul + the quantize (measured,
    models/linear.py): silu_mul_linear says None there, at and above it fuses."""
    _stand_ins(monkeypatch)
    monkeypatch.setattr(linear, "SILU_QUANTIZE_MIN_ROWS", 64)
    model = _rollout()
    down = model.model.layers[0].mlp.down_proj
    with torch.no_grad():
        assert linear.silu_mul_linear(down, torch.randn(63, 2 * down.in_features)) is None
        y = linear.silu_mul_linear(down, torch.randn(2, 32, 2 * down.in_features))
    assert y is not None and y.shape == (2, 32, down.out_features)
