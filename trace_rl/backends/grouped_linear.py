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
same buffers, no second copy of the codes).

Stacked parts (`parts=2`: an MoE layer's gate | up, one GEMM launch for both): each part of an expert is
quantized as its own Linear would be. Row-local formats (mxfp4, fp8 per row) need nothing for that; nvfp4
keeps each part's own global scale per row (`w_global_scale [E, N, 1]`, row r holding its part's global), which
the Hopper layout's per-row factor, the relayout kernel and the format's dequantization take as they are: codes,
scales and outputs are the unstacked pair's, bit for bit (`backends.grouped_parts`). Formats whose scales span
rows refuse parts.

`load_weight` re-quantizes in place and re-derives the kernel layouts in place, so captured CUDA graphs stay
valid.

Forward over a buffer of rows sorted by expert (`trace_rl.models.grouped.permute`), `ends [E]` int32 on the
device. Paths (recorded as `experts.<path>` in the backend's `paths`, never silent):
- `grouped_mm` (bf16 weights where `torch._grouped_mm` runs): one launch, no host sync.
- `fp4_grouped` (nvfp4/mxfp4 weights, W4A16 or W4A4, on CUDA with the fp4 backend's kernels):
  `kernels.linear.fp4_grouped_linear` over the stacked Hopper layout, one launch (W4A4: plus the per-token
  activation quantization launch), offsets [0, *ends] built on the device: no host sync, CUDA-graph
  capturable. The layout (the kernel's arrangement of the codes and scales, like a dense FP4 `QuantLinear`'s)
  is derived on the first forward, or ahead of it with `derive_kernel_layout()`. The GEMM is the Gluon grouped
  kernel or the Triton one by `kernels.grouped_dispatch`'s rule (sm_90, Triton 3.6, the launcher's shapes, the
  mean rows per expert where the H200 measured it faster; `GLUON_GROUPED = False` turns it off), recorded as
  `experts.fp4_grouped.gluon` / `experts.fp4_grouped.triton` after `experts.fp4_grouped`.
- `fp8_grouped` (E4M3 weights per row or per tensor, E4M3 activations per token, where the fp8 backend's dense
  linears take `fp8.scaled_mm.rowwise`, on sm_90): `torch._scaled_grouped_mm` (CUTLASS, 2-D x 3-D with
  `offs` = ends) over the stacked codes, scale_a [rows] (each row's per-token scale: the quantize kernel, bit for
  bit the format reference the dense path runs), scale_b [E, N], bf16 out, fp32 accumulation as `torch._scaled_mm`: the
  same codes and scales as the per-expert loop, the sums in another order (<= 1 bf16 ulp apart). One launch
  plus the activation quantization ops, no host sync, CUDA-graph capturable. Groups aligned to 16 rows (16
  bytes of E4M3, as torchtitan aligns FP8 groups). Whether it runs here is probed once per device
  (`fp8_grouped_support`: a small problem against the loop); if not, the reason is logged and `loop` runs.
- `loop`: each expert's rows through its backend's linear (`fp8.*`, `fp4.emulated`, bf16 with quantized
  activations), group bounds read on the host — correct everywhere, eager only (no CUDA graph). FP8
  experts take it off sm_90 (or with block scales, TE, tensor-scaled activations), FP4 experts on CPU.

Rollout capacity (`offload_reference`): once the FP4 kernel layout is derived, the reference codes are a second
copy of the experts on the GPU (~16 GB at Qwen3-30B-A3B). `offload_reference()` moves them to host memory: the
kernel reads only its layout; `state_dict` (packed weight sync), `packed(e)`/`stacked()` (CPU paths, tests)
still see them; `load_weight` and `refresh_layouts` re-derive the layout on the GPU expert by expert. A path
that would read them on the GPU (`loop` on CUDA) raises, naming `restore_reference()`.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from trace_rl.backends.base import PackedWeight
from trace_rl.backends.grouped_gemms import (  # noqa: F401 -- grouped_mm, grouped_mm_runs: re-exported (models.moe)
    FP8_GROUPED_ALIGN,
    fp8_grouped,
    fp8_grouped_why_not,
    grouped_loop,
    grouped_mm,
    grouped_mm_runs,
)
from trace_rl.backends.grouped_parts import PART_SCALED_FORMATS, check_parts, stack_parts
from trace_rl.backends.registry import backend_for_format
from trace_rl.formats import QTensor, get_format
from trace_rl.op_ranges import op_range

log = logging.getLogger("trace_rl.backends.grouped_linear")

GROUPED_PATHS = ("grouped_mm", "fp4_grouped", "fp8_grouped", "loop")
FP4_GROUPED_FORMATS = ("nvfp4", "mxfp4")


class GroupedQuantLinear(nn.Module):
    REDERIVE_CHUNK = 16      # experts per re-derivation step of an offloaded layout (bounds its temporaries)

    def __init__(self, weight: torch.Tensor, weight_fmt: str, act_fmt: str = "bf16", parts: int = 1):
        super().__init__()
        if weight.dim() != 3:
            raise ValueError(f"GroupedQuantLinear takes [experts, out, in] weights, got {tuple(weight.shape)}")
        self.backend = backend_for_format(weight_fmt)
        self.num_experts, self.out_features, self.in_features = weight.shape
        self.weight_fmt, self.act_fmt = weight_fmt, act_fmt
        self.parts = check_parts(weight_fmt, self.out_features, parts)
        if weight_fmt == "bf16":
            self.register_buffer("weight", weight.detach())
        else:
            packs = [self._quantize_expert(weight[e]) for e in range(self.num_experts)]
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
        self._fp8_why: dict[torch.device, str] = {}
        self._fp8_scale_b: tuple[tuple, torch.Tensor] | None = None   # (buffer key, [E, N] float32 scales)
        self.compute_device: torch.device | None = None   # set by offload_reference: where the kernel layout lives

    def _quantize_expert(self, w: torch.Tensor) -> QTensor:
        """Expert weight [N, K] -> its QTensor: each of the `parts` row blocks quantized as its own Linear
        (`stack_parts`), or the whole at once (one part, or a row-local format where that is the same)."""
        fmt = self.weight_fmt
        if self.parts == 1 or get_format(fmt).name not in PART_SCALED_FORMATS:
            return self.backend.prepare_weight(w, fmt).q
        return stack_parts([self.backend.prepare_weight(p, fmt).q for p in w.chunk(self.parts)])

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
                g = view(self.w_global_scale)
                g = g if g is None or g.dim() == 0 else g.view(-1, 1)    # per-part globals, one per row [N, 1]
                q = QTensor(self.w_codes[e], view(self.w_scales), g, shape, dtype, fmt)
                p = PackedWeight(fmt, self.out_features, self.in_features, q=q)
            cached = self._views[e] = (key, p)
        return cached[1]

    def stacked(self) -> PackedWeight:
        """All experts as one PackedWeight with q [E, N, K] (what `backends.fp4.prepare_expert_weights` returns),
        viewing the stacked buffers (nvfp4 global scales viewed [E, 1, 1], or [E, N, 1] per row with `parts`);
        rebuilt when the buffers move."""
        if self.weight_fmt == "bf16":
            raise ValueError("GroupedQuantLinear.stacked: bf16 experts have no packed form (use `weight`)")
        key = self._key()
        if self._stacked is None or self._stacked[0] != key:
            shape, dtype, fmt = self._q_meta
            g = None if self.w_global_scale is None else self.w_global_scale.view(self.num_experts, -1, 1)
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

    def fp8_why_not(self, device: torch.device) -> str:
        """'' when FP8 experts take `fp8_grouped` on `device`, else why they take the loop."""
        device = torch.device(device)
        if device not in self._fp8_why:
            self._fp8_why[device] = fp8_grouped_why_not(device, self.weight_fmt, self.act_fmt, self.out_features,
                                                        self.in_features, self.backend)
        return self._fp8_why[device]

    def path(self, x: torch.Tensor) -> str:
        """The path a forward on `x` takes (`force_path` when set)."""
        if self.force_path is not None:
            return self.force_path
        if self.weight_fmt == "bf16" and self.act_fmt == "bf16" and grouped_mm_runs(x, self.weight):
            return "grouped_mm"
        if self.weight_fmt in FP4_GROUPED_FORMATS and x.is_cuda and self._fp4_kernels_run(x.device):
            return "fp4_grouped"
        if self.weight_fmt.startswith("fp8") and x.is_cuda and not self.fp8_why_not(x.device):
            return "fp8_grouped"
        return "loop"

    def capturable(self, device: torch.device, dtype: torch.dtype) -> bool:
        """Can a CUDA graph capture this forward (no host sync)?"""
        x = torch.empty(0, self.in_features, device=device, dtype=dtype)
        return device.type == "cuda" and self.path(x) in ("grouped_mm", "fp4_grouped", "fp8_grouped")

    def row_align(self, x: torch.Tensor) -> int:
        """Rows per group multiple this path wants: 8 for `torch._grouped_mm` on CUDA and 16 for
        `torch._scaled_grouped_mm` (16 bytes, as torchtitan pads), else 1 (the FP4 grouped kernel takes any
        offsets; padding rows would only add work)."""
        path = self.path(x) if x.is_cuda else "loop"
        return {"grouped_mm": 8, "fp8_grouped": FP8_GROUPED_ALIGN}.get(path, 1)

    def derive_kernel_layout(self) -> None:
        """Derive the FP4 grouped kernel's layout now (else on the first forward): before sizing a KV cache to
        the free memory, or before a CUDA-graph capture. No-op for other paths."""
        if self.offloaded:
            return
        x = torch.empty(0, self.in_features, device=self._tensors()[0].device)
        if self.path(x) == "fp4_grouped":
            from trace_rl.kernels.linear import hopper_weight

            hopper_weight(self.stacked())

    @property
    def offloaded(self) -> bool:
        """The reference codes live in host memory, the kernel layout on `compute_device`."""
        return self.compute_device is not None

    @torch.no_grad()
    def offload_reference(self) -> int:
        """Rollout capacity: derive the FP4 kernel layout, then move the reference codes and scales to host
        memory (the kernel reads only its layout). Returns the GPU bytes freed. Only for experts that run
        `fp4_grouped` on the device they are on; see the module doc for what still reads the reference."""
        if self.offloaded:
            return 0
        device = self._tensors()[0].device
        if self.weight_fmt not in FP4_GROUPED_FORMATS or self.path(torch.empty(0, device=device)) != "fp4_grouped":
            raise ValueError(f"offload_reference: these experts ({self.weight_fmt}) do not run the fp4_grouped "
                             f"kernel on {device}, which is what lets their reference codes leave the device")
        from trace_rl.kernels.linear import LAYOUT_KEY, hopper_weight

        layout = hopper_weight(self.stacked())
        freed = self.nbytes
        for name in ("w_codes", "w_scales", "w_global_scale"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.cpu())
        self.compute_device = device
        self._views.clear()
        self._stacked = None
        self.stacked().layout[LAYOUT_KEY] = layout
        return freed

    def _apply(self, fn, recurse=True):
        """`module.to(...)` / `.cuda()` move buffers: an offloaded reference stays in host memory (the engine
        adopting a rollout model calls `model.to(device)`; moving the codes back would undo the offload)."""
        if not self.offloaded:
            return super()._apply(fn, recurse)
        held = {n: self._buffers.pop(n) for n in ("w_codes", "w_scales", "w_global_scale")}
        try:
            return super()._apply(fn, recurse)
        finally:
            self._buffers.update(held)

    @torch.no_grad()
    def restore_reference(self) -> None:
        """Undo `offload_reference`: the reference codes back on the compute device (the layout is kept)."""
        if not self.offloaded:
            return
        layout = self.stacked().layout
        for name in ("w_codes", "w_scales", "w_global_scale"):
            t = getattr(self, name)
            if t is not None:
                setattr(self, name, t.to(self.compute_device))
        self._views.clear()
        self._stacked = None
        self.stacked().layout.update(layout)
        self.compute_device = None

    @torch.no_grad()
    def load_weight(self, weight: torch.Tensor) -> None:
        """Re-quantize new expert weights [E, N, K] into the existing buffers (no reallocation) and re-derive
        the kernel layouts in place: a CUDA graph that captured this layer stays valid."""
        if tuple(weight.shape) != (self.num_experts, self.out_features, self.in_features):
            raise ValueError(f"GroupedQuantLinear.load_weight: shape {tuple(weight.shape)} != "
                             f"{(self.num_experts, self.out_features, self.in_features)}")
        fresh: tuple[str, ...] = ()
        if self.weight_fmt == "bf16":
            self.weight.copy_(weight)
        elif not self.offloaded and self._stacked is not None:
            # fp4 on the GPU with the stacked layout derived: quantize + re-layout fused, expert by expert, into the
            # buffers and layout (nvfp4 with per-part globals, `parts` > 1, takes the loop below)
            fresh = self.backend.quantize_into(weight, self.stacked())
        if self.weight_fmt != "bf16" and not fresh:
            device = self.compute_device if self.offloaded else self.w_codes.device   # quantize where it is fast
            for e in range(self.num_experts):
                q = self._quantize_expert(weight[e].to(device))
                self.w_codes[e].copy_(q.codes)
                if self.w_scales is not None:
                    self.w_scales[e].copy_(q.scales)
                if self.w_global_scale is not None:
                    self.w_global_scale[e].copy_(q.global_scale)
        self.refresh_layouts(fresh)

    def refresh_layouts(self, fresh: tuple[str, ...] = ()) -> None:
        """The buffers were rewritten in place (`load_weight`, or a packed weight sync copying into them):
        drop emulation's dequantized copies, re-derive kernel layouts in place (but the stacked layouts under
        `fresh`, which the fused sync wrote)."""
        if self._fp8_scale_b is not None and self.w_scales.dim() == 1:
            self._fp8_scale_b[1].copy_(self.w_scales.float().view(-1, 1).expand(-1, self.out_features))
        for _, p in self._views.values():
            p.refresh_layouts()
        if self._stacked is None:
            return
        if self.offloaded:
            self._stacked[1].cache.clear()
            self._rederive_offloaded(self.REDERIVE_CHUNK)
        else:
            self._stacked[1].refresh_layouts(fresh)

    def _rederive_offloaded(self, chunk: int) -> None:
        """The kernel layout from the host-resident reference, `chunk` experts at a time on the compute device
        (into views of the layout: in place, no full-size temporary)."""
        from trace_rl.kernels.hopper_fp4 import HopperFP4
        from trace_rl.kernels.linear import LAYOUT_KEY, derive_layout

        h = self._stacked[1].layout[LAYOUT_KEY]
        shape, dtype, fmt = self._q_meta
        for lo in range(0, self.num_experts, chunk):
            hi = min(self.num_experts, lo + chunk)
            part = lambda t, lo=lo, hi=hi: None if t is None else t[lo:hi].to(self.compute_device)  # noqa: E731
            g = part(self.w_global_scale)
            q = QTensor(part(self.w_codes), part(self.w_scales), None if g is None else g.view(hi - lo, -1, 1),
                        (hi - lo, *shape), dtype, fmt)
            derive_layout(q, HopperFP4(h.fmt, h.n, h.k, h.values[lo:hi], h.scales[lo:hi], h.row_factor[lo:hi]))

    def forward(self, x: torch.Tensor, ends: torch.Tensor, src_rows: torch.Tensor | None = None,
                silu_mul: bool = False, src_padded: bool = True) -> torch.Tensor:
        """x [rows, K] sorted by expert, `ends [E]` int32 -> [rows, N] (rows past ends[-1]: unspecified).

        Producers of the rows, optional: `src_rows` [rows] int64 (x holds the tokens [T, K], row r is token
        src_rows[r], T a zero row unless `src_padded` is False: `models.grouped.gather_rows`); `silu_mul` (x is
        [rows, 2K] gate | up, the rows are SiLU(gate) * up). The fp4_grouped path fuses them
        (`kernels.linear.fp4_grouped_linear`: W4A4 quantizes the tokens once, SwiGLU inside the quantize launch);
        the other paths run them first."""
        path = self.path(x)
        self.backend.paths.record(f"experts.{path}")
        if path == "fp4_grouped":
            return self._fp4_grouped(x, ends, src_rows, silu_mul, src_padded)
        if src_rows is not None:
            with op_range("permute"):            # the profile counts them where they belong, not as the GEMM's
                x = (torch.cat([x, x.new_zeros(1, x.shape[1])]) if src_padded else x)[src_rows]
        if silu_mul:
            with op_range("activation"):
                gate, up = x.chunk(2, dim=-1)
                x = torch.nn.functional.silu(gate) * up
        if path == "grouped_mm":
            return torch._grouped_mm(x, self.weight.transpose(1, 2), offs=ends)
        if path == "fp8_grouped":
            return self._fp8_grouped(x, ends)
        if path != "loop":
            raise ValueError(f"GroupedQuantLinear: path {path!r}; known: {', '.join(GROUPED_PATHS)}")
        if self.offloaded and x.device != self.w_codes.device:
            raise RuntimeError(f"GroupedQuantLinear: the loop path reads the reference codes, which "
                               f"offload_reference() moved to host memory; call restore_reference() first "
                               f"(or let these {x.device} inputs take fp4_grouped: force_path None)")
        return grouped_loop(x, ends, lambda e, rows: self.backend.linear(rows, self.packed(e), self.act_fmt),
                            self.out_features)

    def _fp4_grouped(self, x: torch.Tensor, ends: torch.Tensor, src_rows: torch.Tensor | None = None,
                     silu_mul: bool = False, src_padded: bool = True) -> torch.Tensor:
        from trace_rl.kernels import interpreting

        if self.weight_fmt not in FP4_GROUPED_FORMATS:
            raise ValueError(f"GroupedQuantLinear: the fp4_grouped path takes nvfp4/mxfp4 experts, these are "
                             f"{self.weight_fmt}")
        if not (x.is_cuda or interpreting()):
            raise RuntimeError("GroupedQuantLinear: the fp4_grouped path runs the Triton kernel on CUDA tensors "
                               "(on CPU only under TRITON_INTERPRET=1, for tests); leave force_path None here")
        from trace_rl.kernels.fp4_grouped import FUSE_ACT_QUANT
        from trace_rl.kernels.linear import fp4_grouped_linear, grouped_gemm_path

        experts = self.stacked()
        rows = x.shape[0] if src_rows is None else src_rows.shape[0]
        gemm = grouped_gemm_path(rows, x.device, experts, self.act_fmt, FUSE_ACT_QUANT)
        self.backend.paths.record(f"experts.fp4_grouped.{gemm}")
        offsets = torch.cat([ends.new_zeros(1), ends]).to(torch.int32)     # [0, *ends] on the device, no sync
        return fp4_grouped_linear(x, offsets, experts, self.act_fmt, src_rows=src_rows, silu_mul=silu_mul,
                                  src_padded=src_padded, path=gemm)

    def _fp8_grouped(self, x: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        why = self.fp8_why_not(x.device) if x.is_cuda else "the inputs are not on a CUDA device"
        if why:
            raise RuntimeError(f"GroupedQuantLinear: the fp8_grouped path does not run here: {why}; leave "
                               f"force_path None (the experts then take the loop)")
        key = self._key()
        if self._fp8_scale_b is None or self._fp8_scale_b[0] != key:     # a view of the row scales (float32)
            s = self.w_scales.float()
            self._fp8_scale_b = (key, s.view(self.num_experts, self.out_features) if s.dim() == 3 else
                                 s.view(-1, 1).expand(-1, self.out_features).contiguous())
        return fp8_grouped(x, ends, self.w_codes, self._fp8_scale_b[1], self.act_fmt)

    def extra_repr(self) -> str:
        parts = f", parts={self.parts}" if self.parts > 1 else ""
        return (f"experts={self.num_experts}, in={self.in_features}, out={self.out_features}{parts}, "
                f"weight={self.weight_fmt}, act={self.act_fmt}, backend={self.backend.name}")
