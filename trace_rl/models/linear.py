"""`Linear`: every projection of the decoder, and the one place where activations meet the precision plan.

A `Linear` is in one of two stages, chosen by a config rewrite (`Decoder.apply_plan`, `Decoder.to_rollout`),
never by patching forward methods:

- **trainer** (a `weight` Parameter): `trainer_mode == "bf16"` computes plainly. `aligned`/`guided`
  fake-quantize the weight per output row (`backend.fake_quantize_weight`) and the input per token
  (`backend.fake_quantize`) to the rollout's formats, with straight-through gradients.
- **rollout** (a `QuantLinear` in `self.quant`, the weight in packed buffers): the backend quantizes the
  input per token and runs its linear (emulated on CPU, kernels on GPU). `load_weight` re-quantizes into
  the same buffers, so CUDA graphs that read them stay valid.

`activation_hook` is the hook point for TRACE guidance: when set, it is called as `hook(self, x)` right
where this layer's input is quantized, in both stages. In the trainer stage its return value is passed
to `fake_quantize` as `guidance`; in the rollout stage it may record what the rollout's quantization did.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from trace_rl.backends import QuantLinear
from trace_rl.backends.registry import backend_for_format
from trace_rl.op_ranges import op_range

ActivationHook = Callable[["Linear", torch.Tensor], object]

# Weight formats whose scales depend only on one output row (or blocks within it): stacking the weights of
# layers that share an input (q/k/v, gate/up) and quantizing the stack gives the same codes and scales as
# quantizing each part. nvfp4 is left out: its per-tensor global scale would change.
FUSABLE_WEIGHT_FORMATS = ("bf16", "fp8_e4m3:row", "fp8_e5m2:row", "mxfp4")
# Rollout layers left unfused (nvfp4's per-tensor scale) that share an input quantize it once (`shared_input`);
# False: each quantizes it itself (the A/B switch of benchmarks/engine_step_profile.py; the same bits either way).
SHARE_ROLLOUT_INPUTS = True
# Such layers whose operand caches the engine stacked (engine.operand_cache.STACK: q/k/v, gate/up of nvfp4) run as one
# GEMM at large M (`Backend.linear_stacked`); False: one GEMM per layer on the same stacked buffer (the A/B switch of
# benchmarks/engine_opstack.py). Same operand, activation and scale bits; cuBLAS's accumulation order may differ.
STACK_ROLLOUT_OPERANDS = True


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, bias: bool = False,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(out_features, device=device, dtype=dtype)) if bias else None
        self.name = ""                    # module path ("model.layers.0.mlp.up_proj"), set by the Decoder
        self.weight_fmt = "bf16"          # the plan's formats for this layer (bf16 = high precision)
        self.act_fmt = "bf16"
        self.trainer_mode = "bf16"        # PrecisionPlan.trainer
        self.quant: QuantLinear | None = None
        self.activation_hook: ActivationHook | None = None
        self.fused_from: tuple[str, ...] = ()   # names of the layers this one stacks (rollout fusion)

    @classmethod
    def can_fuse(cls, parts: list[Linear]) -> bool:
        key = lambda p: (p.weight_fmt, p.act_fmt, p.bias is None, p.in_features, p.quant is None)  # noqa: E731
        return parts[0].weight_fmt in FUSABLE_WEIGHT_FORMATS and parts[0].quant is None \
            and all(key(p) == key(parts[0]) for p in parts)

    @classmethod
    @torch.no_grad()
    def fuse(cls, parts: list[Linear], name: str) -> Linear:
        """One trainer-stage Linear whose output is the parts' outputs concatenated (see FUSABLE_WEIGHT_FORMATS)."""
        if not cls.can_fuse(parts):
            raise ValueError(f"cannot fuse {[p.name for p in parts]}: formats, biases or input sizes differ, "
                             f"or the weight format's scales span rows")
        first = parts[0]
        with torch.device("meta"):
            fused = cls(first.in_features, sum(p.out_features for p in parts), bias=first.bias is not None)
        fused.weight = nn.Parameter(torch.cat([p.weight.detach() for p in parts]), requires_grad=False)
        if first.bias is not None:
            fused.bias = nn.Parameter(torch.cat([p.bias.detach() for p in parts]), requires_grad=False)
        fused.set_formats(first.weight_fmt, first.act_fmt, first.trainer_mode)
        fused.name, fused.fused_from = name, tuple(p.name for p in parts)
        return fused

    @property
    def is_quantized(self) -> bool:
        return (self.weight_fmt, self.act_fmt) != ("bf16", "bf16")

    def set_formats(self, weight_fmt: str, act_fmt: str, trainer_mode: str) -> None:
        if self.quant is not None and (weight_fmt, act_fmt) != (self.weight_fmt, self.act_fmt):
            raise ValueError(f"{self.name}: a rollout layer's formats are fixed when it is built; build a new "
                             f"rollout model for another plan")
        self.weight_fmt, self.act_fmt, self.trainer_mode = weight_fmt, act_fmt, trainer_mode

    @torch.no_grad()
    def to_rollout(self) -> None:
        """Replace the weight Parameter by a QuantLinear holding it in this layer's weight format."""
        if self.quant is not None:
            return
        bias = None if self.bias is None else self.bias.detach()
        self.quant = QuantLinear(self.weight.detach(), self.weight_fmt, self.act_fmt, bias)
        self.weight = None
        self.bias = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hook = self.activation_hook
        if self.quant is not None:                           # rollout stage
            if hook is not None:
                hook(self, x)
            with op_range("linear"):
                return self.quant(x)
        if self.trainer_mode == "bf16" or not self.is_quantized:
            return F.linear(x, self.weight, self.bias)
        backend = backend_for_format(self.weight_fmt)
        guidance = hook(self, x) if hook is not None else None
        xq = backend.fake_quantize(x, self.act_fmt, guidance)
        wq = backend.fake_quantize_weight(self.weight, self.weight_fmt)
        return F.linear(xq, wq, self.bias)

    def extra_repr(self) -> str:
        stage = "rollout" if self.quant is not None else f"trainer={self.trainer_mode}"
        return f"in={self.in_features}, out={self.out_features}, weight={self.weight_fmt}, act={self.act_fmt}, {stage}"


