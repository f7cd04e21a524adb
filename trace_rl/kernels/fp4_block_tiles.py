"""FP4 quantization on block tiles: a [rows * NB, G] tile holding one scale block per tile row (blocks are
contiguous in memory), so a block's amax is a reduction along axis 1 and block-level values broadcast back without
a layout conversion (the [rows, K] -> [rows, K/G, G] reshape of row_quantize.py's general kernel does one, through
shared memory, for every block-level value). `fp4_round_block_rows` is the block rounding of every block-tile
kernel: the W4A4 activations' here and the weight sync's (weight_quantize.fp4_block_codes, which
quantize_relayout.py calls too).

`_quantize_dequant_rows_kernel` is the W4A4 activation path (`row_quantize.quantize_dequant_bf16`, launched by
`row_quantize.launch_quantize_rows`) for nvfp4:row / mxfp4 rows up to 16K wide, same bits as the general kernel's
`EMIT_BF16`: a row held in registers as up to 4 power-of-two chunks (K = 768: 3 x 256 instead of 1024 with a
quarter masked); E2M1 rounding on float bits (`e2m1_round`); the division by the block step as a reciprocal per
block plus two exact FMA corrections (`div_rn_by_reciprocal`). sm_90 SASS per element (Triton 3.6, whole kernel,
static; against the general kernel): nvfp4:row 471 x 2048 99.5 -> 63 (54 on the common branch), SiLU x mul
3768 x 768 127 (+ a quarter masked) -> 76, mxfp4 50 -> 26.5 (the compile gate's cases: row_quantize_gate.py).
"""

from __future__ import annotations

import functools

import triton
import triton.language as tl

from trace_rl.kernels import interpreting
from trace_rl.kernels.fp_bits import (
    div_by_reciprocal,
    e2m1_round,
    e4m3_round,
    e8m0_inverse,
    e8m0_scale_code,
    fast_div_ok,
    finite_abs,
)
from trace_rl.kernels.swiglu import silu_mul_f32


@triton.jit
def _load_operand(ptrs, mask, K, SILU_MUL: tl.constexpr, SILU_EXACT: tl.constexpr = False,
                  SILU_INTERP: tl.constexpr = False):
    """x at `ptrs` as float32; SILU_MUL: silu(x) * x[+K columns] rounded as `swiglu.silu_mul` rounds it
    (`swiglu.silu_mul_f32`: SiLU in float32 rounded to x's dtype, the product rounded again; SILU_EXACT: torch's
    CUDA SiLU bit for bit, SILU_INTERP its interpreter stand-in, `swiglu.silu_launch_args`). Shared by both tile
    shapes (row_quantize._load_rows, `_load_blocks`)."""
    g = tl.load(ptrs, mask=mask, other=0.0)
    if SILU_MUL:
        u = tl.load(ptrs + K, mask=mask, other=0.0)
        return silu_mul_f32(g, u, SILU_EXACT, SILU_INTERP)
    return g.to(tl.float32)


@triton.jit
def _load_blocks(src, row0, n_rows, k0, K, ROWS: tl.constexpr, NB: tl.constexpr, G: tl.constexpr):
    """Columns k0 .. k0 + NB*G of rows row0 .. row0 + ROWS of x as a [ROWS * NB, G] float32 tile, one scale block
    per tile row (blocks are contiguous in memory): the block amax is a reduction along axis 1 and its
    result broadcasts back without a layout conversion (the [rows, K] -> [rows, K/G, G] reshape did one,
    through shared memory, for every block-level value). `_quantize_dequant_row_chunks`' loader for x itself:
    src = (x_ptr, stride_x, SILU_MUL, SILU_EXACT, SILU_INTERP) (`_load_operand`)."""
    x_ptr, stride_x, SILU_MUL, SILU_EXACT, SILU_INTERP = src
    i = tl.arange(0, ROWS * NB)
    rows = row0 + i // NB
    cols = k0 + (i % NB) * G
    mask = (rows < n_rows)[:, None] & (cols < K)[:, None]
    ptrs = x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[:, None] + tl.arange(0, G)[None, :]
    return _load_operand(ptrs, mask, K, SILU_MUL, SILU_EXACT, SILU_INTERP)


