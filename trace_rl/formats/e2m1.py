"""E2M1, the 4-bit element type of NVFP4 and MXFP4: rounding, code <-> value, nibble packing.

Magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6 have indices 0..7; a code is `sign << 3 | index`. The sign bit is
the input's sign bit (so -0.0 and tiny negatives that round to zero give code 8, "negative zero", as the
hardware conversion does). Rounding is to nearest with ties to the even index, and magnitudes above 6
saturate to 6.
"""

from __future__ import annotations

import torch

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
E2M1_MAX = 6.0

# Midpoints between consecutive magnitudes. A value exactly on a midpoint (a tie) goes to the even
# index: to the upper magnitude when its index is even (midpoint inclusive), else to the lower one.
E2M1_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
E2M1_TIE_GOES_UP = (False, True, False, True, False, True, False)


def e2m1_round_index(mag: torch.Tensor) -> torch.Tensor:
    """Index (0..7, uint8) of the nearest E2M1 magnitude to `mag` >= 0, ties to even, saturating at 6."""
    idx = torch.zeros(mag.shape, dtype=torch.uint8, device=mag.device)
    for midpoint, up in zip(E2M1_MIDPOINTS, E2M1_TIE_GOES_UP):
        idx += (mag >= midpoint) if up else (mag > midpoint)
    return idx


def e2m1_encode(x: torch.Tensor) -> torch.Tensor:
    """Codes (uint8 in 0..15, one per element) of `x`, already divided by its block scale."""
    sign = torch.signbit(x).to(torch.uint8) << 3
    return e2m1_round_index(x.abs()) | sign


def e2m1_lut(device: torch.device | str = "cpu") -> torch.Tensor:
    """float32 value of each of the 16 codes (code 8 is -0.0)."""
    mags = torch.tensor(E2M1_MAGNITUDES, dtype=torch.float32, device=device)
    return torch.cat([mags, -mags])


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of unpacked codes (uint8 0..15)."""
    return e2m1_lut(codes.device)[codes.long()]


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes (K even) -> [..., K/2] uint8, element 2i in the low nibble, 2i+1 in the high one."""
    if codes.shape[-1] % 2:
        raise ValueError(f"packing two 4-bit codes per byte needs an even last dimension, got {codes.shape[-1]}")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_nibbles`: [..., K/2] uint8 -> [..., K] codes."""
    low, high = packed & 0x0F, packed >> 4
    return torch.stack([low, high], dim=-1).flatten(-2)
