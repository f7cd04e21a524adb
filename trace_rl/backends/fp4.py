"""fp4 backend: NVFP4/MXFP4 weights (W4A16) and activations (W4A4).

Paths (reported in `paths`, never silent):
- `fp4.emulated`: CPU (or a GPU without the kernels). The weight is dequantized once (cached), the
  activations are quantize-dequantized per token in torch, and the matmul runs in float32. Numerically
  this is the format's reference: E2M1 x E4M3 products are exact, only accumulation order differs.
- `fp4.triton`: CUDA tensors with trace_rl.kernels available: the FP4 GEMM (packed 4-bit weights
  dequantized in registers, W4A4 activations quantized per token by the quantize kernel), and weight
  quantization by the quantize kernel (bit-exact with the reference, so no behaviour change).
"""

from __future__ import annotations

import torch

from trace_rl.backends.base import Availability, Backend, PackedWeight, default_device
from trace_rl.backends.registry import register_backend
from trace_rl.formats import get_format, per_token


def _check_act(act_fmt: str, packed: PackedWeight) -> None:
    if act_fmt not in ("bf16", packed.fmt):
        raise ValueError(f"fp4 backend: activations in {act_fmt!r} with {packed.fmt!r} weights is not a "
                         f"supported combination; use 'bf16' (W4A16) or {packed.fmt!r} (W4A4)")


def emulated_linear(x: torch.Tensor, packed: PackedWeight, act_fmt: str, bias: torch.Tensor | None):
    """Reference W4A16/W4A4 linear in float32: quantize-dequantize, then matmul.

    float64 inputs compute in float64 (the dequantized values are exact in both), so that CPU tests can
    compare this path with the trainer's fake quantization without float32 noise crossing a rounding
    boundary."""
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(compute)
    if act_fmt != "bf16":
        xf = get_format(per_token(act_fmt)).fake_quantize(xf)
    y = xf @ packed.dequantized().to(compute).T
    if bias is not None:
        y = y + bias.to(compute)
    return y.to(x.dtype)


@register_backend("fp4")
class FP4Backend(Backend):
    weight_formats = ("nvfp4", "mxfp4")

    def available(self, device=None) -> Availability:
        device = torch.device(device) if device is not None else default_device()
        if device.type != "cuda":
            return Availability(True, "fp4.emulated",
                                "no GPU: FP4 is emulated (quantize -> dequantize -> float32 matmul in torch)")
        ok, why = _kernels_available()
        if ok:
            return Availability(True, "fp4.triton")
        return Availability(True, "fp4.emulated", f"the Triton FP4 kernels cannot run ({why}); FP4 is emulated")

    def prepare_weight(self, weight: torch.Tensor, fmt: str) -> PackedWeight:
        if not (weight.is_cuda and _kernels_available()[0]):
            return super().prepare_weight(weight, fmt)
        from trace_rl.kernels import quantize

        self.check_format(fmt)
        n, k = weight.shape
        return PackedWeight(fmt, n, k, q=quantize(weight.detach(), fmt))

    def linear(self, x, packed, act_fmt="bf16", bias=None):
        _check_act(act_fmt, packed)
        if x.is_cuda and _kernels_available()[0]:
            from trace_rl.kernels import fp4_linear

            self.paths.record("fp4.triton")
            return fp4_linear(x, packed, act_fmt, bias)
        self.paths.record("fp4.emulated")
        return emulated_linear(x, packed, act_fmt, bias)


def _kernels_available() -> tuple[bool, str]:
    from trace_rl.kernels import available, interpreting

    if interpreting():   # the interpreter runs CPU tensors only; CUDA tensors need compiled kernels
        return False, "TRITON_INTERPRET=1 is set"
    return available()
