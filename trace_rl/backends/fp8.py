"""fp8 backend: FP8 weights (W8A16) and activations (W8A8), per tensor, per row, or in blocks.

Paths (reported in `paths`, never silent):
- `fp8.scaled_mm`: a CUDA GPU of compute capability >= 8.9 (Hopper, Ada) and tensor/row scaling with
  E4M3 on both operands: torch `_scaled_mm` with float32 dequantization scales.
- `fp8.emulated`: otherwise: quantize-dequantize in torch (the format's reference), float32 matmul.
Transformer Engine is a separate backend (its own issue).
Weights use 128x128 blocks when the format's scaling is `block` (activations use 1x128).
"""

from __future__ import annotations

import torch

from trace_rl.backends.base import Availability, Backend, PackedWeight, default_device
from trace_rl.backends.registry import register_backend
from trace_rl.formats import FP8_FORMATS, get_format, per_token


def weight_format(fmt: str) -> str:
    """fp8 weights scale 128x128 blocks where activations scale 1x128 blocks."""
    return fmt + "128x128" if fmt.endswith(":block") else fmt


def _scaled_mm_ok(x: torch.Tensor, packed: PackedWeight, act_fmt: str) -> bool:
    if not x.is_cuda or torch.cuda.get_device_capability(x.device) < (8, 9):
        return False
    w_fmt, a_fmt = get_format(packed.fmt), get_format(per_token(act_fmt)) if act_fmt != "bf16" else None
    return (a_fmt is not None and w_fmt.element == a_fmt.element == "e4m3"
            and w_fmt.scaling in ("tensor", "row") and packed.in_features % 16 == 0
            and packed.out_features % 16 == 0)


@register_backend("fp8")
class FP8Backend(Backend):
    weight_formats = FP8_FORMATS

    def available(self, device=None) -> Availability:
        device = torch.device(device) if device is not None else default_device()
        if device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9):
            return Availability(True, "fp8.scaled_mm")
        why = "no GPU" if device.type != "cuda" else "GPU compute capability < 8.9 has no FP8 matmul"
        return Availability(True, "fp8.emulated", f"{why}: FP8 is emulated (quantize -> dequantize -> matmul)")

    def prepare_weight(self, weight: torch.Tensor, fmt: str) -> PackedWeight:
        self.check_format(fmt)
        fmt = weight_format(fmt)
        n, k = weight.shape
        return PackedWeight(fmt, n, k, q=get_format(fmt).quantize(weight.detach()))

    def check_format(self, fmt: str) -> None:
        super().check_format(fmt.removesuffix("128x128"))

    def linear(self, x, packed, act_fmt="bf16", bias=None):
        if act_fmt != "bf16" and not act_fmt.startswith("fp8"):
            raise ValueError(f"fp8 backend: activations must be bf16 or fp8, got {act_fmt!r}")
        if _scaled_mm_ok(x, packed, act_fmt):
            self.paths.record("fp8.scaled_mm")
            return self._scaled_mm(x, packed, act_fmt, bias)
        self.paths.record("fp8.emulated")
        xf = x.float()
        if act_fmt != "bf16":
            xf = get_format(per_token(act_fmt)).fake_quantize(xf)
        y = xf @ packed.dequantized().T
        if bias is not None:
            y = y + bias.float()
        return y.to(x.dtype)

    @staticmethod
    def _scaled_mm(x, packed, act_fmt, bias):
        lead, k = x.shape[:-1], x.shape[-1]
        x2 = x.reshape(-1, k)
        qa = get_format(per_token(act_fmt)).quantize(x2)
        a_scale = qa.scales.reshape(-1, 1) if qa.scales.dim() else qa.scales.reshape(1, 1).expand(x2.shape[0], 1)
        w = packed.q
        b_scale = (w.scales.reshape(1, -1) if w.scales.dim() else w.scales.reshape(1, 1).expand(1, packed.out_features))
        y = torch._scaled_mm(qa.codes, w.codes.t(), scale_a=a_scale.contiguous().float(),
                             scale_b=b_scale.contiguous().float(), out_dtype=torch.bfloat16)
        if bias is not None:
            y = y + bias.to(y.dtype)
        return y.to(x.dtype).reshape(*lead, packed.out_features)
