"""GPU (issue 16): the stacked gate/up GEMM's FP4 epilogue fused into the SiLU x mul W4A4 quantize
(kernels/epilogue_silu_quantize.py) is bit-identical to the two launches it replaces (`fp4_dequant.factor_matmul`'s
epilogue writing bf16 gate | up, then `quantize_dequant_bf16(silu_mul=True)`): operand bits and row scales, at the
Qwen3-8B shape (313 x 2 x 12288) and odd ones, nvfp4:row (with the per-token row scale) and mxfp4 (none), on a real
cuBLAS accumulator and on rows with NaN / Inf / huge values; and equal to the torch spec (torch's epilogue, F.silu,
the format's reference quantization) on the finite blocks. Also through the stacked operand cache
(`operand_cache.stacked_silu_mul_quantize` vs `stacked_matmul` + the quantize)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> dict:
    ia, ib = a.view(torch.int16), b.view(torch.int16)
    na, nb = a.isnan(), b.isnan()
    return {"bits": int(((ia != ib) & ~na & ~nb).sum()), "nan_positions": int((na != nb).sum())}


def _inputs(m, k, fmt, seed, special=True):
    """A real accumulator: bf16 x [m, K'] @ bf16 w [2k, K']^T in float32 (cuBLAS), row factors of the magnitude of
    nvfp4's (global x 2**19), a per-token row scale for nvfp4:row."""
    from trace_rl.kernels.fp4_dequant import accumulate

    g = torch.Generator().manual_seed(seed)
    kin = 256
    x = (torch.randn(m, kin, generator=g) * 2).to(torch.bfloat16).cuda()
    w = (torch.randn(2 * k, kin, generator=g) * 0.05).to(torch.bfloat16).cuda()
    y = accumulate(x, w)
    rf = ((torch.rand(2 * k, generator=g) + 0.5) * 2.0 ** -3).cuda()
    rs = ((torch.rand(m, generator=g) + 0.1) * 0.5).cuda() if fmt == "nvfp4:row" else None
    if special and m > 3:
        y[1, :6] = torch.tensor([float("nan"), float("inf"), float("-inf"), 3e38, -3e38, 1e-39]).cuda()
        y[2, k:k + 3] = torch.tensor([float("nan"), float("inf"), 0.0]).cuda()
        y[3] = float("nan")                                                # a whole NaN row
    return y, rf, rs


def _apart(y, rf, rs, fmt):
    import triton

    from trace_rl.kernels.fp4_dequant import EPI_BM, EPI_BN, _epilogue_kernel
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    m, n = y.shape
    out = torch.empty(m, n, dtype=torch.bfloat16, device=y.device)
    _epilogue_kernel[(triton.cdiv(m, EPI_BM), triton.cdiv(n, EPI_BN))](
        y, rf, rs if rs is not None else rf, rf, out, m, n, y.stride(0), out.stride(0),
        HAS_ROW_SCALE=rs is not None, HAS_BIAS=False, BM=EPI_BM, BN=EPI_BN, num_warps=4)
    return quantize_dequant_bf16(out, fmt, silu_mul=True)


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("m,k", [(313, 12288), (1, 12288), (16, 12288), (512, 12288), (7, 1120), (5, 96)])
def test_fused_bit_identical_with_epilogue_then_silu_quantize(fmt, m, k):
    from trace_rl.kernels.epilogue_silu_quantize import epilogue_silu_mul_quantize

    y, rf, rs = _inputs(m, k, fmt, seed=m * 7 + k)
    got, got_rs = epilogue_silu_mul_quantize(y, rf, rs, fmt)
    want, want_rs = _apart(y, rf, rs, fmt)
    miss = _bits_equal(got, want)
    print(f"{fmt} {m}x2x{k}: {miss}")
    assert miss == {"bits": 0, "nan_positions": 0}
    if fmt == "nvfp4:row":
        assert torch.equal(got_rs.view(torch.int32), want_rs.view(torch.int32))
    else:
        assert got_rs is None and want_rs is None


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
def test_fused_equals_the_torch_spec_on_finite_blocks(fmt):
    from trace_rl.kernels.epilogue_silu_quantize import (
        epilogue_silu_mul_quantize,
        epilogue_silu_mul_quantize_reference,
    )

    y, rf, rs = _inputs(9, 1120, fmt, seed=5, special=False)
    got, got_rs = epilogue_silu_mul_quantize(y, rf, rs, fmt)
    want, want_rs = epilogue_silu_mul_quantize_reference(y, rf, rs, fmt)
    assert _bits_equal(got, want) == {"bits": 0, "nan_positions": 0}
    assert got_rs is None or torch.equal(got_rs.view(torch.int32), want_rs.view(torch.int32))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_stacked_operand_cache_path_bit_identical(fmt):
    """The real stack: gate / up weights of one format attached as one operand cache; the fused path == the
    stacked GEMM + epilogue, then the SiLU x mul quantize."""
    from trace_rl.backends import get_backend
    from trace_rl.formats import per_token
    from trace_rl.kernels.operand_cache import attach_stacked, stacked_matmul, stacked_silu_mul_quantize
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    g = torch.Generator().manual_seed(11)
    k, kin, m = 1536, 512, 313
    backend = get_backend("fp4")
    gate = backend.prepare_weight((torch.randn(k, kin, generator=g) * 0.05).to(torch.bfloat16).cuda(), fmt)
    up = backend.prepare_weight((torch.randn(k, kin, generator=g) * 0.02).to(torch.bfloat16).cuda(), fmt)
    st = attach_stacked([gate, up])
    x = (torch.randn(m, kin, generator=g)).to(torch.bfloat16).cuda()
    act = per_token(fmt)
    xq, rs = quantize_dequant_bf16(x, act)
    got, got_rs = stacked_silu_mul_quantize(xq, st, rs, act)
    want, want_rs = quantize_dequant_bf16(stacked_matmul(xq, st, rs), act, silu_mul=True)
    assert _bits_equal(got, want) == {"bits": 0, "nan_positions": 0}
    assert (got_rs is None) == (want_rs is None) and (got_rs is None or torch.equal(got_rs, want_rs))
