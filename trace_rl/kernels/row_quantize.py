"""Row quantization kernel: NVFP4 (tensor or row global scale), MXFP4 and FP8 E4M3 per row.

One program quantizes BLOCK_M rows, walking K in BLOCK_K chunks: a first walk takes the row amax (row
formats only; the tensor-global NVFP4 amax comes from `_tensor_amax_kernel`), a second quantizes.
Output rows may be redirected (`dest_rows`), which is how the KV-cache write scatters (token, head) rows
into their paged slots. Bit-exact with `get_format(fmt).quantize` (trace_rl/formats) on codes and scales
of every block whose elements are finite; a block holding NaN/Inf gets the NaN scale there as here (its
element codes are unspecified: the reference's own depend on the CPU's NaN propagation).

`EMIT_BF16` is the W4A4 activation path: instead of codes it writes code value * block scale in bf16
(exact: E2M1 x E4M3 fits bf16) and the row's global scale separately, for the GEMM to consume. For
nvfp4:row / mxfp4 rows up to 16K wide that path runs `_quantize_dequant_rows_kernel` instead (same bits;
fp4_block_tiles.py: one scale block per tile row; its SASS counts are there).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats import QTensor, get_format
from trace_rl.formats.base import check_block_divisible
from trace_rl.kernels import interpreting
from trace_rl.kernels.fp4_block_tiles import (
    _dequant_tiles,
    _load_operand,
    _quantize_dequant_rows_kernel,
)
from trace_rl.kernels.fp_bits import (
    div_rn_by_reciprocal,
    e2m1_encode,
    e2m1_value,
    e4m3_round,
    e8m0_inverse,
    e8m0_scale_code,
    fast_div_ok,
    finite_abs,
)
from trace_rl.kernels.swiglu import silu_launch_args

FMT_NVFP4 = 0      # global scale given (per tensor)
FMT_NVFP4_ROW = 1  # global scale per row
FMT_MXFP4 = 2
FMT_FP8_ROW = 3
FORMAT_IDS = {"nvfp4": FMT_NVFP4, "nvfp4:row": FMT_NVFP4_ROW, "mxfp4": FMT_MXFP4, "fp8_e4m3:row": FMT_FP8_ROW}
BLOCK = {FMT_NVFP4: 16, FMT_NVFP4_ROW: 16, FMT_MXFP4: 32, FMT_FP8_ROW: 1}
USE_BLOCK_TILES = True   # W4A4 activations through `_quantize_dequant_rows_kernel` (False: the general kernel)
# `quantize(..., fast=True)` (the weight sync's re-quantization): nvfp4 / mxfp4 through the block-tile kernel
# (weight_quantize.py), nvfp4:row through this file's kernel with FAST_DIV; both divide by the block scales as
# `div_rn_by_reciprocal` instead of div_rn per element. Same bits (tests/kernels/test_quantize_fast_div.py), and
# on the H200 bit-exact on all 252 weights of the 8B model and faster (nvfp4 sync 27.3 -> 19.8 ms with the
# re-layout, docs/benchmarks.md), so on by default; `fast=False` keeps the general kernel.
FAST_QUANTIZE = True


@triton.jit
def _load_rows(x_ptr, rows, row_mask, cols, K, stride_x, SILU_MUL: tl.constexpr = False,
               SILU_EXACT: tl.constexpr = False, SILU_INTERP: tl.constexpr = False):
    """x[rows, cols] as float32; SILU_MUL: the operand is silu(x[:, cols]) * x[:, K + cols] (`_load_operand`)."""
    mask = row_mask[:, None] & (cols < K)[None, :]
    ptrs = x_ptr + rows[:, None].to(tl.int64) * stride_x + cols[None, :]
    return _load_operand(ptrs, mask, K, SILU_MUL, SILU_EXACT, SILU_INTERP)


@triton.jit
def _tensor_amax_kernel(x_ptr, amax_bits_ptr, n_rows, K, stride_x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """max |x| over the finite elements of the whole tensor, as float32 bits in one int32 (zeroed by the
    caller): an integer atomic max orders non-negative floats correctly, and keeps the global scale on
    the device (no torch reduction launches between the two passes)."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        xa, _ = finite_abs(_load_rows(x_ptr, rows, row_mask, k0 + tl.arange(0, BLOCK_K), K, stride_x))
        amax = tl.maximum(amax, tl.max(xa, axis=1))
    tl.atomic_max(amax_bits_ptr, tl.max(amax, axis=0).to(tl.int32, bitcast=True))


