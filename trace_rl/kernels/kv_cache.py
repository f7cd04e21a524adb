"""Quantize-on-write of K or V into a `PagedKV` cache: one (token, head) row of head_dim per kernel row.

FP formats go through the row-quantize kernel with its outputs redirected to row slot * heads + head of
the flat cache (the layout in trace_rl/formats/paged_kv.py), so the write is bit-exact with
`PagedKV.write_reference`. A bf16 cache needs no quantization: it is the same torch scatter as the reference.
"""

from __future__ import annotations

import torch

from trace_rl.formats.paged_kv import PagedKV
from trace_rl.kernels.row_quantize import FORMAT_IDS, launch_quantize_rows


def kv_write(cache: PagedKV, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Store x [T, H, D] (token i in flat slot slots[i], int64) quantized per token and head."""
    T, H, D = x.shape
    if (H, D) != (cache.codes.shape[2], cache.head_dim):
        raise ValueError(f"kv_write: x has {H} heads x {D}, the cache holds {cache.codes.shape[2]} x {cache.head_dim}")
    if slots.shape != (T,):
        raise ValueError(f"kv_write: slots must be [T] = [{T}], got {tuple(slots.shape)}")
    if cache.fmt == "bf16":
        cache.codes.view(-1, H, D)[slots] = x.to(cache.codes.dtype)
        return
    if T == 0:
        return
    flat = lambda t: t.view(-1, t.shape[-1])  # noqa: E731  [P*S*H, last]
    codes = flat(cache.codes)
    codes = codes.view(torch.uint8) if codes.dtype != torch.uint8 else codes
    scales = flat(cache.scales)
    scales = scales.view(torch.uint8) if scales.dtype == torch.float8_e4m3fn else scales
    gscale = flat(cache.global_scale) if cache.global_scale is not None else None
    x2 = x.reshape(T * H, D)
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    launch_quantize_rows(x2, FORMAT_IDS[cache.fmt], codes, scales, gscale, dest=slots.to(torch.int64), heads=H)