@triton.jit
def _block_stats(xb, ROWS: tl.constexpr, NB: tl.constexpr):
    """[ROWS * NB, G] tile -> (finite block amax [ROWS * NB], bad block flag, row amax [ROWS])."""
    xa, finite = finite_abs(xb)
    block_amax = tl.max(xa, axis=1)
    bad = tl.max(tl.where(finite, 0, 1), axis=1) > 0
    return block_amax, bad, tl.max(tl.reshape(block_amax, [ROWS, NB]), axis=1)


@triton.jit
def fp4_round_block_rows(xb, block_amax, bad, gscale, fast_div, MX: tl.constexpr):
    """`fp4_quantize_blocks` on a [N, G] tile of whole blocks, one block per tile row, with the block amax / NaN
    flag / global scale per tile row ([N]; mxfp4: gscale unused): the same rounding steps, so the same bits ->
    (x / block scale [N, G] float32, scale code [N] int32: E8M0, 255 for a block holding NaN/Inf, or E4M3,
    0x7F; block step [N] float32, NaN for such a block). The one definition for the block-tile kernels: the W4A4
    activations (`_dequant_blocks`) and the weight sync (`weight_quantize.py`)."""
    if MX:
        scale_code = tl.where(bad, 255, e8m0_scale_code(block_amax))
        scaled = xb * e8m0_inverse(tl.minimum(scale_code, 254))[:, None]     # x / 2**e as x * 2**-e
        step = (scale_code << 23).to(tl.float32, bitcast=True)
        step = tl.where(scale_code == 0, 5.877471754111438e-39, step)
        step = tl.where(bad, float("nan"), step)
    else:
        v = tl.minimum(tl.math.div_rn(tl.math.div_rn(block_amax, 6.0), gscale), 448.0)
        scale_code, scale_val = e4m3_round(v)
        scale_code = tl.where(bad, 0x7F, scale_code)
        full = tl.where(bad, float("nan"), scale_val * gscale)
        # x / full, correctly rounded: by `div_rn_by_reciprocal` (no per-element MUFU.RCP / FCHK / slow-path
        # branch) when fast_div (every global scale of the tile comes from an amax that is 0 or in
        # [2**-58, 2**99], `fast_div_ok`); else (tiny or huge amaxes) per element div_rn.
        if fast_div:   # a zero step (x * 0.0) as reciprocal 0 of 1, per block, not a select per element
            zero = full == 0
            y = tl.where(zero, 0.0, tl.math.div_rn(1.0, full))
            scaled = div_by_reciprocal(xb, tl.where(zero, 1.0, full)[:, None], y[:, None])
        else:
            scaled = tl.where(full[:, None] == 0, xb * 0.0, tl.math.div_rn(xb, full[:, None]))
        step = tl.where(bad, float("nan"), scale_val)
    return scaled, scale_code, step


@triton.jit
def _dequant_blocks(xb, block_amax, bad, gscale, fast_div, MX: tl.constexpr):
    """Code value x block step of a [N, G] block tile in bf16 (`fp4_round_block_rows`)."""
    scaled, _, step = fp4_round_block_rows(xb, block_amax, bad, gscale, fast_div, MX)
    return (e2m1_round(scaled) * step[:, None]).to(tl.bfloat16)


@triton.jit
def _row_e4m3_top(amax, row0, n_rows, rs_ptr, ROWS: tl.constexpr, NB: tl.constexpr):
    """mxfp4 rows emitted as E4M3 for the FP8 operand cache (operand_cache_fp8.py): each row's largest block scale
    code top = e8m0_scale_code(row amax) [ROWS], its row scale 2**(top - 138) stored to rs_ptr (a float32 subnormal
    for top < 12, built on the bits), and top once per block ([ROWS * NB], the block tile's layout)."""
    top = e8m0_scale_code(amax)
    sub = tl.full([ROWS], 1, tl.int32) << tl.minimum(top + 11, 22)
    rs = tl.where(top >= 12, (top - 11) << 23, sub).to(tl.float32, bitcast=True)
    rows = row0 + tl.arange(0, ROWS)
    tl.store(rs_ptr + rows, rs, mask=rows < n_rows)
    return tl.reshape(tl.broadcast_to(top[:, None], [ROWS, NB]), [ROWS * NB])