@triton.jit
def fp4_quantize_blocks(x, gscale, MX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr,
                        fast_div=False):
    """x [BLOCK_M, BLOCK_K] float32 (whole blocks of G along K), gscale [BLOCK_M] (nvfp4: the row or tensor
    global scale; mxfp4: unused) -> (codes [BLOCK_M, BLOCK_K / G, G] int32 E2M1, scale codes [BLOCK_M,
    BLOCK_K / G] int32 (E8M0 or E4M3 bits), block step [same] float32 = the block scale's value without the
    global scale (NaN for a block holding NaN/Inf)). The one definition of the per-block FP4 rounding: the row
    quantizer and the grouped GEMM's in-kernel W4A4 prologue both call it.
    `fast_div` (nvfp4; a scalar, True only when every global scale in the tile comes from an amax that is 0
    or in [2**-58, 2**99], `fast_div_ok`): x / block scale by `div_rn_by_reciprocal` (same bits, see there)
    instead of a div_rn per element."""
    blocks = tl.reshape(x, [BLOCK_M, BLOCK_K // G, G])
    xa, finite = finite_abs(blocks)
    block_amax = tl.max(xa, axis=2)
    bad = tl.max(tl.where(finite, 0, 1), axis=2) > 0
    if MX:
        scale_code = tl.where(bad, 255, e8m0_scale_code(block_amax))
        inv_step = e8m0_inverse(tl.minimum(scale_code, 254))     # x / 2**e as x * 2**-e (exact)
        scaled = blocks * inv_step[:, :, None]
        step = (scale_code << 23).to(tl.float32, bitcast=True)
        step = tl.where(scale_code == 0, 5.877471754111438e-39, step)    # 2**-127
        step = tl.where(bad, float("nan"), step)
    else:
        v = tl.minimum(tl.math.div_rn(tl.math.div_rn(block_amax, 6.0), gscale[:, None]), 448.0)
        scale_code, scale_val = e4m3_round(v)
        scale_code = tl.where(bad, 0x7F, scale_code)
        full = tl.where(bad, float("nan"), scale_val * gscale[:, None])[:, :, None]
        if fast_div:
            scaled = tl.where(full == 0, blocks * 0.0, div_rn_by_reciprocal(blocks, full))
        else:
            scaled = tl.where(full == 0, blocks * 0.0, tl.math.div_rn(blocks, full))
        step = tl.where(bad, float("nan"), scale_val)
    return e2m1_encode(scaled), scale_code, step


@triton.jit
def fp4_quantize_dequant_bf16(x, gscale, MX: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                              G: tl.constexpr):
    """x [BLOCK_M, BLOCK_K] float32 -> bf16 code value x block step (exact), the W4A4 activation operand."""
    codes, _, step = fp4_quantize_blocks(x, gscale, MX, BLOCK_M, BLOCK_K, G)
    return tl.reshape(e2m1_value(codes) * step[:, :, None], [BLOCK_M, BLOCK_K]).to(tl.bfloat16)


@triton.jit
def _quantize_chunk(x, k0, cols, out_rows, row_mask, gscale, codes_ptr, scales_ptr, K, stride_codes,
                    stride_scales, FMT: tl.constexpr, EMIT_BF16: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_K: tl.constexpr, G: tl.constexpr, fast_div=False):
    """Quantize and store x [BLOCK_M, BLOCK_K] (float32), columns k0.. of the rows."""
    if FMT == 3:
        scaled = tl.minimum(tl.maximum(tl.math.div_rn(x, gscale[:, None]), -448.0), 448.0)
        mag_code, _ = e4m3_round(tl.abs(scaled))
        code = mag_code | ((scaled.to(tl.int32, bitcast=True) < 0).to(tl.int32) << 7)
        code = tl.where(tl.abs(x) < float("inf"), code, 0x7F)   # NaN and +-Inf -> NaN
        out_mask = row_mask[:, None] & (cols < K)[None, :]
        tl.store(codes_ptr + out_rows[:, None] * stride_codes + cols[None, :], code.to(tl.uint8), mask=out_mask)
    else:
        codes, scale_code, step = fp4_quantize_blocks(x, gscale, FMT == 2, BLOCK_M, BLOCK_K, G, fast_div)
        sc_cols = k0 // G + tl.arange(0, BLOCK_K // G)
        if EMIT_BF16:
            deq = e2m1_value(codes).to(tl.float32) * step[:, :, None]
            deq = tl.reshape(deq, [BLOCK_M, BLOCK_K])
            out_mask = row_mask[:, None] & (cols < K)[None, :]
            tl.store(codes_ptr + out_rows[:, None] * stride_codes + cols[None, :], deq.to(tl.bfloat16),
                     mask=out_mask)
        else:
            lo, hi = tl.split(tl.reshape(codes, [BLOCK_M, BLOCK_K // 2, 2]))
            packed = (lo | (hi << 4)).to(tl.uint8)
            bcols = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            tl.store(codes_ptr + out_rows[:, None] * stride_codes + bcols[None, :], packed,
                     mask=row_mask[:, None] & (bcols < K // 2)[None, :])
            tl.store(scales_ptr + out_rows[:, None] * stride_scales + sc_cols[None, :],
                     scale_code.to(tl.uint8), mask=row_mask[:, None] & (sc_cols < K // G)[None, :])


@triton.jit
def _quantize_rows_kernel(
    x_ptr, codes_ptr, scales_ptr, gscale_ptr, dest_ptr,
    n_rows, K, stride_x, stride_codes, stride_scales, heads,
    FMT: tl.constexpr, HAS_DEST: tl.constexpr, EMIT_BF16: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, SINGLE: tl.constexpr,
    SILU_MUL: tl.constexpr = False, FAST_DIV: tl.constexpr = False, SILU_EXACT: tl.constexpr = False,
    SILU_INTERP: tl.constexpr = False, LAUNCH_DEPENDENTS: tl.constexpr = False, PDL_WAIT: tl.constexpr = False,
):
    """SINGLE (K <= BLOCK_K): each row is loaded once, for its amax and its codes. SILU_MUL: the operand is
    SiLU(x[:, :K]) * x[:, K:] (x has 2K columns), the experts' SwiGLU fused in. FAST_DIV (nvfp4:row): divide
    by the block scales as `div_rn_by_reciprocal` where `fast_div_ok` holds for every row amax of the program
    (else div_rn, as without it); same bits either way. LAUNCH_DEPENDENTS, PDL_WAIT: as
    `_quantize_dequant_rows_kernel`'s (the wait before the first global access, the KV write's slot load included)."""
    if LAUNCH_DEPENDENTS or PDL_WAIT:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    G: tl.constexpr = 16 if FMT <= 1 else (32 if FMT == 2 else BLOCK_K)  # elements per scale
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    if HAS_DEST:  # KV write: row r = (token r // heads, head r % heads) goes to slot dest[token]
        slot = tl.load(dest_ptr + rows // heads, mask=row_mask, other=0)
        out_rows = slot.to(tl.int64) * heads + rows % heads
    else:
        out_rows = rows.to(tl.int64)
    cols0 = tl.arange(0, BLOCK_K)
    if SINGLE:
        x_all = _load_rows(x_ptr, rows, row_mask, cols0, K, stride_x, SILU_MUL, SILU_EXACT, SILU_INTERP)

    # 1) the global scale: amax / 2688 for nvfp4 (tensor amax from _tensor_amax_kernel, in dest_ptr) and
    #    nvfp4:row, amax / 448 for fp8 rows; 1.0 for an all-zero tensor / row.
    if FMT == 0:
        t_amax = tl.load(dest_ptr).to(tl.int32).to(tl.float32, bitcast=True)
        g = tl.where(t_amax > 0, tl.math.div_rn(t_amax, 2688.0), 1.0)
        if tl.program_id(0) == 0:
            tl.store(gscale_ptr, g)
        gscale = g + tl.zeros([BLOCK_M], dtype=tl.float32)
        fast_div = False           # quantize(fast=True) takes tensor-scale nvfp4 to weight_quantize.py
    elif FMT == 1 or FMT == 3:
        if SINGLE:
            amax = tl.max(finite_abs(x_all)[0], axis=1)
        else:
            amax = tl.zeros([BLOCK_M], dtype=tl.float32)
            for k0 in range(0, K, BLOCK_K):
                xa, _ = finite_abs(_load_rows(x_ptr, rows, row_mask, k0 + cols0, K, stride_x, SILU_MUL, SILU_EXACT,
                                              SILU_INTERP))
                amax = tl.maximum(amax, tl.max(xa, axis=1))
        gscale = tl.where(amax > 0, tl.math.div_rn(amax, 2688.0 if FMT == 1 else 448.0), 1.0)
        fast_div = False
        if FAST_DIV and FMT == 1:
            fast_div = tl.min(fast_div_ok(amax).to(tl.int32), axis=0) == 1
        if FMT == 1 or EMIT_BF16:
            tl.store(gscale_ptr + out_rows, gscale, mask=row_mask)
        else:
            tl.store(scales_ptr + out_rows, gscale, mask=row_mask)   # fp8: the row scale is the scale
    else:
        gscale = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        fast_div = False

    # 2) quantize BLOCK_K columns at a time
    if SINGLE:
        _quantize_chunk(x_all, 0, cols0, out_rows, row_mask, gscale, codes_ptr, scales_ptr, K, stride_codes,
                        stride_scales, FMT, EMIT_BF16, BLOCK_M, BLOCK_K, G, fast_div)
    else:
        for k0 in range(0, K, BLOCK_K):
            x = _load_rows(x_ptr, rows, row_mask, k0 + cols0, K, stride_x, SILU_MUL, SILU_EXACT, SILU_INTERP)
            _quantize_chunk(x, k0, k0 + cols0, out_rows, row_mask, gscale, codes_ptr, scales_ptr, K,
                            stride_codes, stride_scales, FMT, EMIT_BF16, BLOCK_M, BLOCK_K, G, fast_div)



def _tiles(n_rows: int, K: int, G: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_K, num_warps). On the GPU a whole row up to 16K elements is one tile (one load,
    single pass; the first H200 run walked K in 128-wide chunks: one program per 16 rows of a 4096-wide
    activation took 108 us, latency-bound), with 16-32 elements per thread. In the interpreter each program
    costs milliseconds: take the whole problem in as few programs as possible."""
    if interpreting():
        return max(16, min(64, triton.next_power_of_2(n_rows))), max(G, min(1024, triton.next_power_of_2(K))), 4
    block_k = max(G, min(16384, triton.next_power_of_2(K)))
    block_m = max(1, min(16, 2048 // block_k))
    return block_m, block_k, max(1, min(16, block_m * block_k // 512))


def tensor_amax_bits(x2: torch.Tensor) -> torch.Tensor:
    """int32 [1]: the float32 bits of max |x| over the finite elements of x2."""
    n_rows, K = x2.shape
    out = torch.zeros(1, device=x2.device, dtype=torch.int32)
    bm, bk, warps = _tiles(n_rows, K, 16)
    _tensor_amax_kernel[(triton.cdiv(n_rows, bm),)](x2, out, n_rows, K, x2.stride(0), BLOCK_M=bm, BLOCK_K=bk,
                                                     num_warps=warps)
    return out


def launch_quantize_rows(x2, fmt_id, codes, scales, gscale, dest=None, heads=1, emit_bf16=False, silu_mul=False,
                         fast_div=False, launch_dependents=False, e4m3=False, pdl_wait=False):
    """Quantize rows of x2 [rows, K] (unit column stride) into preallocated outputs (see kernel). `dest`:
    the KV write's slots, or for nvfp4 (tensor scale) the int32 amax bits from `tensor_amax_bits`.
    `silu_mul`: x2 is [rows, 2K] gate | up. `fast_div`: the general kernel's FAST_DIV (nvfp4:row).
    `launch_dependents`: the kernel signals griddepcontrol.launch_dependents at its start (a programmatic dependent
    launch after it may begin; compiled kernels only: off in the interpreter). `e4m3` (mxfp4 with emit_bf16, the
    block-tile kernel only): E4M3 bytes into `codes` and each row's scale into `gscale` (`quantize_dequant_e4m3`).
    `pdl_wait`: launched as a programmatic dependent of the kernel before it (`launch_pdl=True`), the kernel signals
    launch_dependents and then waits (griddepcontrol.wait) before its first global access; for the small-M W4A4
    linear inside a CUDA-graph capture (`kernels.linear.w4a4_quantize_pdl` says when). Compiled kernels only: off in
    the interpreter, like `launch_dependents`; same bits either way."""
    launch_dependents = bool(launch_dependents) and not interpreting()
    pdl_wait = bool(pdl_wait) and not interpreting()
    pdl = {"PDL_WAIT": True, "launch_pdl": True} if pdl_wait else {}    # unset: the cached non-PDL compile
    n_rows = x2.shape[0]
    K = x2.shape[1] // 2 if silu_mul else x2.shape[1]
    G = BLOCK[fmt_id] if fmt_id != FMT_FP8_ROW else 16
    silu = silu_launch_args() if silu_mul else {}     # the SiLU form (swiglu.EXACT_SILU); none without SiLU
    block_tiles = emit_bf16 and dest is None and fmt_id in (FMT_NVFP4_ROW, FMT_MXFP4)
    tiles = _dequant_tiles(n_rows, K, G, silu_mul) if block_tiles else None
    if e4m3 and (tiles is None or fmt_id != FMT_MXFP4 or gscale is None):
        raise ValueError(f"launch_quantize_rows(e4m3=True): E4M3 rows are emitted by the block-tile kernel for mxfp4 "
                         f"rows up to 16384 wide with a row-scale buffer, not format id {fmt_id} rows of {K}")
    if tiles is not None and (USE_BLOCK_TILES or e4m3):
        rows, nb, nch, warps = tiles
        _quantize_dequant_rows_kernel[(triton.cdiv(n_rows, rows),)](
            x2, codes, gscale if gscale is not None else codes, n_rows, K, x2.stride(0), codes.stride(0),
            MX=fmt_id == FMT_MXFP4, ROWS=rows, NB=nb, NCH=nch, SILU_MUL=silu_mul, LAUNCH_DEPENDENTS=launch_dependents,
            E4M3=bool(e4m3), num_warps=warps, **silu, **pdl)
        return
    bm, bk, warps = _tiles(n_rows, K, G)
    grid = (triton.cdiv(n_rows, bm),)
    _quantize_rows_kernel[grid](
        x2, codes, scales if scales is not None else codes, gscale if gscale is not None else codes,
        dest if dest is not None else codes,
        n_rows, K, x2.stride(0), codes.stride(0), scales.stride(0) if scales is not None else 0, heads,
        FMT=fmt_id, HAS_DEST=dest is not None and fmt_id != FMT_NVFP4, EMIT_BF16=emit_bf16, BLOCK_M=bm, BLOCK_K=bk,
        SINGLE=K <= bk, SILU_MUL=silu_mul, FAST_DIV=bool(fast_div) and fmt_id == FMT_NVFP4_ROW,
        LAUNCH_DEPENDENTS=launch_dependents, num_warps=warps, **silu, **pdl)


def _rows(x: torch.Tensor) -> torch.Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def quantize(x: torch.Tensor, fmt_name: str, fast: bool | None = None) -> QTensor:
    """Kernel version of `get_format(fmt_name).quantize(x)`: same QTensor, bit for bit. `fast` (None: the
    module's FAST_QUANTIZE): nvfp4 / mxfp4 by the block-tile kernel (`weight_quantize.quantize_weight`), and
    nvfp4:row dividing by the block scales with a reciprocal per block plus exact FMA corrections
    (`div_rn_by_reciprocal`) instead of a correctly rounded division per element."""
    name = get_format(fmt_name).name
    if name not in FORMAT_IDS:
        raise ValueError(f"no quantize kernel for format {fmt_name!r}; kernels exist for "
                         f"{', '.join(FORMAT_IDS)} (use get_format(...).quantize for the others)")
    fast = FAST_QUANTIZE if fast is None else fast
    if fast and name in ("nvfp4", "mxfp4"):
        from trace_rl.kernels.weight_quantize import quantize_weight

        return quantize_weight(x, name)
    fmt_id = FORMAT_IDS[name]
    check_block_divisible(x, BLOCK[fmt_id], name)
    lead, K = tuple(x.shape[:-1]), x.shape[-1]
    x2 = _rows(x)
    n_rows, dev = x2.shape[0], x.device
    if fmt_id == FMT_FP8_ROW:
        codes = torch.empty(n_rows, K, device=dev, dtype=torch.uint8)
        scales = torch.empty(n_rows, 1, device=dev, dtype=torch.float32)
        if n_rows:
            launch_quantize_rows(x2, fmt_id, codes, scales, None)
        return QTensor(codes.view(torch.float8_e4m3fn).reshape(x.shape), scales.reshape(*lead, 1), None,
                       tuple(x.shape), x.dtype, name)
    G = BLOCK[fmt_id]
    codes = torch.empty(n_rows, K // 2, device=dev, dtype=torch.uint8)
    scales = torch.empty(n_rows, K // G, device=dev, dtype=torch.uint8)
    gscale, amax_bits = None, None
    if fmt_id == FMT_NVFP4:   # the kernel divides the tensor amax by 2688 (div_rn) and stores the scale
        gscale = torch.ones((), device=dev, dtype=torch.float32)
        amax_bits = tensor_amax_bits(x2) if n_rows else None
    elif fmt_id == FMT_NVFP4_ROW:
        gscale = torch.empty(n_rows, 1, device=dev, dtype=torch.float32)
    if n_rows:
        launch_quantize_rows(x2, fmt_id, codes, scales, gscale, dest=amax_bits, fast_div=fast)
    if fmt_id != FMT_MXFP4:
        scales = scales.view(torch.float8_e4m3fn)
        gscale = gscale.reshape(*lead, 1) if fmt_id == FMT_NVFP4_ROW else gscale
    return QTensor(codes.reshape(*lead, K // 2), scales.reshape(*lead, K // G), gscale, tuple(x.shape), x.dtype,
                   name)


def quantize_dequant_bf16(x2: torch.Tensor, fmt_name: str, silu_mul: bool = False, launch_dependents: bool = False,
                          pdl_wait: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """W4A4 activations: (bf16 [rows, K] = code value * block scale, float32 [rows] row global or None).

    x2 quantized per token with `fmt_name` ("nvfp4:row" or "mxfp4"); value * global reproduces
    `get_format(fmt_name).dequantize(quantize(x2))` up to the float32 rounding of that last product.
    `silu_mul`: x2 is [rows, 2K] (gate | up); quantize `swiglu.silu_mul(x2)` in the same launch (same codes
    and scales as running it first). `launch_dependents`: the kernel lets a programmatic dependent launch after it
    (the small-M Gluon GEMM, `kernels.linear`) start at once (`launch_quantize_rows`). `pdl_wait`: the launch is itself
    a programmatic dependent of the kernel before it (`launch_quantize_rows`; inside a CUDA-graph capture only)."""
    name = get_format(fmt_name).name
    if name not in ("nvfp4:row", "mxfp4"):
        raise ValueError(f"W4A4 activations are quantized per token to nvfp4:row or mxfp4, not {fmt_name!r}")
    fmt_id = FORMAT_IDS[name]
    if silu_mul and x2.shape[-1] % 2:
        raise ValueError(f"quantize_dequant_bf16(silu_mul=True): x has {x2.shape[-1]} columns, not gate | up halves")
    K = x2.shape[1] // 2 if silu_mul else x2.shape[1]
    check_block_divisible(x2[:, :K], BLOCK[fmt_id], name)
    n_rows = x2.shape[0]
    out = torch.empty(n_rows, K, device=x2.device, dtype=torch.bfloat16)
    gscale = torch.empty(n_rows, device=x2.device, dtype=torch.float32) if fmt_id == FMT_NVFP4_ROW else None
    if n_rows:
        launch_quantize_rows(x2, fmt_id, out, None, gscale, emit_bf16=True, silu_mul=silu_mul,
                             launch_dependents=launch_dependents, pdl_wait=pdl_wait)
    return out, gscale


def emits_e4m3(k: int, silu_mul: bool = False) -> bool:
    """Whether `quantize_dequant_e4m3` takes mxfp4 rows of k features (the block-tile kernel's widths)."""
    return k % BLOCK[FMT_MXFP4] == 0 and _dequant_tiles(1, k, BLOCK[FMT_MXFP4], silu_mul) is not None


def quantize_dequant_e4m3(x2: torch.Tensor, silu_mul: bool = False, launch_dependents: bool = False,
                          pdl_wait: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """mxfp4 W4A4 activations for the FP8 operand cache (operand_cache_fp8.py): (float8_e4m3fn [rows, K], float32
    [rows] row scale) from the same launch as `quantize_dequant_bf16(x2, "mxfp4", silu_mul)` with E4M3 stores: the
    same codes and block scales, each row shifted so its largest block sits at the top of E4M3; E4M3 value x
    2**(top - 133) is that bf16 operand for every block within 14 binades of its row's largest
    (`operand_cache_fp8.rows_e4m3_reference` is the spec). Rows up to 16384 wide (`emits_e4m3`)."""
    K = x2.shape[1] // 2 if silu_mul else x2.shape[1]
    if silu_mul and x2.shape[-1] % 2:
        raise ValueError(f"quantize_dequant_e4m3(silu_mul=True): x has {x2.shape[-1]} columns, not gate | up halves")
    check_block_divisible(x2[:, :K], BLOCK[FMT_MXFP4], "mxfp4")
    if not emits_e4m3(K, silu_mul):
        raise ValueError(f"quantize_dequant_e4m3: rows of {K} features are wider than the block-tile kernel takes "
                         f"(16384); use quantize_dequant_bf16 and operand_cache_fp8.rows_e4m3_reference")
    n_rows = x2.shape[0]
    out = torch.empty(n_rows, K, device=x2.device, dtype=torch.float8_e4m3fn)
    row_scale = torch.empty(n_rows, device=x2.device, dtype=torch.float32)
    if n_rows:
        launch_quantize_rows(x2, FMT_MXFP4, out.view(torch.uint8), None, row_scale, emit_bf16=True, silu_mul=silu_mul,
                             launch_dependents=launch_dependents, e4m3=True, pdl_wait=pdl_wait)
    return out, row_scale
