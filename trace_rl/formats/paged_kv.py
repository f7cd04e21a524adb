"""`PagedKV`: one layer's K (or V) cache in paged blocks, stored in a quantized format, with its reference.

Layout (the contract between the engine, the KV-write kernel and the decode-attention kernel): the cache
is `num_blocks` pages of `block_size` token slots; slot s of the flat cache is page s // block_size,
row s % block_size. Each slot holds `heads` vectors of `head_dim`, quantized per token and head along
head_dim with the format's per-token variant (`formats.per_token`):

| format   | codes                              | scales                       | global_scale         |
|----------|------------------------------------|------------------------------|----------------------|
| bf16     | [P, S, H, D] `dtype` (bf16/fp32)   | None                         | None                 |
| fp8_e4m3 | [P, S, H, D] float8_e4m3fn         | [P, S, H, 1] float32         | None                 |
| nvfp4    | [P, S, H, D/2] uint8 (2 codes/byte)| [P, S, H, D/16] float8_e4m3fn| [P, S, H, 1] float32 |
| mxfp4    | [P, S, H, D/2] uint8               | [P, S, H, D/32] uint8 (E8M0) | None                 |

(P = num_blocks, S = block_size, H = kv heads, D = head_dim.) A sequence's tokens live in the pages its
block table lists, in order. These are exactly the QTensor fields of `get_format(per_token(fmt))`
quantizing a [tokens, H, D] tensor, so the reference write is "quantize, scatter by slot".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trace_rl.formats.qtensor import QTensor
from trace_rl.formats.registry import get_format, per_token

KV_FORMATS = ("bf16", "fp8_e4m3", "nvfp4", "mxfp4")


@dataclass
class PagedKV:
    fmt: str                          # the per-token format name, e.g. "nvfp4:row", "fp8_e4m3:row"
    codes: torch.Tensor
    scales: torch.Tensor | None
    global_scale: torch.Tensor | None
    dtype: torch.dtype                # dtype values are dequantized to (and bf16 caches are stored in)

    @classmethod
    def allocate(cls, kv_format: str, num_blocks: int, block_size: int, heads: int, head_dim: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.bfloat16) -> PagedKV:
        if kv_format not in KV_FORMATS:
            raise ValueError(f"unknown KV-cache format {kv_format!r}; allowed: {', '.join(KV_FORMATS)}")
        fmt = per_token(kv_format)
        shape = (num_blocks, block_size, heads)
        # Fill with a quantized probe so every tensor has the format's dtype and per-slot shape.
        probe = get_format(fmt).quantize(torch.zeros(1, 1, 1, head_dim, device=device, dtype=dtype)) \
            if fmt != "bf16" else None
        if probe is None:
            return cls(fmt, torch.zeros(*shape, head_dim, device=device, dtype=dtype), None, None, dtype)
        make = lambda t: None if t is None else torch.zeros(*shape, t.shape[-1], device=device, dtype=t.dtype)  # noqa
        return cls(fmt, make(probe.codes), make(probe.scales), make(probe.global_scale), dtype)

    @property
    def block_size(self) -> int:
        return self.codes.shape[1]

    @property
    def head_dim(self) -> int:
        return self.codes.shape[-1] * (2 if self.codes.dtype == torch.uint8 else 1)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.codes, self.scales, self.global_scale)
                   if t is not None)

    def bytes_per_token(self) -> int:
        """Bytes one token occupies in this layer's cache (all heads)."""
        return self.nbytes // (self.codes.shape[0] * self.codes.shape[1])

    def _flat(self, t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.view(-1, *t.shape[2:])

    # -- the torch reference: the spec the kernels match --
    def write_reference(self, slots: torch.Tensor, x: torch.Tensor) -> None:
        """Quantize x [T, H, D] per token and head and store token i in flat slot `slots[i]`."""
        if self.fmt == "bf16":
            self._flat(self.codes)[slots] = x.to(self.codes.dtype)
            return
        q = get_format(self.fmt).quantize(x)
        for dst, src in ((self.codes, q.codes), (self.scales, q.scales), (self.global_scale, q.global_scale)):
            if dst is not None:
                self._flat(dst)[slots] = src.to(dst.dtype)

    def read_reference(self, slots: torch.Tensor) -> torch.Tensor:
        """Dequantized [T, H, D] values (in `dtype`) of the given flat slots."""
        if self.fmt == "bf16":
            return self._flat(self.codes)[slots].to(self.dtype)
        pick = lambda t: None if t is None else self._flat(t)[slots]  # noqa: E731
        codes = pick(self.codes)
        shape = (*codes.shape[:-1], self.head_dim)
        q = QTensor(codes, pick(self.scales), pick(self.global_scale), shape, self.dtype, self.fmt)
        return q.dequantize().to(self.dtype)


def slots_for(block_table: torch.Tensor, positions: torch.Tensor, block_size: int) -> torch.Tensor:
    """Flat slot of each (sequence, position): block_table [B, max_pages], positions [B, T] -> [B, T]."""
    page = torch.gather(block_table.long(), 1, positions // block_size)
    return page * block_size + positions % block_size
