"""bf16: the identity format (round to bfloat16; no scales). The precision every plan is judged against."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_rl.formats.base import Format
from trace_rl.formats.qtensor import QTensor


@dataclass(frozen=True)
class BF16(Format):
    name: str = "bf16"

    @property
    def bits_per_value(self) -> float:
        return 16.0

    def quantize(self, x: torch.Tensor) -> QTensor:
        return QTensor(x.to(torch.bfloat16), None, None, tuple(x.shape), x.dtype, self.name)

    def dequantize(self, q: QTensor) -> torch.Tensor:
        self._check_q(q)
        return q.codes.float()
