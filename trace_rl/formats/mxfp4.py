"""MXFP4 (OCP MX v1.0): E2M1 elements in blocks of 32, one E8M0 (power-of-two) scale per block.

The reference below is the spec; kernels match it bit for bit on codes and scales:

    block_amax = max |x| over the finite elements of the block (float32)
    exponent   = clamp(floor(log2(block_amax)) - 2, -127, 127)   (-127 for a zero block; 2 = emax of E2M1)
    scale code = exponent + 127  (uint8; 255 is NaN)
    code       = e2m1_encode(x / 2**exponent)   (exact power-of-two division; ties to even; saturate at 6)
    dequantized = e2m1_value(code) * 2**exponent

floor(log2(.)) is taken exactly from the float's exponent bits (torch.frexp), never from a float log2.
A block holding NaN or +-Inf gets scale code 255 (NaN) and dequantizes to NaN.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_rl.formats.base import Format, check_block_divisible
from trace_rl.formats.e2m1 import e2m1_decode, e2m1_encode, pack_nibbles, unpack_nibbles
from trace_rl.formats.qtensor import QTensor

E8M0_BIAS = 127
E8M0_NAN = 255
E2M1_EMAX = 2


def e8m0_to_float(codes: torch.Tensor) -> torch.Tensor:
    """float32 value 2**(code - 127) of E8M0 codes; code 255 is NaN."""
    exponent = codes.to(torch.int32) - E8M0_BIAS
    value = torch.ldexp(torch.ones_like(exponent, dtype=torch.float32), exponent)
    return torch.where(codes == E8M0_NAN, torch.full_like(value, float("nan")), value)


@dataclass(frozen=True)
class MXFP4(Format):
    name: str = "mxfp4"
    block_size: int = 32

    @property
    def bits_per_value(self) -> float:
        return 4 + 8 / self.block_size

    def quantize(self, x: torch.Tensor) -> QTensor:
        check_block_divisible(x, self.block_size, self.name)
        xf = x.float()
        blocks = xf.reshape(*xf.shape[:-1], xf.shape[-1] // self.block_size, self.block_size)
        finite = torch.isfinite(blocks)
        bad_block = ~finite.all(dim=-1)
        block_amax = torch.where(finite, blocks.abs(), 0.0).amax(dim=-1)
        _, frexp_exp = torch.frexp(block_amax)  # block_amax = m * 2**e, m in [0.5, 1): floor(log2) = e - 1
        exponent = torch.where(block_amax > 0, frexp_exp - 1 - E2M1_EMAX, -E8M0_BIAS)
        exponent = exponent.clamp(-E8M0_BIAS, E8M0_BIAS)
        scale_codes = (exponent + E8M0_BIAS).to(torch.uint8)
        scale_codes = torch.where(bad_block, torch.full_like(scale_codes, E8M0_NAN), scale_codes)
        # x / 2**e as x * 2**-e: exact for every exponent in range (a power of two, no rounding).
        scaled = torch.ldexp(blocks, (-exponent).unsqueeze(-1).to(torch.int32))
        codes = e2m1_encode(scaled).reshape(xf.shape)
        return QTensor(pack_nibbles(codes), scale_codes, None, tuple(x.shape), x.dtype, self.name)

    def dequantize(self, q: QTensor) -> torch.Tensor:
        self._check_q(q)
        values = e2m1_decode(unpack_nibbles(q.codes))
        blocks = values.reshape(*values.shape[:-1], -1, self.block_size)
        return (blocks * e8m0_to_float(q.scales).unsqueeze(-1)).reshape(q.shape)
