"""fp8 backend's torch `_scaled_mm` path on a GPU (sm_89+): against float64, and codes against the reference.

Bounds: the GEMM writes bf16, so against the float64 product of the *same* FP8 operands the relative
(Frobenius) error is that of bf16 rounding, ~2^-9 = 2e-3 (bound 4e-3); against the unquantized float64
product it is FP8 E4M3's (3 mantissa bits: ~3% on random data; bound 8%).
"""

import pytest
import torch

from trace_rl.backends import fp8_scaled_mm
from trace_rl.backends.fp8 import FP8Backend, FP8Config, FP8PathError, weight_format
from trace_rl.formats import get_format, per_token

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9),
    reason="needs a CUDA GPU with FP8 (sm_89+)")]

CUDA = torch.device("cuda")


def _rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


def _operands_reference(x, w, w_fmt, act_fmt):
    """float64 product of the dequantized FP8 operands (formats' reference quantization)."""
    qa = get_format(per_token(act_fmt)).quantize(x)
    qw = get_format(weight_format(w_fmt)).quantize(w)
    return qa.dequantize().double() @ qw.dequantize().double().T


@pytest.mark.parametrize("m", [1, 5, 33])
@pytest.mark.parametrize("w_fmt,act_fmt", [("fp8_e4m3:row", "fp8_e4m3:row"),
                                           ("fp8_e4m3:tensor", "fp8_e4m3:tensor"),
                                           ("fp8_e4m3:block", "fp8_e4m3:block")])
def test_scaled_mm_linear_against_float64(w_fmt, act_fmt, m):
    torch.manual_seed(m)
    k, n = 384, 256
    x = torch.randn(m, k, device=CUDA, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=CUDA) * 0.05
    bias = torch.randn(n, device=CUDA)
    if get_format(w_fmt).scaling == "block":
        variant, why = fp8_scaled_mm.block_support(CUDA)
        if variant is None:  # reported, and an explicit scaled_mm must then refuse with that reason
            backend = FP8Backend(FP8Config(impl="scaled_mm"))
            with pytest.raises(FP8PathError, match="block-scaled"):
                backend.linear(x, backend.prepare_weight(w, w_fmt), act_fmt)
            pytest.skip(why)
    backend = FP8Backend(FP8Config(impl="scaled_mm"))
    packed = backend.prepare_weight(w, w_fmt)
    y = backend.linear(x, packed, act_fmt, bias)
    assert y.dtype == torch.bfloat16 and y.shape == (m, n)
    assert backend.paths.last.startswith("fp8.scaled_mm.")
    xf = x.float()
    same_operands = _operands_reference(xf, w, w_fmt, act_fmt) + bias.double()
    exact = xf.double() @ w.double().T + bias.double()
    e_ops, e_exact = _rel(y, same_operands), _rel(y, exact)
    print(f"{backend.paths.last} m={m}: rel err vs same FP8 operands {e_ops:.2e}, vs unquantized {e_exact:.2e}")
    assert e_ops < 4e-3
    assert e_exact < 8e-2


@pytest.mark.parametrize("fmt", ["fp8_e4m3:row", "fp8_e4m3:block"])
def test_rollout_and_trainer_agree_on_fp8_codes(fmt):
    """Rollout: one decode token at a time, on the GPU. Trainer (aligned): the whole sequence at once, as
    fake quantization. Same per-token format -> the same codes and scales, bit for bit; and both are
    the CPU reference's."""
    torch.manual_seed(3)
    t, k = 37, 512
    x = torch.randn(t, k, device=CUDA) * torch.logspace(-2, 2, t, device=CUDA)[:, None]
    f = get_format(fmt)
    trainer = f.quantize(x)
    decode = [f.quantize(x[i:i + 1]) for i in range(t)]
    codes = torch.cat([q.codes for q in decode]).view(torch.uint8)
    scales = torch.cat([q.scales for q in decode])
    assert torch.equal(codes, trainer.codes.view(torch.uint8))
    assert torch.equal(scales, trainer.scales)
    cpu = f.quantize(x.cpu())
    assert torch.equal(cpu.codes.view(torch.uint8), trainer.codes.view(torch.uint8).cpu())
    assert torch.equal(cpu.scales, trainer.scales.cpu())
    fake = FP8Backend().fake_quantize(x, fmt)
    assert torch.equal(fake, trainer.dequantize())


def test_auto_on_a_hopper_gpu_takes_scaled_mm_for_rowwise_and_says_why_not_te():
    backend = FP8Backend()
    packed = backend.prepare_weight(torch.randn(64, 128, device=CUDA), "fp8_e4m3:row")
    backend.linear(torch.randn(3, 128, device=CUDA), packed, "fp8_e4m3:row")
    assert backend.paths.last == "fp8.scaled_mm.rowwise"
    assert "te" in backend.skipped and backend.fallbacks == []


def test_weight_only_fp8_on_gpu_is_emulated_and_says_so():
    backend = FP8Backend()
    packed = backend.prepare_weight(torch.randn(64, 128, device=CUDA), "fp8_e4m3:row")
    backend.linear(torch.randn(3, 128, device=CUDA), packed, "bf16")
    assert backend.paths.last == "fp8.emulated"
    assert "weight-only" in backend.skipped["scaled_mm"]
