"""The `Format` interface: a numeric format is pure data with a torch reference quantize/dequantize."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from trace_rl.formats.qtensor import QTensor


class Format(ABC):
    """A numeric format. Subclasses are frozen dataclasses; their `quantize` is the spec kernels match."""

    name: str

    @abstractmethod
    def quantize(self, x: torch.Tensor) -> QTensor:
        """Quantize along the last dimension (blocks run along it)."""

    @abstractmethod
    def dequantize(self, q: QTensor) -> torch.Tensor:
        """float32 tensor of the original shape."""

    @property
    @abstractmethod
    def bits_per_value(self) -> float:
        """Storage bits per element including per-block scales (per-tensor scales are not counted)."""

    def fake_quantize(self, x: torch.Tensor) -> torch.Tensor:
        """dequantize(quantize(x)) in x's dtype (no gradient handling: see backends.fake_quant)."""
        return self.dequantize(self.quantize(x)).to(x.dtype)

    def _check_q(self, q: QTensor) -> None:
        if q.format != self.name:
            raise ValueError(f"QTensor holds format {q.format!r}, not {self.name!r}")


def check_block_divisible(x: torch.Tensor, block: int, name: str) -> None:
    if x.dim() == 0 or x.shape[-1] % block:
        raise ValueError(
            f"{name} quantizes blocks of {block} along the last dimension, but the last dimension is "
            f"{x.shape[-1] if x.dim() else 'missing (0-d tensor)'}; pad it to a multiple of {block} "
            f"or keep this tensor in higher precision"
        )
