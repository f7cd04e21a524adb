"""Transformer Engine on a GPU: probe, recipes, te.Linear forward/backward against float64, and codes.

Bounds as in test_fp8_gpu.py: 4e-3 against the same FP8 operands in float64, 8% against the unquantized
product for forward (E4M3), 15% for gradients (`delayed`/`current` use TE's HYBRID format: E5M2 gradients,
2 mantissa bits).
"""

import pytest
import torch

from trace_rl.backends import te_adapter
from trace_rl.backends.fp8 import FP8Backend, FP8Config, FP8PathError
from trace_rl.formats import get_format

pytestmark = [pytest.mark.gpu, pytest.mark.te, pytest.mark.skipif(
    not torch.cuda.is_available() or not te_adapter.probe().available,
    reason=f"needs Transformer Engine on a GPU: {te_adapter.probe().reason}")]

CUDA = torch.device("cuda")


def _rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def test_probe_on_hopper():
    s = te_adapter.probe()
    assert s.available and s.version and s.device_capability >= (8, 9)
    assert set(s.supported_recipes()) >= {"delayed", "current", "block"}
    if s.device_capability < (10, 0):
        for r in ("mxfp8", "nvfp4"):
            assert "Blackwell" in s.why_not(r)
            with pytest.raises(te_adapter.TEUnavailableError, match="Blackwell"):
                te_adapter.make_recipe(r)
    print("TE probe:", s.as_dict())


@pytest.mark.parametrize("recipe", ["delayed", "current", "block"])
def test_te_linear_forward_and_backward_against_float64(recipe):
    torch.manual_seed(11)
    m, k, n = 48, 384, 256
    w = torch.randn(n, k, device=CUDA) * 0.05
    x = torch.randn(m, k, device=CUDA, dtype=torch.bfloat16, requires_grad=True)
    mod = te_adapter.TELinear(w, recipe=recipe)
    calls = 3 if recipe == "delayed" else 1  # delayed scaling's first call uses scale 1 (no history yet)
    for _ in range(calls):
        y = mod(x)
    g = torch.randn_like(y)
    y.backward(g)
    xd, wd, gd = x.detach().double(), mod.linear.weight.detach().double(), g.double()
    e_fwd = _rel(y, xd @ wd.T)
    e_dx = _rel(x.grad, gd @ wd)
    e_dw = _rel(mod.linear.weight.grad, gd.T @ xd) if mod.linear.weight.grad is not None else float("nan")
    print(f"te.{recipe}: fwd {e_fwd:.2e} dx {e_dx:.2e} dW {e_dw:.2e}")
    assert e_fwd < 8e-2 and e_dx < 1.5e-1 and e_dw < 1.5e-1


@pytest.mark.parametrize("role,fmt", [("input", "fp8_e4m3:block"), ("weight", "fp8_e4m3:block128x128")])
def test_te_block_codes_equal_the_formats_reference(role, fmt):
    torch.manual_seed(5)
    x = torch.randn(256, 512, device=CUDA) * torch.logspace(-3, 3, 256, device=CUDA)[:, None]
    te_q = te_adapter.te_quantize(x, "block", role)
    ref = get_format(fmt).quantize(x)
    a, b = te_q.codes.view(torch.uint8).int(), ref.codes.view(torch.uint8).int()
    same = (a == b).float().mean().item()
    deq = _rel(te_q.dequantized, ref.dequantize().double())
    print(f"TE block {role}: codes equal {same:.7f}, dequantized rel diff {deq:.1e}")
    # TE computes x * (448/amax), the reference x / (amax/448): a value on a rounding midpoint may land
    # on either neighbour (measured: 1 weight code in 16.8 M). Anything more is a real disagreement.
    assert same >= 1 - 1e-5
    same_sign = (a >> 7) == (b >> 7)
    assert (a - b)[same_sign].abs().max().item() <= 1, "codes more than one step apart"
    assert deq < 1e-5


def test_trainer_and_rollout_agree_on_te_block_codes_but_not_on_current():
    """Trainer: the whole sequence in one call; rollout: one token per decode step. Block scales depend on
    the token only, so the codes agree; `current` scales per tensor, so they do not."""
    torch.manual_seed(7)
    t, k = 32, 256
    x = torch.randn(t, k, device=CUDA) * torch.logspace(-1, 1, t, device=CUDA)[:, None]
    for recipe, agree in (("block", True), ("current", False)):
        trainer = te_adapter.te_quantize(x, recipe).codes.view(torch.uint8)
        rollout = torch.cat([te_adapter.te_quantize(x[i:i + 1], recipe).codes for i in range(t)]).view(torch.uint8)
        assert torch.equal(trainer, rollout) == agree, recipe


def test_fp8_backend_te_path_matches_the_reference_and_reports_it():
    torch.manual_seed(13)
    m, k, n = 5, 384, 256
    w = torch.randn(n, k, device=CUDA) * 0.05
    x = torch.randn(m, k, device=CUDA, dtype=torch.bfloat16)
    backend = FP8Backend(FP8Config(impl="te", te_recipe="block"))
    packed = backend.prepare_weight(w, "fp8_e4m3:block")
    y = backend.linear(x, packed, "fp8_e4m3:block")
    assert backend.paths.last == "fp8.te.block" and backend.fallbacks == []
    ref = (get_format("fp8_e4m3:block").quantize(x.float()).dequantize().double()
           @ packed.dequantized().double().T)
    e = _rel(y, ref)
    print(f"fp8 backend te.block vs reference operands: {e:.2e}")
    assert e < 4e-3
    # auto takes TE for block formats, since the block recipe reproduces them
    auto = FP8Backend(FP8Config(te_recipe="block"))
    auto.linear(x, packed, "fp8_e4m3:block")
    assert auto.paths.last == "fp8.te.block"


def test_te_with_formats_its_recipe_does_not_produce_is_refused_or_falls_back():
    w = torch.randn(64, 128, device=CUDA)
    x = torch.randn(3, 128, device=CUDA)
    strict = FP8Backend(FP8Config(impl="te", te_recipe="block"))
    with pytest.raises(FP8PathError, match="recipe 'block' quantizes weights as"):
        strict.linear(x, strict.prepare_weight(w, "fp8_e4m3:row"), "fp8_e4m3:row")
    lenient = FP8Backend(FP8Config(impl="te", te_recipe="block", allow_fallback=True))
    lenient.linear(x, lenient.prepare_weight(w, "fp8_e4m3:row"), "fp8_e4m3:row")
    assert lenient.paths.last == "fp8.scaled_mm.rowwise"
    assert [(f.wanted, f.used) for f in lenient.fallbacks] == [("te", "scaled_mm")]


def test_rollout_te_linear_reloads_weights_in_place():
    torch.manual_seed(17)
    w1, w2 = (torch.randn(128, 256, device=CUDA) * 0.05 for _ in range(2))
    x = torch.randn(3, 256, device=CUDA, dtype=torch.bfloat16)
    mod = te_adapter.TELinear(w1, recipe="current")
    with torch.no_grad():
        y1, y1_cached = mod(x), mod(x)
        ptr = mod.linear.weight.data_ptr()
        mod.load_weight(w2)
        y2 = mod(x)
        fresh = te_adapter.TELinear(w2, recipe="current")(x)
    assert torch.equal(y1, y1_cached)
    assert mod.linear.weight.data_ptr() == ptr
    assert torch.equal(y2, fresh), "the cached FP8 weight must be re-cast after load_weight"
