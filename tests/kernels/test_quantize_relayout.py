"""`quantize_relayout` (nvfp4 / mxfp4 quantize with the Hopper re-layout fused into its store) = the torch
reference quantization and `hopper_fp4.to_hopper` of it, bit for bit: QTensor codes (finite blocks) and
scales, layout words, layout scales, row factor; ragged shapes (N and K not multiples of the 16 x 128 layout
block, nor of the program's 16 x 256 tile), zero / subnormal / NaN / Inf blocks, E2M1 ties, and in-place
writes into existing buffers (garbage in them)."""

import pytest
import torch

from trace_rl.formats import get_format, unpack_nibbles
from trace_rl.kernels.hopper_fp4 import to_hopper

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # NaN blocks, interpreter


def _weight(n: int, k: int, gen: torch.Generator, dtype=torch.float32) -> torch.Tensor:
    x = torch.randn(n, k, generator=gen) * torch.exp(torch.randn(n, 1, generator=gen))
    x[0, :16] = 0.0
    x[0, 16:32] = torch.tensor([1e-40, -1e-41] * 8)             # subnormal block: its scale rounds to 0
    x[1, 32:48] = -0.0
    x[2, :16] *= 1e-6                                            # subnormal E4M3 scale
    if n > 3:
        x[3, 17] = float("nan")
        x[3, k - 1] = float("inf")
    x[1, 64:80] = torch.tensor([6, .25, .75, 1.25, 1.75, 2.5, 3.5, 5, -.25, -.75, -1.25, -1.75, -2.5, -3.5,
                                -5, 1e-30]) * x[x.isfinite()].abs().max() / 6   # ties under the tensor scale's step
    return x.to(dtype)


def _check(x: torch.Tensor, device: str, inplace: bool = False, fmt: str = "nvfp4") -> None:
    from trace_rl.kernels.quantize_relayout import quantize_relayout

    G = 32 if fmt == "mxfp4" else 16
    ref_q = get_format(fmt).quantize(x)
    ref = to_hopper(ref_q)
    if inplace:   # weight sync: into a layout and QTensor that exist (garbage in them)
        from trace_rl.formats import QTensor
        from trace_rl.kernels.hopper_fp4 import HopperFP4

        n, k = x.shape
        out = HopperFP4.empty(fmt, n, k, device)
        out.values.fill_(-1)
        out.scales.fill_(0x55)
        out.row_factor.fill_(7.0)
        sc = torch.full((n, k // G), 0x33, dtype=torch.uint8, device=device)
        q0 = QTensor(torch.full((n, k // 2), 0xAA, dtype=torch.uint8, device=device),
                     sc.view(torch.float8_e4m3fn) if fmt == "nvfp4" else sc,
                     torch.zeros((), device=device) if fmt == "nvfp4" else None, (n, k), x.dtype, fmt)
        q, h = quantize_relayout(x.to(device), fmt, out=out, q=q0)
        assert h is out and q is q0
    else:
        q, h = quantize_relayout(x.to(device), fmt)
    ok = torch.isfinite(x.float()).reshape(x.shape[0], -1, G).all(-1).repeat_interleave(G, dim=-1)
    assert torch.equal(unpack_nibbles(q.codes.cpu())[ok], unpack_nibbles(ref_q.codes)[ok]), "codes"
    assert torch.equal(q.scales.cpu().view(torch.uint8), ref_q.scales.view(torch.uint8)), "scales"
    if fmt == "nvfp4":
        assert torch.equal(q.global_scale.cpu(), ref_q.global_scale), "global scale"
    else:
        assert q.global_scale is None
    if bool(ok.all()):
        assert torch.equal(h.values.cpu(), ref.values), "layout words"
    else:   # words of NaN blocks hold their (unspecified) codes: compare the rest through the codes' layout
        fixed = to_hopper(type(ref_q)(q.codes.cpu(), ref_q.scales, ref_q.global_scale, ref_q.shape, ref_q.dtype,
                                      fmt))
        assert torch.equal(h.values.cpu(), fixed.values), "layout words"
    assert torch.equal(h.scales.cpu(), ref.scales), "layout scales"
    assert torch.equal(h.row_factor.cpu().view(torch.int32), ref.row_factor.view(torch.int32)), "row factor"


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n,k", [(16, 128), (19, 160), (40, 288), (33, 544)])
def test_quantize_relayout_matches_reference(fmt, n, k, device, gen):
    _check(_weight(n, k, gen), device, fmt=fmt)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_quantize_relayout_in_place_bf16(fmt, device, gen):
    _check(_weight(21, 416 if fmt == "mxfp4" else 144, gen, torch.bfloat16), device, inplace=True, fmt=fmt)


def test_quantize_relayout_mxfp4_row_exponents(device, gen):
    """mxfp4 layout scales are relative to each row's largest block exponent: rows whose blocks span many
    binades, an all-NaN row (its factor keeps MX_TOP), an all-zero row."""
    x = torch.randn(18, 256, generator=gen) * torch.exp2(torch.randint(-40, 40, (18, 8), generator=gen)
                                                         .float()).repeat_interleave(32, dim=1)
    x[4] = float("nan")
    x[5] = 0.0
    x[6, 40] = float("inf")
    _check(x, device, fmt="mxfp4")


def test_quantize_relayout_rejects_other_formats(device):
    from trace_rl.kernels.quantize_relayout import quantize_relayout

    with pytest.raises(ValueError, match="nvfp4 or mxfp4"):
        quantize_relayout(torch.zeros(16, 64, device=device), "nvfp4:row")
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_relayout(torch.zeros(16, 48, device=device), "mxfp4")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("n,k", [(1024, 12288), (4096, 4096), (771, 1040)])
def test_quantize_relayout_large_gpu(fmt, n, k, gen):
    k = k if fmt == "nvfp4" else -(-k // 32) * 32          # mxfp4: 1040 -> 1056 (33 blocks)
    x = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
    x[5, 7] = float("nan")
    _check(x, "cuda", fmt=fmt)
