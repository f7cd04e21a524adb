"""fp4 backend: NVFP4/MXFP4 weights (W4A16) and activations (W4A4).

Paths (reported in `paths`, never silent):
- `fp4.emulated`: CPU (or a GPU without the kernels). The weight is dequantized once (cached), the
  activations are quantize-dequantized per token in torch, and the matmul runs in float32. Numerically
  this is the format's reference: E2M1 x E4M3 products are exact, only accumulation order differs.
- `fp4.triton`: GPU, trace_rl.kernels (packed 4-bit weights dequantized in the GEMM's registers).
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
    """Reference W4A16/W4A4 linear in float32: quantize-dequantize, then matmul."""
    xf = x.float()
    if act_fmt != "bf16":
        xf = get_format(per_token(act_fmt)).fake_quantize(xf)
    y = xf @ packed.dequantized().T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


@register_backend("fp4")
class FP4Backend(Backend):
    weight_formats = ("nvfp4", "mxfp4")

    def available(self, device=None) -> Availability:
        device = torch.device(device) if device is not None else default_device()
        if device.type != "cuda":
            return Availability(True, "fp4.emulated",
                                "no GPU: FP4 is emulated (quantize -> dequantize -> float32 matmul in torch)")
        return Availability(True, "fp4.emulated",
                            "the Triton FP4 kernels are not installed in this build; FP4 is emulated on the GPU")

    def linear(self, x, packed, act_fmt="bf16", bias=None):
        _check_act(act_fmt, packed)
        self.paths.record("fp4.emulated")
        return emulated_linear(x, packed, act_fmt, bias)
