"""The `Backend` interface: how to compute with a numeric format on a device, and report which path ran.

A backend provides packed weights (`prepare_weight`), a linear (`linear`), the trainer's fake
quantization with a straight-through gradient (`fake_quantize`), and KV-cache write/read. Every call
records which implementation ran (`paths`), e.g. `fp4.emulated` on CPU or `fp4.triton` on a GPU; the
first use of each path is logged at INFO, so nothing is silent.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field

import torch

from trace_rl.backends.fake_quant import WeightCache, _LastInput, fake_quantize_activation, fake_quantize_weight
from trace_rl.backends.fake_quant import straight_through as straight_through
from trace_rl.formats import QTensor, get_format, per_token

log = logging.getLogger("trace_rl.backends")


@dataclass(frozen=True)
class Availability:
    """Whether a backend can run on a device, which path it would take there, and if not, why."""

    ok: bool
    path: str
    reason: str = ""

    def __bool__(self) -> bool:
        return self.ok


class PathReport:
    """Counts which implementation paths a backend took. `last` is the most recent one."""

    def __init__(self, backend: str):
        self.backend = backend
        self.counts: Counter[str] = Counter()
        self.last: str | None = None

    def record(self, path: str) -> None:
        if path not in self.counts:
            log.info("backend %s: using path %s", self.backend, path)
        self.counts[path] += 1
        self.last = path

    def summary(self) -> dict[str, int]:
        return dict(self.counts)


@dataclass
class PackedWeight:
    """A weight prepared for a backend's linear: the quantized tensor (or the plain weight for bf16).

    `layout` holds kernel-specific re-arrangements derived from `q` (filled by the kernels on GPU, e.g. the
    Hopper FP4 layout under "hopper_fp4"); `cache` holds the emulation path's dequantized weight so CPU
    emulation does not dequantize on every call. After `q` changes in place (weight sync), call
    `refresh_layouts()`.
    """

    fmt: str
    out_features: int
    in_features: int
    q: QTensor | None = None
    weight: torch.Tensor | None = None
    layout: dict = field(default_factory=dict)
    cache: dict = field(default_factory=dict)

    def refresh_layouts(self, fresh: tuple[str, ...] = ()) -> None:
        """`q` was rewritten in place: drop the dequantized cache and re-derive every layout that can be
        re-derived in place (`refresh_from(q)`: a CUDA graph that read it stays valid); drop the others.
        `fresh`: layout keys already written from the new `q` (the fused weight sync), left as they are."""
        self.cache.clear()
        for key, value in list(self.layout.items()):
            if key in fresh:
                continue
            if hasattr(value, "refresh_from") and self.q is not None:
                value.refresh_from(self.q)
            else:
                del self.layout[key]

    def dequantized(self) -> torch.Tensor:
        """float32 [N, K] weight as the quantized format represents it (cached)."""
        if self.weight is not None:
            return self.weight.float()
        if "dequantized" not in self.cache:
            self.cache["dequantized"] = self.q.dequantize()
        return self.cache["dequantized"]


class Backend(ABC):
    """Base of the bf16, fp8 and fp4 backends. Use `get_backend(name)`; instances keep a `PathReport`."""

    name: str
    weight_formats: tuple[str, ...]

    def __init__(self):
        self.paths = PathReport(self.name)
        self.weight_cache = WeightCache()     # trainer: fake-quantized weights, once per parameter version
        self._last_input = _LastInput()       # trainer: layers sharing an input quantize it once

    @abstractmethod
    def available(self, device: torch.device | str | None = None) -> Availability:
        """Can this backend run on `device` (default: cuda if present, else cpu), by which path, or why not."""

    def check_format(self, fmt: str) -> None:
        if fmt not in self.weight_formats:
            raise ValueError(f"backend {self.name!r} does not handle format {fmt!r}; it handles "
                             f"{', '.join(self.weight_formats)}")

    def prepare_weight(self, weight: torch.Tensor, fmt: str) -> PackedWeight:
        """Quantize a [N, K] weight per output row (blocks along K) into this backend's packed form."""
        self.check_format(fmt)
        n, k = weight.shape
        return PackedWeight(fmt, n, k, q=get_format(fmt).quantize(weight.detach()))

    def quantize_into(self, weight: torch.Tensor, packed: PackedWeight,
                      amax_bits: torch.Tensor | None = None) -> tuple[str, ...]:
        """Weight sync's fast path: quantize `weight` straight into `packed` (its `q` viewing a module's buffers) and
        its kernel layouts, in place. Returns the layout keys it wrote (the caller refreshes the rest), or () when
        it does not run here: nothing was written, and the caller takes `prepare_weight` + copy +
        `refresh_layouts`. None here; the fp4 backend fuses the quantization with the Hopper re-layout."""
        return ()

    @abstractmethod
    def linear(self, x: torch.Tensor, packed: PackedWeight, act_fmt: str = "bf16",
               bias: torch.Tensor | None = None) -> torch.Tensor:
        """y = quant_act(x) @ W^T (+ bias) in x's dtype; activations quantized per token unless bf16."""

    def quantize_input(self, x: torch.Tensor, packed: PackedWeight, act_fmt: str):
        """Rollout layers that share an input (q/k/v, gate/up of an unfused nvfp4 model): `x` quantized per token
        once, as `linear(x, packed, act_fmt)` would, an opaque handle for `linear_quantized` on every layer of that
        weight format and `act_fmt`; None where this backend does not share (the caller runs `linear` per layer)."""
        return None

    def quantize_silu_mul_input(self, gate_up: torch.Tensor, packed: PackedWeight, act_fmt: str):
        """`quantize_input(F.silu(gate) * up, packed, act_fmt)` for gate_up [..., 2K] (gate | up), the SiLU x mul
        fused into the quantization, the same bits; None where this backend does not fuse it (the caller runs
        the SiLU, the multiply and `linear`)."""
        return None

    def norm_quantize_input(self, x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                            eps: float, packed: PackedWeight, act_fmt: str, keep_h: bool = True):
        """A rollout RMSNorm whose output feeds layers of this backend that share their input (`w4a4_group` in
        models/linear.py): the residual add + RMSNorm (`RMSNorm.add(x, residual)`) and `quantize_input` of its
        output, fused where this backend can -> (h, or None unless `keep_h`; x + residual, or x when residual is
        None; the `quantize_input` handle, whose `shape` is x's), the same bits as the two apart. None where it
        does not fuse (the caller runs the norm, then `shared_input` quantizes)."""
        return None

    def linear_quantized(self, xq, packed: PackedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`linear(x, packed, act_fmt, bias)` from `quantize_input(x, ...)`'s handle: the same bits."""
        raise NotImplementedError(f"backend {self.name!r} does not share quantized inputs")

    def linear_stacked(self, xq, packeds: list[PackedWeight], biases: list | None = None) -> torch.Tensor | None:
        """`torch.cat([linear_quantized(xq, p, b) for p, b in zip(packeds, biases)], -1)` as one GEMM where this
        backend holds the parts' weights stacked (the fp4 backend's stacked operand cache); None where it does not
        (the caller runs `linear_quantized` per part)."""
        return None

    def linear_stacked_silu_mul_quantize(self, xq, packeds: list[PackedWeight], down: PackedWeight, act_fmt: str):
        """`quantize_silu_mul_input(linear_stacked(xq, packeds), down, act_fmt)` for packeds = [gate, up] where this
        backend fuses the stacked GEMM's epilogue into the SiLU x mul quantize (the fp4 backend on its stacked
        operand cache): the same bits, one launch and the [..., 2K] gate | up intermediate fewer. None where it does
        not (decided before any work: the caller runs `linear_stacked` and `quantize_silu_mul_input`)."""
        return None

    def fake_quantize(self, x: torch.Tensor, fmt: str, guidance=None) -> torch.Tensor:
        """Trainer-side quantize-dequantize of activations (per token) with a straight-through gradient;
        with `guidance` (a `correction.guided.GuidanceRecord`), TRACE's rollout-guided rounding. Fused
        Triton kernel on GPU, torch reference elsewhere (backends/fake_quant.py; path in `paths`)."""
        if fmt == "bf16":
            return x
        return fake_quantize_activation(self, x, fmt, guidance)

    def fake_quantize_weight(self, w: torch.Tensor, fmt: str) -> torch.Tensor:
        """Trainer-side quantize-dequantize of a weight (per output row), straight-through gradient; cached
        until the parameter changes (once per optimizer step, `weight_cache`)."""
        if fmt == "bf16":
            return w
        return fake_quantize_weight(self, w, fmt)

    # -- KV cache: K/V of shape [..., heads, head_dim], quantized per token and head along head_dim --
    def kv_write(self, kv: torch.Tensor, fmt: str) -> QTensor:
        return get_format(per_token(fmt)).quantize(kv)

    def kv_read(self, q: QTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return q.dequantize().to(dtype)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
