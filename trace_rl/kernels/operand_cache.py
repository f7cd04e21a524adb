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

**Stacked** (`attach_stacked`, `OperandStack`): layers that read one input and that `models.Linear.fuse` leaves apart
(q/k/v and gate/up of an nvfp4 model: each projection has its own per-tensor global scale) keep their caches as
consecutive row blocks of ONE bf16 [sum N, K] buffer (each part's `OperandCache.buf` is a view of its rows: the
same bytes as separate caches, not more), and their row factors (nvfp4: each part's own global x 2**19; mxfp4:
2**c_n) as one float32 [sum N] vector that each part's refresh rewrites beside its rows. From the same M on,
`stacked_matmul` then runs the group as one cuBLAS GEMM (float32 output) + one epilogue instead of one pair per
part. Same operand bits, same activation codes and row scales, same per-row factors and the same one rounding in
the epilogue: the only difference from the per-part GEMMs is cuBLAS's float32 accumulation order, which may
change with N (another kernel or split for the stacked shape). Parts with a bias are not stacked.
"""

from __future__ import annotations

import torch

from trace_rl.kernels import fp4_dequant
from trace_rl.kernels.hopper_fp4 import LAYOUT_KEY

KEY = "operand_cache"


class OperandStack:
    """The stacked caches of layers sharing an input: `buf` bf16 [sum N, K], `row_factor` float32 [sum N], `sizes`
    the parts' N in order (their caches are `buf`'s row blocks in that order)."""

    def __init__(self, buf: torch.Tensor, row_factor: torch.Tensor, sizes: tuple[int, ...]):
        self.buf, self.row_factor, self.sizes = buf, row_factor, sizes

    @property
    def n(self) -> int:
        return self.buf.shape[0]

    @property
    def nbytes(self) -> int:
        """The row factors' bytes: the operand's are counted once, by the parts' caches (views of `buf`)."""
        return self.row_factor.numel() * self.row_factor.element_size()


class OperandCache:
    """bf16 [N, K] = operand(layout["hopper_fp4"]) of one dense FP4 weight, refreshed in place at weight sync;
    in a stack: rows `lo` .. `lo` + N of `stack.buf`, its row factors written to `stack.row_factor` there too."""

    def __init__(self, layout: dict, buf: torch.Tensor, stack: OperandStack | None = None, lo: int = 0):
        self.layout, self.buf = layout, buf     # the packed weight's layout dict: its Hopper layout read at refresh
        self.stack, self.lo = stack, lo

    @property
    def nbytes(self) -> int:
        return self.buf.numel() * self.buf.element_size()

    def refresh_from(self, q) -> None:
        h = self.layout[LAYOUT_KEY]
        fp4_dequant.dequantize_to(q, h, self.buf)
        if self.stack is not None:
            self.stack.row_factor[self.lo:self.lo + h.n].copy_(h.row_factor[:h.n])


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


def attach_stacked(packeds: list) -> OperandStack:
    """One stacked cache (module doc) for dense nvfp4/mxfp4 weights of one format and K that read the same input,
    in this order; idempotent. Separate caches the parts already hold are replaced (freed), never kept beside it."""
    from trace_rl.kernels.linear import hopper_weight

    st = stacked(packeds)
    if st is not None:
        return st
    fmts = {(p.fmt, p.in_features) for p in packeds}
    if len(packeds) < 2 or len(fmts) != 1 or any(p.fmt not in ("nvfp4", "mxfp4") or p.q is None
                                                  or len(p.q.shape) != 2 for p in packeds):
        raise ValueError(f"operand cache: stacks >= 2 dense nvfp4/mxfp4 weights of one format and K, got "
                         f"{[(p.fmt, p.out_features, p.in_features) for p in packeds]}")
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        raise RuntimeError("operand cache: would be allocated inside a CUDA-graph capture; attach it before capturing")
    if any(getattr(p.layout.get(KEY), "fp8", False) for p in packeds):
        raise ValueError("operand cache: a stack holds bf16 operands; these weights hold FP8 operand caches "
                         "(operand_cache_fp8.py), which are never stacked")
    other = [p.layout[KEY] for p in packeds if getattr(p.layout.get(KEY), "stack", None) is not None]
    if other:   # taking its rows would leave that stack's other parts running per part, its buffer still held
        raise ValueError(f"operand cache: {len(other)} of these weights already sit in another stack (of "
                         f"{other[0].stack.sizes} rows); stack each shared-input group once, in one order")
    for p in packeds:
        p.layout.pop(KEY, None)     # a separate cache: replaced by the stack's rows (its memory freed first)
    hs = [hopper_weight(p) for p in packeds]
    sizes = tuple(h.n for h in hs)
    dev = packeds[0].q.codes.device
    st = OperandStack(torch.empty(sum(sizes), hs[0].k, dtype=torch.bfloat16, device=dev),
                      torch.empty(sum(sizes), dtype=torch.float32, device=dev), sizes)
    lo = 0
    for p, n in zip(packeds, sizes):
        oc = OperandCache(p.layout, st.buf[lo:lo + n], st, lo)
        oc.refresh_from(p.q)
        p.layout[KEY] = oc
        lo += n
    return st


