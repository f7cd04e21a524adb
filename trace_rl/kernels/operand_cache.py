"""Persistent operand cache: a dense FP4 weight's bf16 operand kept beside it, so large-M linears skip dequantizing.

The dequantize + cuBLAS path (fp4_dequant.py) writes `operand(h)` into a shared scratch on every call, which for a
50M-element weight costs ~50 us and makes the path only tie the FP4 GEMM (hence its `DEQUANT_CUBLAS_MAX_WEIGHT`).
With the cache (opt-in: `NativeEngine(operand_cache=True)`, `rollout.operand_cache`), each dense FP4 weight holds
its own bf16 [N, K] buffer with exactly those bits, written at weight sync, and from `DEQUANT_CUBLAS_MIN_M` rows on
the linear is `fp4_dequant.operand_matmul` on it (the same cuBLAS float32-output call and FP4 epilogue as the
dequant path: the same result bit for bit, for every weight size). Below the threshold nothing changes (the FP4 GEMM
reads the packed weight). Cost: 2 bytes per weight element on top of the packed weight (Qwen3-8B: ~14 GB).

**Sync.** The cache is a layout entry, `packed.layout["operand_cache"]`, with `refresh_from(q)`: every weight sync
ends in `PackedWeight.refresh_layouts` (`QuantLinear.load_weight` on both the fused and the requantize path, the
engine's batched `load_linear_weights`, `distributed.weight_sync.load_packed`), which re-derives it in place after
the Hopper layout (inserted before it, so refreshed first; or already written by the fused sync): the buffer is
never reallocated and captured CUDA graphs keep reading it. `TRACE_RL_FP4_DEQUANT_CUBLAS` does not affect it.
"""

from __future__ import annotations

import torch

from trace_rl.kernels import fp4_dequant
from trace_rl.kernels.hopper_fp4 import LAYOUT_KEY

KEY = "operand_cache"


class OperandCache:
    """bf16 [N, K] = operand(layout["hopper_fp4"]) of one dense FP4 weight, refreshed in place at weight sync."""

    def __init__(self, layout: dict, buf: torch.Tensor):
        self.layout, self.buf = layout, buf     # the packed weight's layout dict: its Hopper layout read at refresh

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()

    def refresh_from(self, q) -> None:
        fp4_dequant.dequantize_to(q, self.layout[LAYOUT_KEY], self.buf)


def attach(packed) -> OperandCache:
    """The operand cache of a dense nvfp4/mxfp4 `packed` weight, allocated and filled on first call (outside CUDA-graph
    capture: the buffer must exist before any graph reads it)."""
    from trace_rl.kernels.linear import hopper_weight

    oc = packed.layout.get(KEY)
    if oc is not None:
        return oc
    if packed.fmt not in ("nvfp4", "mxfp4") or packed.q is None or len(packed.q.shape) != 2:
        raise ValueError(f"operand cache: takes a dense nvfp4/mxfp4 weight, got {packed.fmt} "
                         f"{None if packed.q is None else tuple(packed.q.shape)}")
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("operand cache: would be allocated inside a CUDA-graph capture; attach it before capturing")
    h = hopper_weight(packed)      # derived first: refresh_layouts re-derives it before the cache
    buf = torch.empty(h.n, h.k, dtype=torch.bfloat16, device=packed.q.codes.device)
    oc = OperandCache(packed.layout, buf)
    oc.refresh_from(packed.q)
    packed.layout[KEY] = oc
    return oc


def cached(packed) -> OperandCache | None:
    return packed.layout.get(KEY)


def use_operand_cache(m: int, packed) -> bool:
    """Whether a dense FP4 linear of `m` rows reads its operand cache (it has one and m >= the dequant threshold)."""
    return KEY in packed.layout and m >= fp4_dequant.DEQUANT_CUBLAS_MIN_M


def operand_cache_matmul(x2: torch.Tensor, packed, row_scale=None, bias=None, out_dtype=torch.bfloat16):
    """`fp4_dequant.dequant_matmul` without the dequantization: cuBLAS on the cached operand + the FP4 epilogue."""
    oc = packed.layout[KEY]
    return fp4_dequant.operand_matmul(x2, oc.buf, oc.layout[LAYOUT_KEY], row_scale, bias, out_dtype)


__all__ = ["KEY", "OperandCache", "attach", "cached", "operand_cache_matmul", "use_operand_cache"]
