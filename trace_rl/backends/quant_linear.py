"""`QuantLinear`: a Linear whose weight lives in a backend's packed format (buffers + forward, gpt-fast style).

The packed weight is held in registered buffers (`w_codes`, `w_scales`, `w_global_scale`, or `weight`
for bf16), so `.to(device)` and `state_dict()` carry it, and `load_weight` re-quantizes into the same
buffers in place: a captured CUDA graph stays valid across weight syncs. `packed`'s QTensor views those buffers
(not copies), so a backend's `quantize_into` (fp4: quantize + Hopper re-layout fused) writes them directly.
"""

from __future__ import annotations

import contextlib
import sys

import torch
from torch import nn

from trace_rl.backends.base import PackedWeight
from trace_rl.backends.registry import backend_for_format
from trace_rl.formats import QTensor


class QuantLinear(nn.Module):
    """y = act_quant(x) @ W^T + b with W stored quantized per output row."""

    def __init__(self, weight: torch.Tensor, weight_fmt: str, act_fmt: str = "bf16",
                 bias: torch.Tensor | None = None):
        super().__init__()
        self.backend = backend_for_format(weight_fmt)
        self.out_features, self.in_features = weight.shape
        self.act_fmt = act_fmt
        packed = self.backend.prepare_weight(weight, weight_fmt)
        self.weight_fmt = packed.fmt
        if packed.q is None:
            self.register_buffer("weight", packed.weight.clone())
        else:
            q = packed.q
            self.register_buffer("w_codes", q.codes)
            self.register_buffer("w_scales", q.scales)
            self.register_buffer("w_global_scale", q.global_scale)
            self._q_meta = (q.shape, q.dtype, q.format)
        self.register_buffer("bias", None if bias is None else bias.detach().clone())
        self._packed_cache: tuple[tuple, PackedWeight] | None = None

    @classmethod
    def from_linear(cls, linear: nn.Linear, weight_fmt: str, act_fmt: str = "bf16") -> QuantLinear:
        return cls(linear.weight.detach(), weight_fmt, act_fmt, linear.bias)

    @property
    def packed(self) -> PackedWeight:
        """The PackedWeight view of the buffers (rebuilt when the buffers move or are replaced)."""
        tensors = (self.weight,) if self.weight_fmt == "bf16" else (self.w_codes, self.w_scales, self.w_global_scale)
        key = tuple((t.data_ptr(), t.device, t.dtype) if t is not None else None for t in tensors)
        if self._packed_cache is None or self._packed_cache[0] != key:
            if self.weight_fmt == "bf16":
                p = PackedWeight("bf16", self.out_features, self.in_features, weight=self.weight)
            else:
                shape, dtype, fmt = self._q_meta
                q = QTensor(self.w_codes, self.w_scales, self.w_global_scale, shape, dtype, fmt)
                p = PackedWeight(fmt, self.out_features, self.in_features, q=q)
            self._packed_cache = (key, p)
        return self._packed_cache[1]

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    amax_bits: torch.Tensor | None = None) -> None:
        """Re-quantize a new weight of the same shape into the existing buffers (no reallocation). `amax_bits`:
        the fused nvfp4 path's tensor amax computed ahead (`load_linear_weights`)."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(f"QuantLinear.load_weight: shape {tuple(weight.shape)} != "
                             f"{(self.out_features, self.in_features)}")
        fresh: tuple[str, ...] = ()
        if self.weight_fmt == "bf16":
            self.weight.copy_(weight)
        else:
            # fast path (fp4 on the GPU, layout derived): quantize + re-layout in one pass into the buffers
            fresh = self.backend.quantize_into(weight, self.packed, amax_bits)
            if not fresh:
                q = self.backend.prepare_weight(weight.to(self.w_codes.device), self.weight_fmt).q
                self.w_codes.copy_(q.codes)
                self.w_scales.copy_(q.scales)
                if self.w_global_scale is not None:
                    self.w_global_scale.copy_(q.global_scale)
        if bias is not None and self.bias is not None:
            self.bias.copy_(bias)
        self.packed.refresh_layouts(fresh)  # emulation's dequantized copy and the other kernel layouts are stale now

    def dequantized_weight(self) -> torch.Tensor:
        return self.packed.dequantized()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.backend.linear(x, self.packed, self.act_fmt, self.bias)

    def extra_repr(self) -> str:
        return (f"in={self.in_features}, out={self.out_features}, weight={self.weight_fmt}, act={self.act_fmt}, "
                f"backend={self.backend.name}")


@torch.no_grad()
def load_linear_weights(items: list[tuple[QuantLinear, torch.Tensor, torch.Tensor | None]]) -> None:
    """`layer.load_weight(weight, bias)` for each (layer, weight, bias); the nvfp4 layers on the fused path get
    their tensor amaxes from one launch over all their weights (`weight_quantize.weights_amax_bits`) instead of a
    launch each (each launch's ramp and tail: ~1 ms of the 8B sync's 4.2 ms amax pass, estimated). Same bits. FP8
    operand caches are checked once for the whole call (`fp8_sync_check`)."""
    with fp8_sync_check():
        _load_linear_weights(items)


def _load_linear_weights(items) -> None:
    items = [(layer, w.detach().to(layer.w_codes.device).contiguous() if layer.weight_fmt != "bf16" else w, b)
             for layer, w, b in items]
    ahead = [i for i, (layer, w, _) in enumerate(items)
             if layer.weight_fmt == "nvfp4" and layer.backend.fused_sync_ready(w, layer.packed)]
    ws = [items[i][1] for i in ahead]
    amax: dict[int, torch.Tensor] = {}
    if len(ws) > 1:
        from trace_rl.kernels.weight_quantize import weights_amax_bits, weights_amax_ok

        if weights_amax_ok(ws):
            bits = weights_amax_bits(ws)
            amax = {i: bits[j:j + 1] for j, i in enumerate(ahead)}
    for i, (layer, w, b) in enumerate(items):
        layer.load_weight(w, b, amax.get(i))


def fp8_sync_check():
    """The context a weight sync runs in: FP8 operand caches (`kernels.operand_cache_fp8`, mxfp4) refreshed inside it
    add their inexactness to device slots and ONE host read at the end raises `InexactWeight` naming every weight
    that no longer fits (`deferred_exactness_check`), instead of a read (a wait for the GPU) per weight: check
    `fp8sync` times both. A no-op context while that module was never imported: no FP8 cache can exist then (and
    this module must import without Triton)."""
    mod = sys.modules.get("trace_rl.kernels.operand_cache_fp8")
    return mod.deferred_exactness_check() if mod is not None else contextlib.nullcontext()
