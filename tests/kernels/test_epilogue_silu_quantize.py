"""`kernels.epilogue_silu_quantize`: the stacked gate/up GEMM's FP4 epilogue fused into the SiLU x mul W4A4 quantize,
at tiny odd shapes under the CPU Triton interpreter: bit-identical to the two launches it replaces (the epilogue
kernel, `fp4_dequant.factor_matmul`'s, then `quantize_dequant_bf16(silu_mul=True)`), both interpreted (so both take
the interpreter's SiLU stand-in and its bf16 casts), with and without a row scale (nvfp4:row / mxfp4), NaN rows and
masked tails. Against the torch reference (torch's SiLU and casts) where the interpreter's stand-ins cannot differ
(rows whose gate is 0). The GPU's bits: tests/kernels/test_epilogue_silu_quantize_gpu.py."""

from __future__ import annotations

import pytest
import torch

from trace_rl.kernels import interpreting
from trace_rl.kernels.epilogue_silu_quantize import (
    epilogue_silu_mul_quantize,
    epilogue_silu_mul_quantize_reference,
    fuses,
)
from trace_rl.kernels.fp4_dequant import _epilogue_kernel
from trace_rl.kernels.row_quantize import quantize_dequant_bf16

pytestmark = pytest.mark.skipif(not interpreting(), reason="CPU interpreter tests (the GPU's: *_gpu.py)")


def _apart(y, rf, row_scale, fmt):
    """The two launches the fused kernel replaces: the FP4 epilogue kernel (factor_matmul's) writing bf16 gate | up,
    then the SiLU x mul quantize."""
    import triton

    from trace_rl.kernels.fp4_dequant import EPI_BM, EPI_BN

    m, n = y.shape
    out = torch.empty(m, n, dtype=torch.bfloat16)
    _epilogue_kernel[(triton.cdiv(m, EPI_BM), triton.cdiv(n, EPI_BN))](
        y, rf, row_scale if row_scale is not None else rf, rf, out, m, n, y.stride(0), out.stride(0),
        HAS_ROW_SCALE=row_scale is not None, HAS_BIAS=False, BM=EPI_BM, BN=EPI_BN, num_warps=4)
    return quantize_dequant_bf16(out, fmt, silu_mul=True)


def _inputs(m, k, rng, fmt):
    y = torch.randn(m, 2 * k, generator=rng) * 40
    rf = (torch.rand(2 * k + 3, generator=rng) + 0.5) * 2.0 ** -6       # extra factors past 2K: not read
    rs = (torch.rand(m, generator=rng) + 0.25) * 0.01 if fmt == "nvfp4:row" else None
    return y, rf, rs


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("m,k", [(1, 96), (5, 160), (3, 224)])
def test_fused_equals_epilogue_then_silu_quantize(fmt, m, k, rng):
    y, rf, rs = _inputs(m, k, rng, fmt)
    if m > 2:
        y[1, 3] = float("nan")                                  # a NaN gate: its block is NaN in both
        y[2, k + 7] = float("inf")
    got, got_rs = epilogue_silu_mul_quantize(y, rf, rs, fmt)
    want, want_rs = _apart(y, rf, rs, fmt)
    assert got.shape == (m, k) and got.dtype == torch.bfloat16
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert (got_rs is None) == (fmt == "mxfp4") and (got_rs is None or torch.equal(got_rs, want_rs))


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
def test_fused_matches_torch_reference_where_every_step_is_exact(fmt, rng):
    """Inputs on which the interpreter's stand-ins (truncating bf16 casts, numpy's exp) cannot differ from torch: the
    epilogue's products are exact in bf16 (small integers x powers of two), gates are 0 or >= 32 (SiLU(g) = g in
    float32) and up values powers of two (the product exact). Then the kernel must equal the torch spec."""
    m, k = 3, 96
    two = lambda lo, hi, n: 2.0 ** torch.randint(lo, hi, (n,), generator=rng).float()  # noqa: E731
    rf = two(-8, 1, 2 * k)
    rs = two(-4, 3, m) if fmt == "nvfp4:row" else None
    gate = torch.randint(32, 256, (m, k), generator=rng).float() * 2.0 ** 12
    gate[0, ::3] = 0.0
    up = two(-3, 4, m * k).reshape(m, k) * torch.where(torch.rand(m, k, generator=rng) < 0.5, -1.0, 1.0)
    y = torch.cat([gate, up], dim=1)
    got, got_rs = epilogue_silu_mul_quantize(y, rf, rs, fmt)
    want, want_rs = epilogue_silu_mul_quantize_reference(y, rf, rs, fmt)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))
    assert got_rs is None or torch.equal(got_rs, want_rs)


def test_checks_say_what_is_wrong():
    y = torch.zeros(2, 64)
    with pytest.raises(ValueError, match="float32"):
        epilogue_silu_mul_quantize(y.bfloat16(), torch.ones(64), None, "mxfp4")
    with pytest.raises(ValueError, match="row factors"):
        epilogue_silu_mul_quantize(y, torch.ones(10), None, "mxfp4")
    with pytest.raises(ValueError, match="nvfp4:row or mxfp4"):
        epilogue_silu_mul_quantize(y, torch.ones(64), None, "fp8_e4m3:row")
    assert fuses(12288, "nvfp4:row") and fuses(12288, "mxfp4") and not fuses(20000, "nvfp4:row")
    assert not fuses(40, "nvfp4:row")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_backend_stacked_path_equals_stacked_gemm_then_silu_quantize(fmt, monkeypatch, gen):
    """`FP4Backend.linear_stacked_silu_mul_quantize` on a real gate | up operand stack (interpreted dequantization,
    epilogue and quantize): the bits of `linear_stacked` then `quantize_silu_mul_input`; its refusals (a 3-part
    stack, rows under the cache threshold) come before any work."""
    from tests.kernels.test_operand_stack import _parts
    from trace_rl.backends.fp4 import FP4Backend, SharedInput
    from trace_rl.formats import per_token
    from trace_rl.kernels import fp4_dequant, operand_cache

    k, kin, m = 96, 64, 3
    gate, up, down = _parts(fmt, (k, k, 32), kin, gen, "cpu")
    down.in_features = k            # only its format and input width are read
    operand_cache.attach_stacked([gate, up])
    act = per_token(fmt)
    x, rs = quantize_dequant_bf16(torch.randn(m, kin, generator=gen).to(torch.bfloat16), act)
    xq = SharedInput(fmt, torch.Size((m, kin)), torch.bfloat16, x, rs, kernels=True)
    backend = FP4Backend()
    assert backend.linear_stacked_silu_mul_quantize(xq, [gate, up], down, fmt) is None     # m < the threshold
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 1)
    taken = backend.paths.counts.get("fp4.operand_stack_silu_mul_quantize", 0)
    got = backend.linear_stacked_silu_mul_quantize(xq, [gate, up], down, fmt)
    assert backend.paths.counts.get("fp4.operand_stack_silu_mul_quantize", 0) == taken + 1
    st = operand_cache.stacked([gate, up])
    want, want_rs = quantize_dequant_bf16(operand_cache.stacked_matmul(x, st, rs), act, silu_mul=True)
    assert got.shape == (m, k) and torch.equal(got.x.view(torch.int16), want.view(torch.int16))
    assert (got.row_scale is None) == (want_rs is None) and (want_rs is None or torch.equal(got.row_scale, want_rs))
