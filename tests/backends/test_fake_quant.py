"""Trainer-side fake quantization: forward equals the format's reference exactly, gradient is straight-through."""

import pytest
import torch

from trace_rl.backends import backend_for_format, get_backend
from trace_rl.backends.fake_quant import kernel_unavailable
from trace_rl.formats import get_format, per_token
from trace_rl.models.presets import tiny_model
from trace_rl.plan import PrecisionPlan


@pytest.mark.parametrize("backend,fmt", [("fp4", "nvfp4"), ("fp4", "mxfp4"), ("fp8", "fp8_e4m3:row")])
def test_fake_quantize_forward_and_straight_through_grad(backend, fmt, rng):
    x = torch.randn(7, 64, generator=rng, requires_grad=True)
    y = get_backend(backend).fake_quantize(x, fmt)
    assert torch.equal(y.detach(), get_format(per_token(fmt)).fake_quantize(x.detach()))
    g = torch.randn(7, 64, generator=rng)
    (y * g).sum().backward()
    assert torch.equal(x.grad, g)


def test_fake_quantize_weight_straight_through(rng):
    w = torch.randn(16, 32, generator=rng, requires_grad=True)
    y = get_backend("fp4").fake_quantize_weight(w, "nvfp4")
    assert torch.equal(y.detach(), get_format("nvfp4").fake_quantize(w.detach()))
    y.sum().backward()
    assert torch.equal(w.grad, torch.ones_like(w))


def test_bf16_fake_quantize_is_identity():
    x = torch.randn(3, 16, requires_grad=True)
    assert get_backend("bf16").fake_quantize(x, "bf16") is x


def test_nan_survives_fake_quantize():
    x = torch.randn(2, 32)
    x[0, 3] = float("nan")
    y = get_backend("fp4").fake_quantize(x, "nvfp4")
    assert torch.isnan(y[0, :16]).all() and torch.isfinite(y[1]).all()


# -- which path ran, the weight cache (once per optimizer step), one quantization per shared input --

def test_cpu_runs_the_reference_and_says_so(rng):
    backend = get_backend("fp4")
    before = backend.paths.counts["fp4.fake_quantize.reference"]
    backend.fake_quantize(torch.randn(3, 32, generator=rng), "nvfp4")
    assert backend.paths.counts["fp4.fake_quantize.reference"] == before + 1
    assert "CPU" in kernel_unavailable(torch.zeros(1, 16), "nvfp4:row")


def _tiny_trainer(plan: str, dtype=torch.float32):
    model, _ = tiny_model("tiny", seed=0, dtype=dtype)
    return model.apply_plan(PrecisionPlan.preset(plan))


@pytest.mark.parametrize("plan", ["fp4-aligned", "fp8-aligned"])
@pytest.mark.usefixtures("one_torch_thread")
def test_weights_fake_quantized_once_per_optimizer_step(plan, rng):
    """Three micro-batches per step, two steps: every quantized weight is fake-quantized once per step,
    and the losses and gradients equal those of a run whose cache is cleared before every forward."""
    plan_obj = (PrecisionPlan.preset("fp8").model_copy(update={"trainer": "aligned"}) if plan == "fp8-aligned"
                else PrecisionPlan.preset(plan))
    cached, uncached = (tiny_model("tiny", seed=0)[0].apply_plan(plan_obj) for _ in range(2))
    opts = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (cached, uncached)]
    backend = backend_for_format(plan_obj.rollout_weights)
    quantized = [lin for lin in cached.linears().values() if lin.weight_fmt != "bf16"]
    tokens = torch.randint(0, cached.config.vocab_size, (3, 2, 9), generator=rng)
    for _step in range(2):
        for opt in opts:
            opt.zero_grad()
        start = backend.weight_cache.quantizations
        for micro in tokens:
            cached(micro).float().logsumexp(-1).mean().backward()
        assert backend.weight_cache.quantizations - start == len(quantized)
        for micro in tokens:
            backend.weight_cache.clear()
            uncached(micro).float().logsumexp(-1).mean().backward()
        for a, b in zip(cached.parameters(), uncached.parameters()):
            assert torch.equal(a.grad, b.grad)
        for opt in opts:
            opt.step()
    assert backend.paths.counts[f"{backend.name}.fake_quantize_weight.cached"] > 0


def test_in_place_update_invalidates_the_cached_weight(rng):
    backend = get_backend("fp4")
    w = torch.nn.Parameter(torch.randn(16, 32, generator=rng))
    first = backend.fake_quantize_weight(w, "nvfp4")
    assert torch.equal(backend.fake_quantize_weight(w, "nvfp4"), first)
    with torch.no_grad():
        w.mul_(3.0)
    assert torch.equal(backend.fake_quantize_weight(w, "nvfp4").detach(),
                       get_format("nvfp4").fake_quantize(w.detach()))


def test_fp8_block_weights_use_the_rollouts_128x128_blocks(rng):
    backend = get_backend("fp8")
    w = torch.randn(256, 256, generator=rng) * torch.linspace(0.1, 10, 256)[:, None]
    got = backend.fake_quantize_weight(w, "fp8_e4m3:block")
    assert torch.equal(got, backend.prepare_weight(w, "fp8_e4m3:block").dequantized())


def test_shared_input_is_quantized_once_and_gradients_add_up(rng):
    backend = get_backend("fp4")
    x = torch.randn(4, 64, generator=rng, requires_grad=True)
    before = backend.paths.counts["fp4.fake_quantize.reference"]
    outs = [backend.fake_quantize(x, "nvfp4") for _ in range(3)]     # q, k, v
    assert backend.paths.counts["fp4.fake_quantize.reference"] == before + 1
    assert outs[0] is outs[1] is outs[2]
    sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    assert torch.equal(x.grad, torch.full_like(x, 6.0))
    with torch.no_grad():
        x.add_(1.0)                                                  # a new version: quantized again
    backend.fake_quantize(x, "nvfp4")
    assert backend.paths.counts["fp4.fake_quantize.reference"] == before + 2


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,act", [("nvfp4", "nvfp4"), ("mxfp4", "mxfp4"), ("fp8_e4m3:row", "fp8_e4m3:row")])
def test_gpu_runs_the_kernels_bit_exact(fmt, act, rng):
    backend = backend_for_format(fmt)
    x = torch.randn(33, 4, 256, generator=rng).bfloat16()
    w = torch.nn.Parameter(torch.randn(96, 256, generator=rng).bfloat16().cuda())
    xq = backend.fake_quantize(x.cuda().requires_grad_(True), act)
    assert backend.paths.last == f"{backend.name}.fake_quantize.triton"
    assert torch.equal(xq.detach().cpu(), get_format(per_token(act)).fake_quantize(x))
    wq = backend.fake_quantize_weight(w, fmt)
    assert backend.paths.last == f"{backend.name}.fake_quantize_weight.triton"
    assert torch.equal(wq.detach().cpu(), get_format(fmt).fake_quantize(w.detach().cpu()))
