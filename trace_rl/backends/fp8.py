"""fp8 backend: FP8 weights (W8A16) and activations (W8A8), per tensor, per row, or in blocks.

Paths, tried in the order `FP8Config.impl` gives (`auto`: te, scaled_mm, emulated) and reported in
`paths`, never silent:
- `fp8.te.<recipe>`: Transformer Engine's `te.Linear` under `te.autocast(recipe=...)` (te_adapter.py).
  `auto` takes it only where the recipe reproduces the plan's formats (recipe `block` with
  `fp8_e4m3:block` weights and activations: same scales, same codes but for rare rounding-midpoint
  cases, 1 weight code in 16.8 M measured on an H200); an explicit `impl="te"` also runs
  `current`/`delayed` with `fp8_e4m3:tensor` weights, whose activations TE scales per batch, not per token.
- `fp8.scaled_mm.rowwise` / `fp8.scaled_mm.block`: torch's FP8 GEMM on sm_89+, E4M3 on both operands,
  activations quantized by the formats' reference (so their codes are the trainer's fake-quant codes).
  Blocks (1x128 activations x 128x128 weights) are used only if a one-time self-check on this GPU passes
  (fp8_scaled_mm.py); otherwise the block formats fall back to emulation, reported with the reason.
- `fp8.emulated`: quantize-dequantize in torch (the formats' reference), float32 matmul.

An explicit impl that cannot run raises `FP8PathError` with the reason (the TE probe's, for `te`),
unless `allow_fallback=True`: then the next path runs, a warning is logged once and the fallback is
recorded in `fallbacks` / `metrics()` for the run's metrics.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from trace_rl.backends import fp8_scaled_mm, te_adapter
from trace_rl.backends.base import Availability, Backend, PackedWeight, default_device
from trace_rl.backends.registry import register_backend
from trace_rl.config import TraceConfig
from trace_rl.formats import FP8_FORMATS, get_format, per_token

log = logging.getLogger("trace_rl.backends.fp8")

Impl = Literal["auto", "te", "scaled_mm", "emulated"]
_ORDER = ("te", "scaled_mm", "emulated")


class FP8Config(TraceConfig):
    """Which implementation the fp8 backend runs, and whether it may fall back."""

    impl: Impl = Field(
        "auto", description="auto: the best that runs here (te > scaled_mm > emulated), choice recorded; "
                            "te: Transformer Engine; scaled_mm: torch's FP8 GEMM; emulated: torch reference.")
    te_recipe: Literal["delayed", "current", "block"] = Field(
        "block", description="TE recipe: block (Float8BlockScaling, 1x128 activations / 128x128 weights, "
                             "float32 scales: the formats' reference), current (Float8CurrentScaling, per "
                             "tensor), delayed (DelayedScaling, per tensor from an amax history).")
    allow_fallback: bool = Field(
        False, description="If the asked-for impl cannot run here, run the next one (te > scaled_mm > "
                           "emulated) with a warning, recorded in the backend's fallbacks, instead of raising.")


class FP8PathError(RuntimeError):
    """The configured FP8 implementation cannot run here; the message says why and what to change."""


@dataclass(frozen=True)
class Fallback:
    """One fallback: what was asked, what ran, why, for which call shape."""

    wanted: str
    used: str
    reason: str
    where: str


def weight_format(fmt: str) -> str:
    """fp8 weights scale 128x128 blocks where activations scale 1x128 blocks."""
    return fmt + "128x128" if fmt.endswith(":block") else fmt


@register_backend("fp8")
class FP8Backend(Backend):
    weight_formats = FP8_FORMATS

    def __init__(self, config: FP8Config | None = None):
        super().__init__()
        self.fallbacks: list[Fallback] = []
        self.skipped: dict[str, str] = {}     # auto: paths passed over -> why (first time each)
        self.configure(config or self.default_config())

    @staticmethod
    def default_config() -> FP8Config:
        return FP8Config()

    def configure(self, config: FP8Config) -> FP8Backend:
        """Use `config` from now on (forgets cached path choices; keeps the recorded history)."""
        self.config = config
        self._choices: dict[tuple, str] = {}
        return self

    # -- path choice --
    def _candidates(self) -> tuple[str, ...]:
        impl = self.config.impl
        if impl == "auto":
            return _ORDER
        return _ORDER[_ORDER.index(impl):] if self.config.allow_fallback else (impl,)

    def _why_not(self, impl: str, device: torch.device, w_fmt: str, act_fmt: str, n: int, k: int) -> str:
        if impl == "emulated":
            return ""
        if device.type != "cuda":
            return (te_adapter.probe().reason or "no CUDA GPU") if impl == "te" else "no CUDA GPU"
        if impl == "te":
            return self._why_not_te(w_fmt, act_fmt, n, k, strict=self.config.impl == "auto")
        return fp8_scaled_mm.why_not(device, w_fmt, act_fmt, n, k)

    def _why_not_te(self, w_fmt: str, act_fmt: str, n: int, k: int, strict: bool) -> str:
        recipe = self.config.te_recipe
        why = te_adapter.probe().why_not(recipe)
        if why:
            return why
        want_w, want_a = te_adapter.RECIPE_FORMATS[recipe]
        if strict and recipe != "block":
            return (f"TE recipe {recipe!r} scales activations per tensor (per batch), so its codes differ "
                    f"from the per-token reference; auto takes TE only with recipe 'block'")
        if act_fmt == "bf16":
            return "TE's FP8 Linear quantizes activations too (W8A8); weight-only FP8 has no TE path"
        if w_fmt != want_w or get_format(act_fmt).name != want_a:
            return (f"TE recipe {recipe!r} quantizes weights as {want_w} and activations as {want_a}; the "
                    f"plan asks {w_fmt} / {act_fmt}. Use those formats or another te_recipe")
        if n % te_adapter.TE_DIM_MULTIPLE or k % te_adapter.TE_DIM_MULTIPLE:
            return f"TE's FP8 GEMM needs in/out features divisible by 16, got {k} -> {n}"
        return ""

    def _select(self, device: torch.device, w_fmt: str, act_fmt: str, n: int, k: int):
        """(impl that runs or None, {impl passed over: why}) without recording anything."""
        reasons = {}
        for impl in self._candidates():
            why = self._why_not(impl, device, w_fmt, act_fmt, n, k)
            if not why:
                return impl, reasons
            reasons[impl] = why
        return None, reasons

    def choose(self, device: torch.device | str, w_fmt: str, act_fmt: str, n: int, k: int) -> str:
        """The impl that runs for this call shape ('te', 'scaled_mm' or 'emulated'); raises FP8PathError.

        Cached per (device, formats, shape); a fallback is logged and recorded the first time only.
        """
        device = torch.device(device)
        key = (device.type, device.index, w_fmt, act_fmt, n, k)
        if key in self._choices:
            return self._choices[key]
        impl, reasons = self._select(device, w_fmt, act_fmt, n, k)
        if impl is None:
            raise FP8PathError(self._refusal(device, w_fmt, act_fmt, n, k, reasons))
        where = f"{device.type} {w_fmt}/{act_fmt} {k}->{n}"
        for passed, why in reasons.items():
            if self.config.impl == "auto":
                if passed not in self.skipped:
                    log.info("fp8 backend: auto passes over %s (%s): %s", passed, where, why)
                self.skipped.setdefault(passed, why)
            elif passed == self.config.impl:
                self.fallbacks.append(Fallback(passed, impl, why, where))
                log.warning("fp8 backend: FALLBACK %s -> %s for %s: %s", passed, impl, where, why)
        self._choices[key] = impl
        return impl

    def _refusal(self, device, w_fmt, act_fmt, n, k, reasons) -> str:
        impl = self.config.impl
        return (f"fp8 backend ({self.name}): impl={impl!r} cannot run here ({device.type}, weight {w_fmt}, "
                f"activations {act_fmt}, {k} -> {n}): {reasons[impl]}. Run where it can, set impl='auto', "
                f"or set allow_fallback=True to fall back (recorded in the run's metrics).")

    def available(self, device=None, fmt: str | None = None, act_fmt: str | None = None) -> Availability:
        """Which path a W8A8 linear takes on `device` (default formats: the TE recipe's, else per row).

        `reason` says why each better path does not run (empty when the first choice does).
        """
        device = torch.device(device) if device is not None else default_device()
        if fmt is None:
            fmt, default_act = (te_adapter.RECIPE_FORMATS[self.config.te_recipe]
                                if self.config.impl == "te" else ("fp8_e4m3:row", "fp8_e4m3:row"))
            act_fmt = act_fmt or default_act
        w_fmt = weight_format(fmt)
        act_fmt = act_fmt or fmt.removesuffix("128x128")
        impl, reasons = self._select(device, w_fmt, act_fmt, 256, 256)
        if impl is None:
            return Availability(False, f"fp8.{self.config.impl}",
                                self._refusal(device, w_fmt, act_fmt, 256, 256, reasons))
        why = "; ".join(f"not {passed}: {r}" for passed, r in reasons.items())
        if impl == "emulated":
            why = (why + "; " if why else "") + "FP8 is emulated (quantize -> dequantize -> float32 matmul)"
        return Availability(True, self._path_name(impl, w_fmt), why)

    def _path_name(self, impl: str, w_fmt: str) -> str:
        if impl == "te":
            return f"fp8.te.{self.config.te_recipe}"
        if impl == "scaled_mm":
            return "fp8.scaled_mm.block" if get_format(w_fmt).scaling == "block" else "fp8.scaled_mm.rowwise"
        return "fp8.emulated"

    # -- weights and linear --
    def prepare_weight(self, weight: torch.Tensor, fmt: str) -> PackedWeight:
        self.check_format(fmt)
        fmt = weight_format(fmt)
        n, k = weight.shape
        return PackedWeight(fmt, n, k, q=get_format(fmt).quantize(weight.detach()))

    def check_format(self, fmt: str) -> None:
        super().check_format(fmt.removesuffix("128x128"))

    def fake_quantize_weight(self, w: torch.Tensor, fmt: str) -> torch.Tensor:
        """As the rollout's `prepare_weight`: `fp8_*:block` weights scale 128x128 blocks (activations 1x128)."""
        return super().fake_quantize_weight(w, fmt if fmt == "bf16" else weight_format(fmt))

    def linear(self, x, packed, act_fmt="bf16", bias=None):
        if act_fmt != "bf16" and not act_fmt.startswith("fp8"):
            raise ValueError(f"fp8 backend: activations must be bf16 or fp8, got {act_fmt!r}")
        impl = self.choose(x.device, packed.fmt, act_fmt, packed.out_features, packed.in_features)
        self.paths.record(self._path_name(impl, packed.fmt))
        if impl == "te":
            return self._te_linear(x, packed, bias)
        if impl == "scaled_mm":
            return fp8_scaled_mm.linear(x, packed, per_token(act_fmt), bias)
        return emulated_linear(x, packed, act_fmt, bias)

    def _te_linear(self, x, packed: PackedWeight, bias):
        # TE quantizes the weight itself: give it the dequantized reference weight in float32, so the
        # codes it recomputes are ours (code * scale is within an ulp of the code; midpoints are 1/16 away).
        mod = packed.layout.get("te")
        if mod is None or mod.recipe_name != self.config.te_recipe:
            mod = te_adapter.TELinear(packed.dequantized(), None if bias is None else bias.float(),
                                      self.config.te_recipe, params_dtype=torch.float32)
            packed.layout["te"] = mod
        with torch.no_grad():
            return mod(x)

    # -- metrics for the run --
    def metrics(self) -> dict[str, float]:
        """Scalars for a pipeline's metrics: calls per path and the number of fallbacks."""
        out = {f"{self.name}/path/{p}": float(c) for p, c in self.paths.summary().items()}
        out[f"{self.name}/fallbacks"] = float(len(self.fallbacks))
        return out


def emulated_linear(x: torch.Tensor, packed: PackedWeight, act_fmt: str, bias: torch.Tensor | None):
    """Reference W8A16/W8A8 linear in float32: quantize-dequantize (formats' reference), then matmul."""
    xf = x.float()
    if act_fmt != "bf16":
        xf = get_format(per_token(act_fmt)).fake_quantize(xf)
    y = xf @ packed.dequantized().T
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
