"""QuantLinear and the emulated backends against dequantize-then-matmul in float64."""

import pytest
import torch

from tests.conftest import BACKEND_FORMATS
from trace_rl.backends import QuantLinear, get_backend
from trace_rl.formats import get_format, per_token


@pytest.mark.parametrize("m", [1, 3, 17])
def test_quant_linear_equals_float64_reference(backend_name, m, rng):
    w_fmt, a_fmt = BACKEND_FORMATS[backend_name]
    k, n = 64, 48
    w, x, b = torch.randn(n, k, generator=rng), torch.randn(m, k, generator=rng), torch.randn(n, generator=rng)
    layer = QuantLinear(w, w_fmt, a_fmt, bias=b)
    y = layer(x)
    wq = w if w_fmt == "bf16" else get_format(w_fmt).fake_quantize(w)
    xq = x if a_fmt == "bf16" else get_format(per_token(a_fmt)).fake_quantize(x)
    ref = xq.double() @ wq.double().T + b.double()
    assert ((y.double() - ref).norm() / ref.norm()).item() <= 1e-6
    assert get_backend(layer.backend.name).paths.last is not None


@pytest.mark.parametrize("w_fmt,a_fmt", [("nvfp4", "bf16"), ("mxfp4", "mxfp4"), ("fp8_e4m3:tensor", "fp8_e4m3:tensor")])
def test_w4a16_w4a4_w8_combinations(w_fmt, a_fmt, rng):
    w, x = torch.randn(32, 96, generator=rng), torch.randn(5, 96, generator=rng)
    y = QuantLinear(w, w_fmt, a_fmt)(x)
    xq = x if a_fmt == "bf16" else get_format(per_token(a_fmt)).fake_quantize(x)
    ref = xq.double() @ get_format(w_fmt).fake_quantize(w).double().T
    assert ((y.double() - ref).norm() / ref.norm()).item() <= 1e-6


def test_load_weight_requantizes_in_place(backend_name, rng):
    w_fmt, a_fmt = BACKEND_FORMATS[backend_name]
    layer = QuantLinear(torch.randn(16, 32, generator=rng), w_fmt, a_fmt)
    ptrs = [b.data_ptr() for b in layer.buffers()]
    w2 = torch.randn(16, 32, generator=rng)
    x = torch.randn(2, 32, generator=rng)
    layer(x)  # populate the emulation cache, which must be invalidated
    layer.load_weight(w2)
    assert [b.data_ptr() for b in layer.buffers()] == ptrs
    fresh = QuantLinear(w2, w_fmt, a_fmt)
    assert torch.equal(layer(x), fresh(x))
    with pytest.raises(ValueError, match="shape"):
        layer.load_weight(torch.randn(8, 32))


def test_state_dict_carries_the_packed_weight(rng):
    layer = QuantLinear(torch.randn(16, 32, generator=rng), "nvfp4", "nvfp4")
    keys = set(layer.state_dict())
    assert {"w_codes", "w_scales", "w_global_scale"} <= keys


def test_mismatched_activation_format_is_an_error():
    with pytest.raises(ValueError, match="W4A4"):
        QuantLinear(torch.randn(16, 32), "nvfp4", "mxfp4")(torch.randn(1, 32))
    with pytest.raises(ValueError, match="fp8 or fp4 backend"):
        QuantLinear(torch.randn(16, 32), "bf16", "nvfp4")(torch.randn(1, 32))
