"""The opt-in TMA variant of the dense FP4 GEMM (fp4_gemm_tma.py, `GemmConfig(tma=True)`): bit-identical to the
shipped kernel at the same tiles and split (same decode, dot order and fixed-order split-K reduction), at odd
shapes (ragged N, M and K tiles; rows past the weight's end come from TMA's zero fill), on the interpreter or
the GPU; on the GPU also at the issue's decode shapes."""

from dataclasses import replace

import pytest
import torch

from trace_rl.backends import get_backend
from trace_rl.formats import get_format, per_token
from trace_rl.kernels.fp4_gemm import GemmConfig
from trace_rl.kernels.linear import fp4_linear as fp4_linear_cfg

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _weight(N, K, fmt, gen, device):
    """(packed, packed on `device`); quantized on `device` (the GPU shapes are large for the CPU)."""
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    packed = get_backend("fp4").prepare_weight(w.to(device), fmt)
    return packed, packed.__class__(packed.fmt, N, K, q=packed.q.to(device))


def _rel_err(y, packed, x, act_fmt):
    """Against float64 (fake-quantized activations for W4A4) @ the dequantized weight, on y's device."""
    xf = x.float()
    if act_fmt != "bf16":
        xf = get_format(per_token(act_fmt)).fake_quantize(xf)
    ref = xf.double() @ packed.q.to(y.device).dequantize().double().T
    return ((y.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("N,K,M,block_n,split,act", [
    (40, 608, 17, 64, 3, "bf16"),     # 5 K blocks in 3 splits, 2 M tiles, N inside one 64-row tile
    (150, 256, 3, 64, 1, "fp4"),      # 3 N tiles, the last ragged; W4A4 (row scales in the epilogue)
    (40, 224, 1, 128, 2, "bf16"),     # a 128-row box over a 3-row (48-weight-row) layout: TMA zero-fills
])
def test_tma_variant_is_bit_identical_to_shipped(fmt, N, K, M, block_n, split, act, device, gen):
    packed, packed_dev = _weight(N, K, fmt, gen, device)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(device)
    act_fmt = fmt if act == "fp4" else "bf16"
    shipped = GemmConfig(16, block_n, 128, split, 4, 2, decode=0 if device == "cpu" else 1)
    y_ref = fp4_linear_cfg(x, packed_dev, act_fmt, None, config=shipped)
    y = fp4_linear_cfg(x, packed_dev, act_fmt, None, config=replace(shipped, tma=True))
    assert torch.equal(y, y_ref)
    assert _rel_err(y, packed, x, act_fmt) < 1e-2      # and both are right


def test_tma_config_is_checked(device, gen):
    with pytest.raises(ValueError, match="tma=True needs block_k"):
        GemmConfig(16, 128, 256, tma=True).check()
    from trace_rl.kernels.fp4_grouped import fp4_grouped_matmul
    from trace_rl.kernels.linear import hopper_weight

    packed, packed_dev = _weight(32, 128, "nvfp4", gen, device)
    w = hopper_weight(packed_dev)
    stacked = w.__class__(w.fmt, w.n, w.k, w.values[None], w.scales[None], w.row_factor[None])
    x = torch.zeros(2, 128, dtype=torch.bfloat16, device=device)
    offsets = torch.tensor([0, 2], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match="dense-GEMM variant"):
        fp4_grouped_matmul(x, offsets, stacked, config=GemmConfig(16, 64, 128, tma=True))


# The decode shapes (K, N) and the variant's parameters the GPU benchmark sweeps (benchmarks/gemm_tma.py).
GPU_SHAPES = [(4096, 12288), (12288, 4096), (4096, 1024)]
GPU_VARIANTS = [dict(num_stages=4), dict(num_stages=6), dict(block_n=256, num_stages=4)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("K,N", GPU_SHAPES)
def test_tma_variant_bit_exact_at_decode_shapes_gpu(fmt, K, N, gen):
    """At M = 1, 4, 16: the TMA variant of the shipped `default_config` (and of deeper / wider variants) equals
    the shipped kernel with the same tiles and split bit for bit, and the float64 reference to 1e-2."""
    from trace_rl.kernels.fp4_gemm import default_config

    packed, packed_dev = _weight(N, K, fmt, gen, "cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for M in (1, 4, 16):
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
        base = default_config(M, N, K, sms)
        for change in [{}] + GPU_VARIANTS:
            shipped = replace(base, **change)
            y_ref = fp4_linear_cfg(x, packed_dev, "bf16", None, config=shipped)
            y = fp4_linear_cfg(x, packed_dev, "bf16", None, config=replace(shipped, tma=True))
            assert torch.equal(y, y_ref), f"M {M} {shipped}: max |diff| {(y - y_ref).abs().max().item()}"
            assert torch.equal(fp4_linear_cfg(x, packed_dev, "bf16", None, config=replace(shipped, tma=True)), y)
        assert _rel_err(y, packed, x, "bf16") < 1e-2