def stacked(packeds: list) -> OperandStack | None:
    """The stack that `packeds`' caches are, in this order and whole; None if they are not one."""
    ocs = [p.layout.get(KEY) for p in packeds]
    st = ocs[0].stack if ocs and ocs[0] is not None else None
    if st is None or len(ocs) != len(st.sizes):
        return None
    lo = 0
    for oc, n in zip(ocs, st.sizes):
        if oc is None or oc.stack is not st or oc.lo != lo:
            return None
        lo += n
    return st


def cached(packed) -> OperandCache | None:
    return packed.layout.get(KEY)


def use_operand_cache(m: int, packed) -> bool:
    """Whether a dense FP4 linear of `m` rows reads its operand cache (it has one and m >= the dequant threshold)."""
    return KEY in packed.layout and m >= fp4_dequant.DEQUANT_CUBLAS_MIN_M


def use_fp8_operand(m: int, packed) -> bool:
    """Whether that cache is the FP8 one (operand_cache_fp8.py): the linear then takes E4M3 activations."""
    return use_operand_cache(m, packed) and getattr(packed.layout[KEY], "fp8", False)


def operand_cache_matmul(x2: torch.Tensor, packed, row_scale=None, bias=None, out_dtype=torch.bfloat16):
    """`fp4_dequant.dequant_matmul` without the dequantization: cuBLAS on the cached operand + the FP4 epilogue.
    An FP8 cache (operand_cache_fp8.py) takes x2 as float8_e4m3fn with its row scale (`quantize_dequant_e4m3`)."""
    oc = packed.layout[KEY]
    fp8 = getattr(oc, "fp8", False)
    if fp8 != (x2.dtype == torch.float8_e4m3fn) or (fp8 and row_scale is None):
        raise ValueError(f"operand cache: {'an FP8' if fp8 else 'a bf16'} cache got {x2.dtype} activations"
                         f"{' without their row scale' if fp8 and x2.dtype == torch.float8_e4m3fn else ''}; the FP8 "
                         f"cache takes the E4M3 rows and row scale of row_quantize.quantize_dequant_e4m3, the bf16 one "
                         f"bf16 rows")
    return fp4_dequant.operand_matmul(x2, oc.buf, oc.layout[LAYOUT_KEY], row_scale, bias, out_dtype)


def stacked_matmul(x2: torch.Tensor, st: OperandStack, row_scale=None, out_dtype=torch.bfloat16) -> torch.Tensor:
    """[M, sum N]: the stacked parts' outputs side by side (module doc), one cuBLAS GEMM + one epilogue."""
    return fp4_dequant.factor_matmul(x2, st.buf, st.row_factor, row_scale, None, out_dtype)


def stacked_silu_mul_quantize(x2: torch.Tensor, st: OperandStack, row_scale, fmt_name: str):
    """A gate | up stack (two parts of equal N) feeding a SiLU x mul: the stacked GEMM (float32 accumulator, as
    `stacked_matmul`) and then, instead of its epilogue and the quantize, `epilogue_silu_quantize`'s one launch ->
    (bf16 [M, N] W4A4 operand of the down projection, its float32 [M] row scale or None): the bits of
    `quantize_dequant_bf16(stacked_matmul(x2, st, row_scale), fmt_name, silu_mul=True)`."""
    from trace_rl.kernels.epilogue_silu_quantize import epilogue_silu_mul_quantize

    if len(st.sizes) != 2 or st.sizes[0] != st.sizes[1]:
        raise ValueError(f"stacked_silu_mul_quantize: takes a gate | up stack of two equal parts, got {st.sizes}")
    return epilogue_silu_mul_quantize(fp4_dequant.accumulate(x2, st.buf), st.row_factor, row_scale, fmt_name)


__all__ = ["KEY", "OperandCache", "OperandStack", "attach", "attach_stacked", "cached", "operand_cache_matmul",
           "stacked", "stacked_matmul", "stacked_silu_mul_quantize", "use_fp8_operand", "use_operand_cache"]