@triton.jit
def _e4m3_blocks(xb, block_amax, bad, top):
    """E4M3 bytes (uint8) of an mxfp4 [N, G] block tile: code value x 2**(e - top + 6), e the block's scale code and
    top its row's largest (`_row_e4m3_top`): exact for e >= top - 14, rounded to nearest even below (0 for
    e < top - 132, whose values are far below E4M3's smallest subnormal); NaN (0x7F) for a block holding NaN/Inf."""
    scaled, scale_code, _ = fp4_round_block_rows(xb, block_amax, bad, block_amax, True, True)
    d = tl.where(bad, 0, scale_code - top + 133)                        # biased exponent of 2**(e - top + 6)
    step = tl.where(d > 0, d << 23, 0).to(tl.float32, bitcast=True)
    w = e2m1_round(scaled) * step[:, None]                              # exact in float32, |w| <= 384
    mag, _ = e4m3_round(tl.abs(w))
    code = mag | ((w.to(tl.int32, bitcast=True) >> 24) & 0x80)
    return tl.where(bad[:, None], 0x7F, code).to(tl.uint8)


@triton.jit
def _emit_blocks(xb, block_amax, bad, gs, fast_div, MX: tl.constexpr, E4M3: tl.constexpr):
    """The W4A4 operand of a block tile: bf16 (`_dequant_blocks`, gs the global scales) or, E4M3 (mxfp4, the FP8
    operand cache), E4M3 bytes (`_e4m3_blocks`, gs the row's top scale code per block)."""
    if E4M3:
        return _e4m3_blocks(xb, block_amax, bad, gs)
    else:
        return _dequant_blocks(xb, block_amax, bad, gs, fast_div, MX)


@triton.jit
def _store_blocks(out_ptr, vals, row0, n_rows, k0, K, stride_out, ROWS: tl.constexpr, NB: tl.constexpr,
                  G: tl.constexpr):
    i = tl.arange(0, ROWS * NB)
    rows = row0 + i // NB
    cols = k0 + (i % NB) * G
    mask = (rows < n_rows)[:, None] & (cols < K)[:, None]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * stride_out + cols[:, None] + tl.arange(0, G)[None, :], vals,
             mask=mask)


@triton.jit
def _row_global_scales(amax, row0, n_rows, gscale_ptr, MX: tl.constexpr, ROWS: tl.constexpr, NB: tl.constexpr):
    """The global-scale step after the row amax [ROWS] of rows row0 .. row0 + ROWS: nvfp4:row stores each row's
    global scale (amax / 2688; 1.0 for an all-zero row) to gscale_ptr and returns it once per block ([ROWS * NB],
    the block tile's layout) with whether `fast_div_ok` holds for every row of the tile (a scalar); mxfp4 has no
    global scale: ones, and True (its division is by a power of two). Shared by every per-token W4A4 kernel
    (`_quantize_dequant_row_chunks`, rmsnorm_quantize.py) so the row scales they store are one definition."""
    if MX:
        gs = tl.full([ROWS * NB], 1.0, dtype=tl.float32)
        fast_div = True
    else:
        gscale = tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)          # [ROWS]
        fast_div = tl.min(fast_div_ok(amax).to(tl.int32), axis=0) == 1      # same bits either way
        rows = row0 + tl.arange(0, ROWS)
        tl.store(gscale_ptr + rows, gscale, mask=rows < n_rows)
        gs = tl.reshape(tl.broadcast_to(gscale[:, None], [ROWS, NB]), [ROWS * NB])
    return gs, fast_div


