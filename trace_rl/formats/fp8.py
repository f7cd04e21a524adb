"""FP8 (E4M3 and E5M2) with float32 scales per tensor, per row, or per block.

Spec (float32, correctly rounded), for each scaling group (the tensor, a row along the last dim, or a
block: 1x128 along the last dim for activations, 128x128 over the last two dims for weights):

    amax  = max |x| over the group's finite elements
    scale = amax / FMAX        (1.0 when amax == 0; FMAX = 448 for E4M3, 57344 for E5M2)
    code  = fp8_rne(clamp(x / scale, -FMAX, FMAX))
    dequantized = float32(code) * scale

`scale` is the dequantization scale, as torch's `_scaled_mm` and Transformer Engine take it.
Non-finite input: NaN stays NaN; +-Inf becomes NaN in E4M3 (which has no infinity) and stays +-Inf in
E5M2; neither is ever clamped to a finite value.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_rl.formats.base import Format
from trace_rl.formats.qtensor import QTensor

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
FP8_SCALINGS = ("tensor", "row", "block")


@dataclass(frozen=True)
class FP8(Format):
    element: str = "e4m3"                 # "e4m3" | "e5m2"
    scaling: str = "row"                  # "tensor" | "row" | "block"
    block: tuple[int, int] = (1, 128)     # rows x cols of a scaling block (scaling == "block")

    def __post_init__(self):
        if self.element not in FP8_DTYPES:
            raise ValueError(f"fp8 element type must be one of {sorted(FP8_DTYPES)}, got {self.element!r}")
        if self.scaling not in FP8_SCALINGS:
            raise ValueError(f"fp8 scaling must be one of {FP8_SCALINGS}, got {self.scaling!r}")

    @property
    def name(self) -> str:  # type: ignore[override]
        base = f"fp8_{self.element}:{self.scaling}"
        if self.scaling == "block" and self.block != (1, 128):
            base += f"{self.block[0]}x{self.block[1]}"
        return base

    @property
    def torch_dtype(self) -> torch.dtype:
        return FP8_DTYPES[self.element]

    @property
    def fmax(self) -> float:
        return FP8_MAX[self.element]

    @property
    def bits_per_value(self) -> float:
        if self.scaling == "block":
            return 8 + 32 / (self.block[0] * self.block[1])
        return 8.0

    # -- grouping: view x so that each scaling group is reduced over dims that `_group_dims` names --
    def _grouped(self, xf: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
        if self.scaling == "tensor":
            return xf.reshape(1, -1), (0, 1)
        if self.scaling == "row":
            return xf, (-1,)
        r, c = self.block
        if xf.dim() == 0 or xf.shape[-1] % c or (r > 1 and (xf.dim() < 2 or xf.shape[-2] % r)):
            raise ValueError(
                f"{self.name} scales {r}x{c} blocks over the last {'two dims' if r > 1 else 'dim'}, "
                f"but the tensor's shape is {tuple(xf.shape)}; use a multiple of the block or another scaling"
            )
        if r == 1:
            return xf.reshape(*xf.shape[:-1], xf.shape[-1] // c, c), (-1,)
        lead, rows, cols = xf.shape[:-2], xf.shape[-2], xf.shape[-1]
        return xf.reshape(*lead, rows // r, r, cols // c, c), (-3, -1)

    def quantize(self, x: torch.Tensor) -> QTensor:
        xf = x.float()
        grouped, dims = self._grouped(xf)
        finite = torch.isfinite(grouped)
        amax = torch.where(finite, grouped.abs(), 0.0).amax(dim=dims, keepdim=True)
        # A tensor divisor, not a Python float: with a scalar divisor CUDA's torch computed different scales
        # than CPU's correctly rounded amax / 448 (seen on an H200; x * (1/448) differs on ~half of inputs).
        scale = torch.where(amax > 0, amax / torch.full_like(amax, self.fmax), torch.ones_like(amax))
        scaled = (grouped / scale).clamp(-self.fmax, self.fmax)
        # clamp maps +-Inf to +-FMAX: put the non-finite values back (Inf -> NaN in E4M3, kept in E5M2).
        if self.element == "e4m3":
            scaled = torch.where(finite, scaled, float("nan"))
        else:
            scaled = torch.where(finite, scaled, grouped)
        codes = scaled.to(self.torch_dtype).reshape(x.shape)
        return QTensor(codes, self._squeeze_scale(scale), None, tuple(x.shape), x.dtype, self.name)

    def _squeeze_scale(self, scale: torch.Tensor) -> torch.Tensor:
        if self.scaling == "tensor":
            return scale.reshape(())
        if self.scaling == "row":
            return scale                                  # [..., 1]
        if self.block[0] == 1:
            return scale.squeeze(-1)                      # [..., K/c]
        return scale.squeeze(-1).squeeze(-2)              # [..., R/r, K/c]

    def dequantize(self, q: QTensor) -> torch.Tensor:
        self._check_q(q)
        values = q.codes.float()
        return values * self.expand_scales(q.scales, q.shape)

    def expand_scales(self, scales: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        """Scales broadcast to the element shape (for dequantization and references)."""
        if self.scaling in ("tensor", "row"):
            return scales
        r, c = self.block
        s = scales.repeat_interleave(c, dim=-1)
        if r > 1:
            s = s.repeat_interleave(r, dim=-2)
        return s.reshape(shape)
