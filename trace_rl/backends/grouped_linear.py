"""Grouped matmuls for mixture-of-experts layers: `grouped_mm` (plain weights, the trainer) and
`GroupedQuantLinear` (packed weights, the rollout).

`grouped_mm(x, w, ends)`: `torch._grouped_mm` where its fast path runs (CUDA sm_90/sm_100 in bf16; on CPU
without autograd), else `grouped_loop`, a reference loop over the experts that reads the group bounds on
the host (eager only).

`GroupedQuantLinear`: the weights of E experts, each one packed exactly like a `QuantLinear` (buffers +
forward), stacked along a leading expert dimension.

Expert e's packed weight is what `QuantLinear(weight[e], fmt)` would hold — its own per-row scales and,
for nvfp4, its own global scale — so a plan quantizes an expert like any other Linear. The buffers are
stacked (`w_codes [E, N, K/2]`, `w_scales [E, N, ...]`, `w_global_scale [E]`, or `weight [E, N, K]` for
bf16) so a grouped kernel reads them in one launch; `packed(e)` views one expert for the per-linear
backends. `load_weight` re-quantizes in place (captured CUDA graphs stay valid).

Forward over a buffer of rows sorted by expert (`trace_rl.models.grouped.permute`), `ends [E]` int32:
- `grouped_mm` (bf16 weights where `torch._grouped_mm` runs): one launch, no host sync.
- `loop`: each expert's rows through its backend's linear (`fp4.triton`, `fp8.*`, emulated, bf16), group
  bounds read on the host — correct everywhere, eager only (no CUDA graph). FP4/FP8 experts take this
  path until a grouped FP4 kernel exists (docs/models.md, "Mixture of experts").
"""

from __future__ import annotations

import torch
from torch import nn

from trace_rl.backends.base import PackedWeight
from trace_rl.backends.registry import backend_for_format
from trace_rl.formats import QTensor

GROUPED_PATHS = ("grouped_mm", "loop")