def w4a4_group(parts: list[Linear]) -> QuantLinear | None:
    """The first part's QuantLinear when every part is a rollout layer with one backend, one weight format and one
    W4A4 activation format: then their input can be quantized once per token, by `shared_input` or already by its
    producer (a fused norm, `Backend.norm_quantize_input`), and each part multiplies that. None otherwise."""
    first = parts[0].quant if parts else None
    if first is None or first.act_fmt == "bf16" or any(
            p.quant is None or p.quant.backend is not first.backend or p.quant.act_fmt != first.act_fmt
            or p.quant.weight_fmt != first.weight_fmt for p in parts):
        return None
    return first


def shared_input(parts: list[Linear], x: torch.Tensor | None, xq=None) -> list[torch.Tensor]:
    """`[p(x) for p in parts]` for layers that read the same input (q/k/v, gate/up when `Linear.fuse` cannot stack
    them, i.e. nvfp4). In the rollout stage, when all parts have one backend and W4A4 activation format
    (`w4a4_group`), x is quantized once (`Backend.quantize_input`) and each part multiplies that (`linear_quantized`):
    per-token quantization depends on x alone, so the outputs are the same bits with 1 quantize launch instead of
    len(parts). Where the parts' operand caches are one stack (and `STACK_ROLLOUT_OPERANDS`), one GEMM + epilogue
    computes all of them (`Backend.linear_stacked`): column views of one [..., sum N] output, equal to the per-part
    outputs up to cuBLAS's float32 accumulation order (the stacked N may pick another kernel), every rounding the same.
    `xq`: x already quantized by its producer (`Backend.norm_quantize_input`'s handle, for a `w4a4_group`; one part,
    e.g. a stacked qkv_proj, is fine): no quantization here. x may then be None when no part has an activation hook
    (the producer did not write it). Activation hooks are called for every part with x, before the matmuls, as
    `forward` calls them."""
    out = shared_input_joined(parts, x, xq)
    return list(out.split([p.quant.out_features for p in parts], dim=-1)) if isinstance(out, torch.Tensor) else out


def shared_input_joined(parts: list[Linear], x: torch.Tensor | None, xq=None) -> torch.Tensor | list[torch.Tensor]:
    """`shared_input`, but where one stacked GEMM computes every part, its [..., sum N] output unsplit (one
    Tensor: the parts' outputs side by side, e.g. gate | up for `silu_mul_linear`); else the list of outputs."""
    group = group_input(parts, x, xq)
    if group is None:
        return [p(x) for p in parts]
    return joined_output(group, parts)


