"""`TraceLinearMethod`: a vLLM linear method computing with trace_rl's backends (buffers + forward).

- `create_weights`: the checkpoint's weight, unquantized, in the model dtype (vLLM's own loaders fill it,
  shard by shard for fused layers).
- `process_weights_after_loading`: quantizes it per output row to the plan's format with the backend's
  `prepare_weight` (the codes and scales of trace_rl's reference, bit for bit) into buffers, and drops the
  unquantized weight. vLLM fuses q/k/v and gate/up into one layer; formats whose scales span rows
  (nvfp4's per-tensor global scale, fp8 per-tensor or 128x128 blocks) are quantized per part, so every
  part gets the codes our decoder's own layer would get. Row-independent formats (`FUSABLE_WEIGHT_FORMATS`)
  are quantized as one stack: the same codes, one matmul.
- `apply`: `backend.linear` per part (activations quantized per token inside; Triton kernels on GPU,
  the emulated reference on CPU, reported by the backend's PathReport), outputs concatenated.

Weight sync: vLLM's `reload_weights` rebuilds the layer's tensors on the meta device, loads, runs
`process_weights_after_loading` again and copies the result into the same storage. The `PackedWeight`
views (and the emulation's dequantized cache) are rebuilt on the next forward because processing resets
them. Under tensor parallelism vLLM hands each rank a slice of the weight: nvfp4's global scale is then
per slice, which differs from the unsharded model (the engine warns).
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.linear import LinearMethodBase
from vllm.model_executor.parameter import ModelWeightParameter
from vllm.model_executor.utils import set_weight_attrs

from trace_rl.backends.base import PackedWeight
from trace_rl.backends.registry import backend_for_format
from trace_rl.formats import QTensor
from trace_rl.models.linear import FUSABLE_WEIGHT_FORMATS

_FIELDS = ("codes", "scales", "global_scale")


class TraceLinearMethod(LinearMethodBase):
    def __init__(self, weight_fmt: str, act_fmt: str):
        self.weight_fmt, self.act_fmt = weight_fmt, act_fmt
        self.backend = backend_for_format(weight_fmt)

    def create_weights(self, layer: torch.nn.Module, input_size_per_partition: int,
                       output_partition_sizes: list[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        weight_loader = extra_weight_attrs.pop("weight_loader")
        weight = ModelWeightParameter(
            data=torch.empty(sum(output_partition_sizes), input_size_per_partition, dtype=params_dtype),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)
        fused_whole = self.weight_fmt in FUSABLE_WEIGHT_FORMATS
        layer.trace_parts = (sum(output_partition_sizes),) if fused_whole else tuple(output_partition_sizes)
        layer.trace_in_features = input_size_per_partition
        layer.trace_packed = None

    @torch.no_grad()
    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        if "weight" not in layer._parameters:      # already processed (vLLM may call twice)
            return
        for i, part in enumerate(layer.weight.data.split(layer.trace_parts)):
            q = self.backend.prepare_weight(part, self.weight_fmt).q
            for field in _FIELDS:
                layer.register_buffer(f"trace_w{i}_{field}", getattr(q, field))
        layer.trace_q_format = q.format            # e.g. fp8 block weights are 'fp8_e4m3:block128x128'
        del layer.weight
        layer.trace_packed = None              # views over the buffers are (re)built by the next forward

    def _packed(self, layer: torch.nn.Module) -> list[PackedWeight]:
        if layer.trace_packed is None:
            parts, k = [], layer.trace_in_features
            for i, n in enumerate(layer.trace_parts):
                codes, scales, glob = (getattr(layer, f"trace_w{i}_{f}") for f in _FIELDS)
                q = QTensor(codes, scales, glob, (n, k), layer.params_dtype, layer.trace_q_format)
                parts.append(PackedWeight(layer.trace_q_format, n, k, q=q))
            layer.trace_packed = parts
        return layer.trace_packed

    def apply(self, layer: torch.nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        parts = self._packed(layer)
        biases = bias.split(layer.trace_parts) if bias is not None else [None] * len(parts)
        outs = [self.backend.linear(x, p, self.act_fmt, b) for p, b in zip(parts, biases)]
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-1)