def grouped_mm_runs(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Does `torch._grouped_mm` run here without a host sync (and with autograd where it is needed)?"""
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype:
        return False
    if x.is_cuda:
        # the CUTLASS fast path; torch's fallback reads the offsets on the host (a sync)
        return x.dtype == torch.bfloat16 and torch.cuda.get_device_capability(x.device)[0] in (9, 10)
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or w.requires_grad)
    # CPU: forward only (torch 2.13's CPU backward of _grouped_mm fails: "Invalid strides/sizes")
    return x.device.type == "cpu" and x.dtype in (torch.float32, torch.bfloat16) and not needs_grad


def grouped_mm(x: torch.Tensor, w: torch.Tensor, ends: torch.Tensor, path: str | None = None) -> torch.Tensor:
    """y[r] = x[r] @ w[e]^T for the rows r of expert e's group; x [rows, K], w [E, N, K], ends [E] int32.

    `path`: None picks `grouped_mm` where it runs, else `loop`. Rows past ends[-1]: unspecified."""
    path = path or ("grouped_mm" if grouped_mm_runs(x, w) else "loop")
    if path == "grouped_mm":
        return torch._grouped_mm(x, w.transpose(1, 2), offs=ends)
    if path != "loop":
        raise ValueError(f"grouped_mm path {path!r}; known: {', '.join(GROUPED_PATHS)}")
    return grouped_loop(x, ends, lambda e, rows: rows @ w[e].to(rows.dtype).T, w.shape[1])


def grouped_loop(x: torch.Tensor, ends: torch.Tensor, linear, out_features: int) -> torch.Tensor:
    """The reference: `linear(e, x[group e])` per non-empty group (the bounds are read on the host)."""
    bounds = [0, *ends.tolist()]
    parts = []
    for e in range(len(bounds) - 1):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            parts.append(linear(e, x[lo:hi]))
    parts.append(x.new_zeros(x.shape[0] - bounds[-1], out_features))
    return torch.cat(parts)


class GroupedQuantLinear(nn.Module):
    def __init__(self, weight: torch.Tensor, weight_fmt: str, act_fmt: str = "bf16"):
        super().__init__()
        if weight.dim() != 3:
            raise ValueError(f"GroupedQuantLinear takes [experts, out, in] weights, got {tuple(weight.shape)}")
        self.backend = backend_for_format(weight_fmt)
        self.num_experts, self.out_features, self.in_features = weight.shape
        self.weight_fmt, self.act_fmt = weight_fmt, act_fmt
        if weight_fmt == "bf16":
            self.register_buffer("weight", weight.detach())
        else:
            packs = [self.backend.prepare_weight(weight[e], weight_fmt).q for e in range(self.num_experts)]
            stack = lambda ts: None if ts[0] is None else torch.stack(ts)  # noqa: E731
            self.register_buffer("w_codes", stack([q.codes for q in packs]))
            self.register_buffer("w_scales", stack([q.scales for q in packs]))
            self.register_buffer("w_global_scale", stack([q.global_scale for q in packs]))
            self._q_meta = (packs[0].shape, packs[0].dtype, packs[0].format)
            self.weight_fmt = packs[0].format
        self._views: dict[int, tuple[tuple, PackedWeight]] = {}

    def _tensors(self) -> tuple:
        return (self.weight,) if self.weight_fmt == "bf16" else (self.w_codes, self.w_scales, self.w_global_scale)

    def packed(self, e: int) -> PackedWeight:
        """Expert e's PackedWeight (views of the stacked buffers; rebuilt when the buffers move)."""
        key = tuple((t.data_ptr(), t.device) if t is not None else None for t in self._tensors())
        cached = self._views.get(e)
        if cached is None or cached[0] != key:
            if self.weight_fmt == "bf16":
                p = PackedWeight("bf16", self.out_features, self.in_features, weight=self.weight[e])
            else:
                shape, dtype, fmt = self._q_meta
                view = lambda t: None if t is None else t[e]  # noqa: E731
                q = QTensor(self.w_codes[e], view(self.w_scales), view(self.w_global_scale), shape, dtype, fmt)
                p = PackedWeight(fmt, self.out_features, self.in_features, q=q)
            cached = self._views[e] = (key, p)
        return cached[1]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._tensors() if t is not None)

    def path(self, x: torch.Tensor) -> str:
        if self.weight_fmt == "bf16" and self.act_fmt == "bf16" and grouped_mm_runs(x, self.weight):
            return "grouped_mm"
        return "loop"

    def capturable(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Can a CUDA graph capture this forward (no host sync)?"""
        x = torch.empty(0, self.in_features, device=device, dtype=dtype)
        return device.type == "cuda" and self.path(x) == "grouped_mm"

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor) -> None:
        """Re-quantize new expert weights [E, N, K] into the existing buffers (no reallocation)."""
        if tuple(weight.shape) != (self.num_experts, self.out_features, self.in_features):
            raise ValueError(f"GroupedQuantLinear.load_weight: shape {tuple(weight.shape)} != "
                             f"{(self.num_experts, self.out_features, self.in_features)}")
        if self.weight_fmt == "bf16":
            self.weight.copy_(weight)
        else:
            for e in range(self.num_experts):
                q = self.backend.prepare_weight(weight[e].to(self.w_codes.device), self.weight_fmt).q
                self.w_codes[e].copy_(q.codes)
                if self.w_scales is not None:
                    self.w_scales[e].copy_(q.scales)
                if self.w_global_scale is not None:
                    self.w_global_scale[e].copy_(q.global_scale)
        for _, p in self._views.values():   # emulation's dequantized copies and kernel layouts are stale
            p.cache.clear()
            p.layout.clear()

    def forward(self, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """x [rows, K] sorted by expert, `ends [E]` int32 -> [rows, N] (rows past ends[-1]: unspecified)."""
        path = self.path(x)
        self.backend.paths.record(f"experts.{path}")
        if path == "grouped_mm":
            return torch._grouped_mm(x, self.weight.transpose(1, 2), offs=ends)
        return grouped_loop(x, ends, lambda e, rows: self.backend.linear(rows, self.packed(e), self.act_fmt),
                            self.out_features)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, in={self.in_features}, out={self.out_features}, "
                f"weight={self.weight_fmt}, act={self.act_fmt}, backend={self.backend.name}")
