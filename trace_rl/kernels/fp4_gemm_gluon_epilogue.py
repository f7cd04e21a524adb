"""Epilogues of the Gluon FP4 GEMM (fp4_gemm_gluon.py) and its programmatic-dependent-launch hooks.

- `_finish`: the first epilogue (wide token tiles, benchmark variants): direct store at split 1, else split-K by
  `fp4_gemm.finish_tile`'s deterministic scheme (partials stored, an acq_rel ticket, the last program adds the
  partials in split order), with a run-time split.
- `_finish_fast`: the shipped small-M epilogue (`GluonConfig.fin`). Same adds in the same order from the same zeros
  as `_finish`, so the same bits at the same split; cheaper on the path that reduces (benchmarks/gemm_fixed_kernels.py
  took `_finish` apart on sm_90 SASS): the row factors are loaded before the partial is stored (in flight under the
  fence and the ticket, not one more round trip after the reduction), the split is a constexpr (the reduction is
  straight-line code: every partial's loads issued before the first add, instead of ptxas' unroll-by-4 loop with
  dependent rounds at split 6 / 8), and the ticket reset is relaxed (the next launch sees it at the kernel boundary;
  an acq_rel reset costs a second MEMBAR.ALL.GPU ahead of the output store). It also applies the W4A4 per-token
  scale and the bias, in `fp4_gemm._epilogue_store`'s order (row factor, row scale, bias).

PDL (programmatic dependent launch, `launch_pdl=True`): `_gdc_launch` (griddepcontrol.launch_dependents) lets the
next kernel's CTAs be scheduled once every CTA of this grid has issued it; `_gdc_wait` (griddepcontrol.wait) blocks
until the kernels this one depends on have completed and their memory is visible. Both are no-ops in a kernel
launched without PDL. The contract the small-M kernel keeps under PDL: nothing written by an earlier kernel (the
activations, the W4A4 row scales, the bias, the split-K tickets and partial buffers another GEMM may still use) is
read, and nothing global is written, before `_gdc_wait`; only the weight (layout words, scale words, row factors),
which no kernel of a step writes, is read ahead of it.
"""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def _gdc_wait():
    """griddepcontrol.wait: block until the grids this one depends on (PDL) have completed and their memory is
    visible; returns at once in a kernel launched without PDL."""
    gl.inline_asm_elementwise("griddepcontrol.wait; // dummy $0", "=r", [], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _gdc_launch():
    """griddepcontrol.launch_dependents: the next kernel (launched with PDL) may be scheduled once every CTA of this
    grid has issued it (or exited); its CTAs run their prologue and wait in `_gdc_wait`."""
    gl.inline_asm_elementwise("griddepcontrol.launch_dependents; // dummy $0", "=r", [], dtype=gl.int32,
                              is_pure=False, pack=1)


@gluon.jit
def _epilogue_store(acc, rows, offs_m, M, N, rf_ptr, out_ptr, stride_om):
    n_mask = rows < N
    acc = acc * gl.expand_dims(gl.load(rf_ptr + rows, mask=n_mask, other=1.0), 1)
    ptrs = out_ptr + gl.expand_dims(offs_m, 0).to(gl.int64) * stride_om + gl.expand_dims(rows, 1)
    mask = gl.expand_dims(n_mask, 1) & gl.expand_dims(offs_m < M, 0)
    gl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _finish(acc, pid_n, pid_m, tile, pid_k, SPLIT_K, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om,
            BN: gl.constexpr, BM: gl.constexpr):
    """As fp4_gemm.finish_tile: direct store, or split pid_k's partial + ticket, the last program reducing the
    partials in split order (deterministic)."""
    layout: gl.constexpr = acc.type.layout
    rows = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    offs_m = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    if SPLIT_K == 1:
        _epilogue_store(acc, rows, offs_m, M, N, rf_ptr, out_ptr, stride_om)
    else:
        base = part_ptr + tile.to(gl.int64) * (SPLIT_K * BN * BM)
        offs = gl.expand_dims(gl.arange(0, BM, layout=gl.SliceLayout(0, layout)), 0) * BN + \
            gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(1, layout)), 1)
        gl.store(base + pid_k * (BN * BM) + offs, acc)
        gl.thread_barrier()                                      # every thread's partial is written
        ticket = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT_K - 1:                                # the last program of this tile reduces
            total = gl.zeros([BN, BM], gl.float32, layout)
            for s in range(SPLIT_K):                             # fixed order: deterministic
                total += gl.load(base + s * (BN * BM) + offs, cache_modifier=".cg")
            gl.atomic_xchg(count_ptr + tile, 0)                 # ready for the next launch
            _epilogue_store(total, rows, offs_m, M, N, rf_ptr, out_ptr, stride_om)