@triton.jit
def _quantize_dequant_row_chunks(LOAD: tl.constexpr, src, out_ptr, gscale_ptr, row0, n_rows, K, stride_out,
                                 MX: tl.constexpr, ROWS: tl.constexpr, NB: tl.constexpr, NCH: tl.constexpr,
                                 E4M3: tl.constexpr = False):
    """The body of the per-token W4A4 block-tile quantizers: ROWS rows from row0, each held in registers as NCH
    (1..4) chunks of NB blocks of G elements (K <= NCH * NB * G; K = 768 is 3 chunks of 256, not one of 1024 with
    a quarter masked). Row amax (nvfp4:row), then per block the scale, codes, and code value x block step in bf16
    to out_ptr; the row global scale to gscale_ptr (`_row_global_scales`). The operand comes from the loader
    `LOAD(src, row0, n_rows, k0, K, ROWS, NB, G)` -> the [ROWS * NB, G] float32 chunk at column k0 (`src`: the
    loader's pointers, strides and switches as one tuple): `_load_blocks` for `_quantize_dequant_rows_kernel`,
    epilogue_silu_quantize.py's for the GEMM epilogue. A @triton.jit helper is inlined, so each kernel compiles to
    what its own copy of this code did."""
    G: tl.constexpr = 32 if MX else 16
    CH: tl.constexpr = NB * G
    x0 = LOAD(src, row0, n_rows, 0, K, ROWS, NB, G)
    a0, b0, amax = _block_stats(x0, ROWS, NB)
    if NCH > 1:
        x1 = LOAD(src, row0, n_rows, CH, K, ROWS, NB, G)
        a1, b1, m1 = _block_stats(x1, ROWS, NB)
        amax = tl.maximum(amax, m1)
    if NCH > 2:
        x2 = LOAD(src, row0, n_rows, 2 * CH, K, ROWS, NB, G)
        a2, b2, m2 = _block_stats(x2, ROWS, NB)
        amax = tl.maximum(amax, m2)
    if NCH > 3:
        x3 = LOAD(src, row0, n_rows, 3 * CH, K, ROWS, NB, G)
        a3, b3, m3 = _block_stats(x3, ROWS, NB)
        amax = tl.maximum(amax, m3)
    if E4M3:    # the row's top scale code (its row scale stored to gscale_ptr) instead of a global scale
        gs = _row_e4m3_top(amax, row0, n_rows, gscale_ptr, ROWS, NB)
        fast_div = True
    else:
        gs, fast_div = _row_global_scales(amax, row0, n_rows, gscale_ptr, MX, ROWS, NB)
    _store_blocks(out_ptr, _emit_blocks(x0, a0, b0, gs, fast_div, MX, E4M3), row0, n_rows, 0, K, stride_out,
                  ROWS, NB, G)
    if NCH > 1:
        _store_blocks(out_ptr, _emit_blocks(x1, a1, b1, gs, fast_div, MX, E4M3), row0, n_rows, CH, K, stride_out,
                      ROWS, NB, G)
    if NCH > 2:
        _store_blocks(out_ptr, _emit_blocks(x2, a2, b2, gs, fast_div, MX, E4M3), row0, n_rows, 2 * CH, K,
                      stride_out, ROWS, NB, G)
    if NCH > 3:
        _store_blocks(out_ptr, _emit_blocks(x3, a3, b3, gs, fast_div, MX, E4M3), row0, n_rows, 3 * CH, K,
                      stride_out, ROWS, NB, G)


