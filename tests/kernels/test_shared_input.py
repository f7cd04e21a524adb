"""Rollout layers sharing an input (q/k/v, gate/up of an unfused nvfp4 model) quantize it once
(`FP4Backend.quantize_input` + `linear_quantized`, `models.linear.shared_input`): the same bits as each layer's own
`linear` on the kernels (GPU, or the interpreter with the kernel path forced on CPU tensors), on the FP4 GEMM, the
dequant + cuBLAS path and the operand cache, at odd shapes, with and without bias, 2-D and 3-D inputs."""

import pytest
import torch

from tests.kernels.test_fp4_dequant import _q, _same_bits
from trace_rl.backends import PackedWeight
from trace_rl.backends import fp4 as fp4_backend
from trace_rl.backends.fp4 import FP4Backend
from trace_rl.kernels import fp4_dequant, operand_cache

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("path", ["gemm", "dequant", "operand_cache"])
def test_shared_input_equals_each_linear(fmt, path, monkeypatch, device, gen):
    if device == "cpu":
        monkeypatch.setattr(fp4_backend, "_on_kernels", lambda x: True)   # the interpreter runs the kernels
    K, shapes = 96, (37, 8, 40)                      # q/k/v-like parts of different N over one input
    parts = [PackedWeight(fmt, n, K, q=_q(n, K, fmt, gen, special=False).to(device)) for n in shapes]
    if path == "operand_cache":
        for p in parts:
            operand_cache.attach(p)
    if path != "gemm":
        monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 5)
    biases = [None, torch.randn(8, generator=gen).to(device), None]
    x = (torch.randn(5, 1, K, generator=gen) * 3).to(torch.bfloat16).to(device)   # [B, T, K] as the model's
    x[1, 0, :16] = 0                                  # an all-zero block
    backend = FP4Backend()
    xq = backend.quantize_input(x, parts[0], fmt)
    assert xq is not None and xq.kernels
    for p, b in zip(parts, biases):
        y, ys = backend.linear(x, p, fmt, b), backend.linear_quantized(xq, p, b)
        assert ys.shape == y.shape == (5, 1, p.out_features) and ys.dtype == y.dtype
        _same_bits(ys.cpu(), y.cpu())
    expect = {"gemm": "fp4.triton", "dequant": "fp4.dequant_cublas", "operand_cache": "fp4.operand_cache_cublas"}
    assert backend.paths.summary() == {expect[path]: 6}


def test_shared_input_emulated_and_w4a16(gen):
    """Emulated (CPU, no kernels): the float32 quantize-dequantize once, the same bits as `emulated_linear`;
    W4A16 and an empty input do not share (None: the caller runs `linear` per layer)."""
    backend = FP4Backend()
    K = 64
    p = PackedWeight("nvfp4", 24, K, q=_q(24, K, "nvfp4", gen, special=False))
    x = torch.randn(3, 7, K, generator=gen).to(torch.bfloat16)
    b = torch.randn(24, generator=gen)
    xq = backend.quantize_input(x, p, "nvfp4")
    assert not xq.kernels
    assert torch.equal(backend.linear_quantized(xq, p, b), fp4_backend.emulated_linear(x, p, "nvfp4", b))
    assert backend.quantize_input(x, p, "bf16") is None
    assert backend.quantize_input(x[:0], p, "nvfp4") is None
    with pytest.raises(ValueError, match="not a supported combination"):
        backend.quantize_input(x, p, "mxfp4")