def group_input(parts: list[Linear], x: torch.Tensor | None, xq=None):
    """The first half of `shared_input_joined`: (the parts' `w4a4_group` QuantLinear, their input quantized once:
    `xq`, or `quantize_input` of x here), with the parts' activation hooks called; None where each part runs on its
    own (`p(x)`: hooks are then called by `Linear.forward`)."""
    first = w4a4_group(parts)
    if xq is None:
        if not SHARE_ROLLOUT_INPUTS or len(parts) < 2 or first is None:
            return None
        with op_range("linear"):
            xq = first.backend.quantize_input(x, first.packed, first.act_fmt)
        if xq is None:
            return None
    elif first is None:
        raise ValueError(f"shared_input: a pre-quantized input was given for {[p.name for p in parts]}, which do not "
                         f"share one W4A4 backend and format (w4a4_group is None); pass x only")
    for p in parts:
        if p.activation_hook is not None:
            if x is None:
                raise ValueError(f"shared_input: {p.name} has an activation hook but its input was not kept; the "
                                 f"producer must keep x when a part has a hook")
            p.activation_hook(p, x)
    return first, xq


def joined_output(group, parts: list[Linear]) -> torch.Tensor | list[torch.Tensor]:
    """The second half of `shared_input_joined`, on `group_input`'s (first, xq): the stacked GEMM's [..., sum N]
    output where it applies, else the per-part outputs."""
    first, xq = group
    with op_range("linear"):
        if STACK_ROLLOUT_OPERANDS and len(parts) > 1:
            y = first.backend.linear_stacked(xq, [p.quant.packed for p in parts], [p.quant.bias for p in parts])
            if y is not None:
                return y
        return [p.quant.backend.linear_quantized(xq, p.quant.packed, p.quant.bias) for p in parts]


def stacked_silu_mul_linear(group, parts: list[Linear], layer: Linear) -> torch.Tensor | None:
    """`layer(F.silu(gate) * up)` for parts = [gate, up] on `group_input`'s (first, xq) where their stacked GEMM
    applies and its FP4 epilogue fuses into `layer`'s SiLU x mul W4A4 input quantization
    (`Backend.linear_stacked_silu_mul_quantize`: cuBLAS, then one launch instead of the epilogue and
    `silu_mul_linear`'s quantize; the same bits, the bf16 gate | up never written). None where it does not (the
    caller runs `joined_output`, then `silu_mul_linear`): `STACK_ROLLOUT_OPERANDS` off, `layer` not a W4A4 rollout
    layer of the parts' backend, an activation hook on `layer` (it reads the product), or the backend refuses."""
    first, xq = group
    q = layer.quant
    if (not STACK_ROLLOUT_OPERANDS or len(parts) != 2 or q is None or q.act_fmt == "bf16"
            or layer.activation_hook is not None or q.backend is not first.backend):
        return None
    with op_range("linear"):     # the GEMM dominates this call; the SiLU x mul rides in its epilogue
        dq = first.backend.linear_stacked_silu_mul_quantize(xq, [p.quant.packed for p in parts], q.packed, q.act_fmt)
        if dq is None:
            return None
        return q.backend.linear_quantized(dq, q.packed, q.bias)


# Rows below which the fused SiLU x mul + quantize loses to the two launches (silu_mul, then the quantize): its row
# programs are few and long at small M. H200, 12288 -> 4096 down projection with its GEMM, us (check w4a4prod,
# benchmarks/results/w4a4_producers_h200_1202e.json): nvfp4 fused / apart 22.6 / 19.8 (M = 1), 24.4 / 22.4 (16),
# 37.4 / 38.7 (64), 80.5 / 85.9 (256); mxfp4 19.4 / 18.4 (1), 21.2 / 21.4 (16), 33.5 / 35.8 (64).
SILU_QUANTIZE_MIN_ROWS = 64


def silu_mul_linear(layer: Linear, gate_up: torch.Tensor) -> torch.Tensor | None:
    """`layer(F.silu(gate) * up)` for gate_up [..., 2K] (gate | up) with the SiLU x mul fused into the layer's W4A4
    input quantization (`Backend.quantize_silu_mul_input`: one launch for torch's SiLU, multiply and the quantize;
    the same bits). None where that does not apply (not a rollout layer, W4A16, an activation hook, which reads the
    product, fewer than SILU_QUANTIZE_MIN_ROWS rows, or a backend / device that does not fuse it): the caller computes
    the product and calls `layer`."""
    q = layer.quant
    if q is None or q.act_fmt == "bf16" or layer.activation_hook is not None:
        return None
    if gate_up.numel() // max(gate_up.shape[-1], 1) < SILU_QUANTIZE_MIN_ROWS:
        return None
    with op_range("activation"):
        xq = q.backend.quantize_silu_mul_input(gate_up, q.packed, q.act_fmt)
    if xq is None:
        return None
    with op_range("linear"):
        return q.backend.linear_quantized(xq, q.packed, q.bias)