@triton.jit
def _quantize_dequant_rows_kernel(x_ptr, out_ptr, gscale_ptr, n_rows, K, stride_x, stride_out,
                                  MX: tl.constexpr, ROWS: tl.constexpr, NB: tl.constexpr, NCH: tl.constexpr,
                                  SILU_MUL: tl.constexpr, SILU_EXACT: tl.constexpr = False,
                                  SILU_INTERP: tl.constexpr = False,
                                  LAUNCH_DEPENDENTS: tl.constexpr = False, E4M3: tl.constexpr = False,
                                  PDL_WAIT: tl.constexpr = False):
    """The W4A4 activation path (`quantize_dequant_bf16`): `_quantize_dequant_row_chunks` on rows of x (SILU_MUL:
    of SiLU(x[:, :K]) * x[:, K:]). Same bits as `_quantize_rows_kernel`.
    LAUNCH_DEPENDENTS (compiled only, never in the interpreter): griddepcontrol.launch_dependents first, so a GEMM
    launched after it with programmatic dependent launch (the small-M Gluon GEMM) starts its setup and weight
    prefetch now; that GEMM waits for this kernel's completion before it reads the operand or the row scales.
    E4M3 (mxfp4): E4M3 bytes and the row scale instead of bf16 (`_e4m3_blocks`, the FP8 operand cache).
    PDL_WAIT (compiled only): this kernel is itself launched as a programmatic dependent (`launch_pdl=True`) of the
    kernel before it, so its CTAs may start before that kernel has finished: launch_dependents (as above), then
    griddepcontrol.wait before any global load or store (the rows it reads, and the buffers it writes, which that
    kernel may still read). The compile gate checks the wait (ACQBULK) precedes the first LDG/STG
    (row_quantize_gate.py, `GateCase.first_before`)."""
    if LAUNCH_DEPENDENTS or PDL_WAIT:
        tl.extra.cuda.gdc_launch_dependents()
    if PDL_WAIT:
        tl.extra.cuda.gdc_wait()
    _quantize_dequant_row_chunks(_load_blocks, (x_ptr, stride_x, SILU_MUL, SILU_EXACT, SILU_INTERP), out_ptr,
                                 gscale_ptr, tl.program_id(0) * ROWS, n_rows, K, stride_out, MX, ROWS, NB, NCH, E4M3)


@functools.cache
def _row_chunks(K: int, G: int) -> tuple[int, int] | None:
    """(NB, NCH) of `_dequant_tiles` for rows of K (G-element blocks), or None; cached: the search is a Python
    loop, and the W4A4 linears launch with a handful of widths on every call."""
    nblocks = K // G
    best = None
    for nch in (1, 2, 3, 4):
        nb = triton.next_power_of_2(triton.cdiv(nblocks, nch))
        key = (nch * nb, nch)
        if nb * G <= 16384 and (best is None or key < best[0]):
            best = (key, nb, nch)
    if best is None or best[0][0] * G > 16384:
        return None
    return best[1], best[2]


# Most warps a SiLU x mul row takes (`_dequant_tiles`): each element also holds its up value and the exact SiLU's
# temporaries, so a 12288-wide row (Qwen3-8B's down projection) at 8 warps takes 122 registers (Triton 3.6) or spills
# (3.9, 128); at 16 warps 64, the same 16 warps per SM. 8: the tile of the rows without SiLU.
SILU_MUL_MAX_WARPS = 16


def _dequant_tiles(n_rows: int, K: int, G: int, silu_mul: bool = False) -> tuple[int, int, int, int] | None:
    """(ROWS, NB, NCH, num_warps) for `_quantize_dequant_rows_kernel`, or None when a row does not fit in
    registers (K > 16384: the general kernel walks K). A row is NCH <= 4 chunks of NB blocks (NB a power of
    two) with as little masked padding as possible: K = 768 -> 3 x 256, 2048 -> 1 x 2048, 1536 -> 3 x 512.
    `silu_mul` (the operand is SiLU(gate) * up): up to `SILU_MUL_MAX_WARPS` warps instead of 8."""
    chunks = _row_chunks(K, G)
    if chunks is None:
        return None
    nb, nch = chunks

    def pow2_floor(n: int) -> int:
        return 1 << max(0, n.bit_length() - 1)

    if interpreting():
        rows = pow2_floor(max(1, min(64, triton.next_power_of_2(n_rows), 4096 // (nch * nb * G))))
        return rows, nb, nch, 4
    # ~16-24 elements per thread (a whole row per program from K = 2048 up; 471 rows of 2048: 471 programs
    # of 4 warps; 3768 rows of 768 (SiLU x mul from 1536): 1884 programs of 2 rows, 2 warps)
    rows = pow2_floor(max(1, min(8, 2048 // (nch * nb * G))))
    most = SILU_MUL_MAX_WARPS if silu_mul else 8
    return rows, nb, nch, pow2_floor(max(1, min(most, rows * nch * nb * G // 512)))
