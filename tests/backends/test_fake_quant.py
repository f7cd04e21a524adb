"""Trainer-side fake quantization: forward equals the format's reference exactly, gradient is straight-through."""

import pytest
import torch

from trace_rl.backends import get_backend
from trace_rl.formats import get_format, per_token


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