@gluon.jit
def _scale_and_store(acc, rf, rows, offs_m, ptrs, mask, M, N, row_scale_ptr, bias_ptr, out_ptr,
                     HAS_ROW_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr):
    """out = acc x row factor (x W4A4 row scale) (+ bias), in fp4_gemm._epilogue_store's order."""
    acc = acc * rf
    if HAS_ROW_SCALE:
        acc = acc * gl.expand_dims(gl.load(row_scale_ptr + offs_m, mask=offs_m < M, other=1.0), 0)
    if HAS_BIAS:
        acc = acc + gl.expand_dims(gl.load(bias_ptr + rows, mask=rows < N, other=0.0).to(gl.float32), 1)
    gl.store(ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@gluon.jit
def _finish_fast(acc, pid_n, pid_m, tile, pid_k, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om,
                 row_scale_ptr, bias_ptr, BN: gl.constexpr, BM: gl.constexpr, SPLIT: gl.constexpr,
                 PDL: gl.constexpr, HAS_ROW_SCALE: gl.constexpr, HAS_BIAS: gl.constexpr):
    """`_finish` with the row factors loaded first and the split a constexpr (see the module doc): the same adds
    in the same order, so the same bits. PDL: `_gdc_wait` before any global write and before reading the row
    scales and bias (an earlier kernel may have written them); the row factors (weight) are read before it."""
    layout: gl.constexpr = acc.type.layout
    rows = pid_n * BN + gl.arange(0, BN, layout=gl.SliceLayout(1, layout))
    offs_m = pid_m * BM + gl.arange(0, BM, layout=gl.SliceLayout(0, layout))
    n_mask = rows < N
    rf = gl.expand_dims(gl.load(rf_ptr + rows, mask=n_mask, other=1.0), 1)    # in flight under the ticket
    ptrs = out_ptr + gl.expand_dims(offs_m, 0).to(gl.int64) * stride_om + gl.expand_dims(rows, 1)
    mask = gl.expand_dims(n_mask, 1) & gl.expand_dims(offs_m < M, 0)
    if PDL:   # (the producer already waited before its first activation load; this covers the consumer warps)
        _gdc_wait()
    if SPLIT == 1:
        _scale_and_store(acc, rf, rows, offs_m, ptrs, mask, M, N, row_scale_ptr, bias_ptr, out_ptr, HAS_ROW_SCALE,
                         HAS_BIAS)
    else:
        base = part_ptr + tile.to(gl.int64) * (SPLIT * BN * BM)
        offs = gl.expand_dims(gl.arange(0, BM, layout=gl.SliceLayout(0, layout)), 0) * BN + \
            gl.expand_dims(gl.arange(0, BN, layout=gl.SliceLayout(1, layout)), 1)
        gl.store(base + pid_k * (BN * BM) + offs, acc)
        gl.thread_barrier()                                      # every thread's partial is written
        ticket = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        if ticket == SPLIT - 1:                                  # the last program of this tile reduces
            total = gl.zeros([BN, BM], gl.float32, layout)
            for s in gl.static_range(SPLIT):                     # fixed order, straight-line
                total += gl.load(base + s * (BN * BM) + offs, cache_modifier=".cg")
            _scale_and_store(total, rf, rows, offs_m, ptrs, mask, M, N, row_scale_ptr, bias_ptr, out_ptr,
                             HAS_ROW_SCALE, HAS_BIAS)
            gl.atomic_xchg(count_ptr + tile, 0, sem="relaxed", scope="gpu")    # ready for the next launch
