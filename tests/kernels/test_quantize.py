"""Quantize kernels against the torch reference (trace_rl/formats): codes and scales bit for bit."""

import pytest
import torch

from trace_rl.formats import get_format
from trace_rl.kernels import quantize

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NaN blocks, interpreter

FORMATS = ["nvfp4", "nvfp4:row", "mxfp4", "fp8_e4m3:row"]


def _inputs(rows: int, K: int, gen: torch.Generator, dtype=torch.bfloat16) -> torch.Tensor:
    """Random rows with a spread of magnitudes, plus the awkward cases: an all-zero row, -0.0, values
    exactly on E2M1 rounding ties, tiny values, and (for rows >= 3) a block holding NaN and one +Inf."""
    x = torch.randn(rows, K, generator=gen) * torch.exp(torch.randn(rows, 1, generator=gen) * 3)
    x[0, : K // 2] = 0.0
    x[0, 1] = -0.0
    if rows > 1:  # ties: row and block amax 6 -> step 1 (nvfp4:row, mxfp4), elements on E2M1 midpoints
        x[1] = x[1].clamp(-5.9, 5.9)
        x[1, :16] = torch.tensor([6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5,
                                  -.25, -.75, -1.25, -1.75, -2.5, -3.5, -5, 1e-30])
    if rows > 2:
        x[2, 3] = float("nan")
        x[2, K - 1] = float("inf")
    return x.to(dtype)


def _finite_blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """[..., K] bool: True where the element's block holds only finite values."""
    b = torch.isfinite(x.float()).reshape(*x.shape[:-1], -1, block).all(-1)
    return b.repeat_interleave(block, dim=-1)


def _check_same(q, ref, x, fmt):
    assert q.format == ref.format and q.shape == ref.shape and q.dtype == ref.dtype
    assert q.codes.dtype == ref.codes.dtype and q.codes.shape == ref.codes.shape
    assert q.scales.dtype == ref.scales.dtype and q.scales.shape == ref.scales.shape
    if fmt.startswith("fp8"):
        assert q.global_scale is None
        assert torch.equal(q.scales.cpu(), ref.scales)
        assert torch.equal(q.codes.cpu().view(torch.uint8), ref.codes.view(torch.uint8))
        return
    block = 32 if fmt == "mxfp4" else 16
    ok = _finite_blocks(x, block)
    from trace_rl.formats import unpack_nibbles

    codes, ref_codes = unpack_nibbles(q.codes.cpu()), unpack_nibbles(ref.codes)
    assert torch.equal(codes[ok], ref_codes[ok]), "E2M1 codes differ in finite blocks"
    assert torch.equal(q.scales.cpu().view(torch.uint8), ref.scales.view(torch.uint8)), "block scales differ"
    if ref.global_scale is None:
        assert q.global_scale is None
    else:
        assert q.global_scale.shape == ref.global_scale.shape
        assert torch.equal(q.global_scale.cpu(), ref.global_scale)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,K", [(1, 32), (3, 96), (17, 160), (2, 1056)])   # 1056: two K chunks, ragged
def test_quantize_matches_reference(fmt, rows, K, device, gen):
    x = _inputs(rows, K, gen)
    ref = get_format(fmt).quantize(x)
    q = quantize(x.to(device), fmt)
    _check_same(q, ref, x, fmt)


@pytest.mark.parametrize("fmt", ["nvfp4:row", "fp8_e4m3:row"])
def test_quantize_leading_dims_and_float32(fmt, device, gen):
    x = torch.randn(2, 3, 64, generator=gen) * 5
    ref = get_format(fmt).quantize(x)
    _check_same(quantize(x.to(device), fmt), ref, x, fmt)


def test_quantize_rejects_bad_shapes_and_formats(device):
    with pytest.raises(ValueError, match="multiple of 16"):
        quantize(torch.zeros(2, 24, device=device), "nvfp4")
    with pytest.raises(ValueError, match="no quantize kernel"):
        quantize(torch.zeros(2, 32, device=device), "fp8_e5m2:row")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_large_weight_gpu(fmt, gen):
    """A Qwen3-8B-sized weight, tiled by the GPU launcher (many programs, K chunks)."""
    x = (torch.randn(1024, 12288, generator=gen) * 0.02).to(torch.bfloat16)
    _check_same(quantize(x.cuda(), fmt), get_format(fmt).quantize(x), x, fmt)


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
def test_w4a4_quantize_fuses_swiglu(fmt, device, gen):
    """The W4A4 activation quantizer with SiLU(gate) * up fused in gives the same operand, bit for bit, as
    `swiglu.silu_mul` then the quantizer. Odd row count, a NaN entry, an all-zero row."""
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16
    from trace_rl.kernels.swiglu import silu_mul

    K = 96 if fmt == "mxfp4" else 80
    gate_up = (torch.randn(9, 2 * K, generator=gen) * 3).to(torch.bfloat16)
    gate_up[3] = 0.0
    gate_up[5, K + 1] = float("nan")
    gate_up = gate_up.to(device)
    got, got_rs = quantize_dequant_bf16(gate_up, fmt, silu_mul=True)
    ref, ref_rs = quantize_dequant_bf16(silu_mul(gate_up), fmt)
    assert torch.equal(got.isnan(), ref.isnan()) and got[5].isnan().any()
    assert torch.equal(got.nan_to_num(), ref.nan_to_num()) and not got[3].any()
    assert (got_rs is None and ref_rs is None) or torch.equal(got_rs, ref_rs)
    with pytest.raises(ValueError, match="gate | up"):
        quantize_dequant_bf16(gate_up[:, :-1], fmt, silu_mul=True)
