"""`QTensor`: a quantized tensor as plain data (codes, scales, global scale, original shape and dtype)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass(frozen=True)
class QTensor:
    """The output of a format's `quantize`.

    - `codes`: the element codes. FP4 formats pack two E2M1 codes per uint8 (element 2i in the low
      nibble); FP8 formats hold a `torch.float8_*` tensor; `bf16` holds a bfloat16 tensor.
    - `scales`: per-block scales (`float8_e4m3fn` for nvfp4, uint8 E8M0 for mxfp4, float32 for fp8),
      or None.
    - `global_scale`: float32 scalar tensor (nvfp4 only), or None.
    - `shape`/`dtype`: the original tensor's shape and dtype; `format`: the format's name.
    """

    codes: torch.Tensor
    scales: torch.Tensor | None
    global_scale: torch.Tensor | None
    shape: tuple[int, ...]
    dtype: torch.dtype
    format: str

    def to(self, device: torch.device | str) -> QTensor:
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return replace(self, codes=move(self.codes), scales=move(self.scales),
                       global_scale=move(self.global_scale))

    @property
    def nbytes(self) -> int:
        """Bytes of storage (codes + scales + global scale)."""
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.global_scale)
                   if t is not None)

    def dequantize(self) -> torch.Tensor:
        from trace_rl.formats.registry import get_format

        return get_format(self.format).dequantize(self)
