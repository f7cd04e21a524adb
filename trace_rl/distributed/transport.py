"""Tensors through Ray's object store as raw bytes: `to_wire` / `from_wire`.

Why not let Ray pickle the tensors: with torch 2.13 and Ray 2.60, Ray's pickling of some dtypes fails on the
receiving side (float8 scale tensors of the packed weights: "UntypedStorage has no attribute 'dtype'",
seen here). Plain uint8 numpy arrays are Ray's zero-copy case: `ray.put` writes them once into shared
memory and every worker on the host maps them without a copy. The tensors `from_wire` returns view that
read-only memory: read them (copy into the engine's buffers), never write them.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping

import numpy as np
import torch

Wire = dict[str, tuple[np.ndarray, str, tuple[int, ...]]]


def to_wire(tensors: Mapping[str, torch.Tensor]) -> Wire:
    """{name: (uint8 bytes, dtype name, shape)} of CPU copies (device tensors are copied to the host)."""
    out = {}
    for key, t in tensors.items():
        t = t.detach().to("cpu").contiguous()
        out[key] = (t.reshape(-1).view(torch.uint8).numpy(), str(t.dtype).removeprefix("torch."), tuple(t.shape))
    return out


def from_wire(wire: Wire) -> dict[str, torch.Tensor]:
    """The tensors back, viewing `wire`'s memory (read-only when it came from the object store)."""
    out = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for key, (raw, dtype, shape) in wire.items():
            out[key] = torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)
    return out
