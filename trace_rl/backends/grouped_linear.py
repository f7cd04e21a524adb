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
backends, `stacked()` all of them as the [E, N, K] PackedWeight of the grouped FP4 kernel (views of the
same buffers, no second copy of the codes). `load_weight` re-quantizes in place and re-derives the kernel
layouts in place, so captured CUDA graphs stay valid.

Forward over a buffer of rows sorted by expert (`trace_rl.models.grouped.permute`), `ends [E]` int32 on the
device. Paths (recorded as `experts.<path>` in the backend's `paths`, never silent):
- `grouped_mm` (bf16 weights where `torch._grouped_mm` runs): one launch, no host sync.
- `fp4_grouped` (nvfp4/mxfp4 weights, W4A16 or W4A4, on CUDA with the fp4 backend's kernels):
  `kernels.linear.fp4_grouped_linear` over the stacked Hopper layout, one launch (W4A4: plus the per-token
  activation quantization launch), offsets [0, *ends] built on the device: no host sync, CUDA-graph
  capturable. The layout (the kernel's arrangement of the codes and scales, like a dense FP4 `QuantLinear`'s)
  is derived on the first forward, or ahead of it with `derive_kernel_layout()`.
- `loop`: each expert's rows through its backend's linear (`fp8.*`, `fp4.emulated`, bf16 with quantized
  activations), group bounds read on the host — correct everywhere, eager only (no CUDA graph). FP8
  experts take it on every device (no grouped FP8 kernel), FP4 experts on CPU (emulation).
"""

from __future__ import annotations

import torch
from torch import nn

from trace_rl.backends.base import PackedWeight
from trace_rl.backends.registry import backend_for_format
from trace_rl.formats import QTensor

GROUPED_PATHS = ("grouped_mm", "fp4_grouped", "loop")
FP4_GROUPED_FORMATS = ("nvfp4", "mxfp4")


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
        raise ValueError(f"grouped_mm path {path!r}; known: grouped_mm, loop")
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
            self._q_meta = (tuple(packs[0].shape), packs[0].dtype, packs[0].format)
            self.weight_fmt = packs[0].format
        self.force_path: str | None = None   # None: `path(x)` picks; tests force "fp4_grouped" on CPU (interpreter)
        self._views: dict[int, tuple[tuple, PackedWeight]] = {}
        self._stacked: tuple[tuple, PackedWeight] | None = None
        self._fp4_kernels: dict[torch.device, bool] = {}

    def _tensors(self) -> tuple:
        return (self.weight,) if self.weight_fmt == "bf16" else (self.w_codes, self.w_scales, self.w_global_scale)

    def _key(self) -> tuple:
        return tuple((t.data_ptr(), t.device) if t is not None else None for t in self._tensors())

    def packed(self, e: int) -> PackedWeight:
        """Expert e's PackedWeight (views of the stacked buffers; rebuilt when the buffers move)."""
        key = self._key()
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

    def stacked(self) -> PackedWeight:
        """All experts as one PackedWeight with q [E, N, K] (what `backends.fp4.prepare_expert_weights` returns),
        viewing the stacked buffers (nvfp4 global scales viewed [E, 1, 1]); rebuilt when the buffers move."""
        if self.weight_fmt == "bf16":
            raise ValueError("GroupedQuantLinear.stacked: bf16 experts have no packed form (use `weight`)")
        key = self._key()
        if self._stacked is None or self._stacked[0] != key:
            shape, dtype, fmt = self._q_meta
            g = None if self.w_global_scale is None else self.w_global_scale.view(self.num_experts, 1, 1)
            q = QTensor(self.w_codes, self.w_scales, g, (self.num_experts, *shape), dtype, fmt)
            self._stacked = (key, PackedWeight(fmt, self.out_features, self.in_features, q=q))
        return self._stacked[1]

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self._tensors() if t is not None)

    def _fp4_kernels_run(self, device: torch.device) -> bool:
        """The fp4 backend's Triton kernels run on this device (CUDA, kernels importable, not the interpreter)."""
        if device not in self._fp4_kernels:
            self._fp4_kernels[device] = self.backend.available(device).path == "fp4.triton"
        return self._fp4_kernels[device]

    def path(self, x: torch.Tensor) -> str:
        """The path a forward on `x` takes (`force_path` when set)."""
        if self.force_path is not None:
            return self.force_path
        if self.weight_fmt == "bf16" and self.act_fmt == "bf16" and grouped_mm_runs(x, self.weight):
            return "grouped_mm"
        if self.weight_fmt in FP4_GROUPED_FORMATS and x.is_cuda and self._fp4_kernels_run(x.device):
            return "fp4_grouped"
        return "loop"

    def capturable(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Can a CUDA graph capture this forward (no host sync)?"""
        x = torch.empty(0, self.in_features, device=device, dtype=dtype)
        return device.type == "cuda" and self.path(x) in ("grouped_mm", "fp4_grouped")

    def row_align(self, x: torch.Tensor) -> int:
        """Rows per group multiple this path wants: 8 for `torch._grouped_mm` on CUDA (as torchtitan pads), else
        1 (the FP4 grouped kernel takes any offsets; padding rows would only add work)."""
        return 8 if x.is_cuda and self.path(x) == "grouped_mm" else 1

    def derive_kernel_layout(self) -> None:
        """Derive the FP4 grouped kernel's layout now (else on the first forward): before sizing a KV cache to
        the free memory, or before a CUDA-graph capture. No-op for other paths."""
        x = torch.empty(0, self.in_features, device=self._tensors()[0].device)
        if self.path(x) == "fp4_grouped":
            from trace_rl.kernels.linear import hopper_weight

            hopper_weight(self.stacked())

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor) -> None:
        """Re-quantize new expert weights [E, N, K] into the existing buffers (no reallocation) and re-derive
        the kernel layouts in place: a CUDA graph that captured this layer stays valid."""
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
        self.refresh_layouts()

    def refresh_layouts(self) -> None:
        """The buffers were rewritten in place (`load_weight`, or a packed weight sync copying into them):
        drop emulation's dequantized copies, re-derive kernel layouts in place."""
        views = [p for _, p in self._views.values()] + ([self._stacked[1]] if self._stacked is not None else [])
        for p in views:
            p.refresh_layouts()

    def forward(self, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """x [rows, K] sorted by expert, `ends [E]` int32 -> [rows, N] (rows past ends[-1]: unspecified)."""
        path = self.path(x)
        self.backend.paths.record(f"experts.{path}")
        if path == "grouped_mm":
            return torch._grouped_mm(x, self.weight.transpose(1, 2), offs=ends)
        if path == "fp4_grouped":
            return self._fp4_grouped(x, ends)
        if path != "loop":
            raise ValueError(f"GroupedQuantLinear: path {path!r}; known: {', '.join(GROUPED_PATHS)}")
        return grouped_loop(x, ends, lambda e, rows: self.backend.linear(rows, self.packed(e), self.act_fmt),
                            self.out_features)

    def _fp4_grouped(self, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        from trace_rl.kernels import interpreting

        if self.weight_fmt not in FP4_GROUPED_FORMATS:
            raise ValueError(f"GroupedQuantLinear: the fp4_grouped path takes nvfp4/mxfp4 experts, these are "
                             f"{self.weight_fmt}")
        if not (x.is_cuda or interpreting()):
            raise RuntimeError("GroupedQuantLinear: the fp4_grouped path runs the Triton kernel on CUDA tensors "
                               "(on CPU only under TRITON_INTERPRET=1, for tests); leave force_path None here")
        from trace_rl.kernels.linear import fp4_grouped_linear

        offsets = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)     # [0, *ends] on the device, no sync
        return fp4_grouped_linear(x, offsets, self.stacked(), self.act_fmt)

    def extra_repr(self) -> str:
        return (f"experts={self.num_experts}, in={self.in_features}, out={self.out_features}, "
                f"weight={self.weight_fmt}, act={self.act_fmt}, backend={self.backend.name}")
