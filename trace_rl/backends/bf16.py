"""bf16 backend: no quantization; Linear weights stay in the model's dtype (bf16, or float32 in CPU tests)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from trace_rl.backends.base import Availability, Backend, PackedWeight
from trace_rl.backends.registry import register_backend


@register_backend("bf16")
class BF16Backend(Backend):
    weight_formats = ("bf16",)

    def available(self, device=None) -> Availability:
        return Availability(True, "bf16.torch")

    def prepare_weight(self, weight: torch.Tensor, fmt: str = "bf16") -> PackedWeight:
        self.check_format(fmt)
        return PackedWeight("bf16", weight.shape[0], weight.shape[1], weight=weight.detach())

    def linear(self, x, packed, act_fmt="bf16", bias=None):
        if act_fmt != "bf16":
            raise ValueError(f"the bf16 backend computes in high precision; activation format {act_fmt!r} "
                             f"needs the fp8 or fp4 backend")
        self.paths.record("bf16.torch")
        return F.linear(x, packed.weight.to(x.dtype), None if bias is None else bias.to(x.dtype))
