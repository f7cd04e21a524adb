"""The fused SiLU x mul (`kernels.swiglu`) and its W4A4 quantize form (`row_quantize.quantize_dequant_bf16(silu_mul=
True)`) under the CPU Triton interpreter, at odd shapes. The interpreter has no libdevice, so the exact form runs its
stand-in there (`tl.exp` + div_rn, `swiglu.silu_launch_args`), and its float32 -> bf16 casts truncate: these tests
check the kernels' structure (halves, masks, rounding steps, the fused quantize == quantize of the product) against
torch references that model those two interpreter facts. Torch's CUDA bits, bit for bit, are a GPU property:
tests/kernels/test_silu_exact_gpu.py."""

from __future__ import annotations

import pytest
import torch

from trace_rl.kernels import interpreting, swiglu
from trace_rl.kernels.row_quantize import quantize_dequant_bf16

pytestmark = pytest.mark.skipif(not interpreting(), reason="CPU interpreter tests (the GPU's: *_gpu.py)")


def _truncate_bf16(x: torch.Tensor) -> torch.Tensor:
    """float32 -> bf16 as the interpreter casts (towards zero; NaN stays NaN), back as float32."""
    bits = x.view(torch.int32) & ~0xFFFF
    return torch.where(x.isnan(), x, bits.view(torch.float32))


def interpreted_silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """`F.silu(g) * u` as the interpreted kernel rounds it: silu in float32 (torch's exp for numpy's: they may
    differ in the last float32 bit), truncated to bf16, times u in float32, truncated again."""
    g, u = gate_up.float().chunk(2, dim=-1)
    s = _truncate_bf16(g / (1.0 + torch.exp(-g)))
    return _truncate_bf16(s * u).to(gate_up.dtype)


def _bf16_ulp_apart(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|bits(a) - bits(b)| for bf16 values of one sign (finite), as int."""
    return (a.view(torch.int16).int() - b.view(torch.int16).int()).abs()


@pytest.mark.parametrize("rows,i", [(1, 5), (3, 33), (7, 48)])
@pytest.mark.parametrize("exact", [True, False])
def test_silu_mul_interpreted_matches_reference(rows, i, exact, monkeypatch, rng):
    monkeypatch.setattr(swiglu, "EXACT_SILU", exact)
    x = (torch.randn(rows, 2 * i, generator=rng) * 6).to(torch.bfloat16)
    x[0, 0], x[0, i] = -0.0, 3.0                                    # -0 gate
    out = swiglu.silu_mul(x)
    assert out.shape == (rows, i) and out.dtype == torch.bfloat16
    want = interpreted_silu_mul_reference(x)
    apart = _bf16_ulp_apart(out, want)
    assert int(apart.max()) <= 1 and float((apart == 0).float().mean()) > 0.95, apart
    if exact:   # the stand-in's rounding steps are torch's (two casts); only exp's last float32 bit may differ
        torch.testing.assert_close(out.float(), swiglu.silu_mul_reference(x).float(), atol=0, rtol=2 ** -6)


def test_silu_mul_interpreted_special_values():
    """inf, -inf, NaN, -0, huge and subnormal gates: where torch's product is NaN / inf / zero, so is the kernel's."""
    g = torch.tensor([float("inf"), float("-inf"), float("nan"), -0.0, 0.0, 1e30, -1e30, 88.0, -88.0, 1e-40, -1e-40,
                      100.0, -100.0], dtype=torch.float32).to(torch.bfloat16)
    u = torch.full_like(g, 2.0)
    x = torch.cat([g, u])[None]
    out, want = swiglu.silu_mul(x)[0].float(), swiglu.silu_mul_reference(x)[0].float()
    assert torch.equal(out.isnan(), want.isnan()) and torch.equal(out.isinf(), want.isinf())
    finite = want.isfinite()
    assert torch.equal(out[finite] == 0, want[finite] == 0)
    assert torch.equal(out[finite].sign(), want[finite].sign())


def test_silu_launch_args_under_the_interpreter(monkeypatch):
    """The interpreter cannot run libdevice: EXACT_SILU takes its stand-in; off, the fast form."""
    assert swiglu.silu_launch_args() == dict(SILU_EXACT=False, SILU_INTERP=True, enable_fp_fusion=True)
    monkeypatch.setattr(swiglu, "EXACT_SILU", False)
    assert swiglu.silu_launch_args() == dict(SILU_EXACT=False, SILU_INTERP=False, enable_fp_fusion=True)


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("rows,i", [(3, 96), (1, 32)])
def test_fused_quantize_equals_quantize_of_the_product(fmt, rows, i, rng):
    """quantize_dequant_bf16(gate | up, silu_mul=True) == quantize_dequant_bf16(silu_mul(gate | up)), bit for bit:
    the same product (the same SiLU form) then the same quantization."""
    x = (torch.randn(rows, 2 * i, generator=rng) * 3).to(torch.bfloat16)
    fused, fused_scale = quantize_dequant_bf16(x, fmt, silu_mul=True)
    apart, apart_scale = quantize_dequant_bf16(swiglu.silu_mul(x), fmt)
    assert torch.equal(fused, apart)
    assert (fused_scale is None) == (fmt == "mxfp4") and (fused_scale is None or torch.equal(fused_scale, apart_scale))
