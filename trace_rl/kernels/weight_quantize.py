"""Block-tile weight quantizer: nvfp4 (tensor global scale) and mxfp4 codes and scales of a whole weight, the
weight sync's re-quantization (`quantize(w, fmt, fast=True)`).

Same bits as `row_quantize`'s general kernel (and so as `get_format(fmt).quantize`) on every block whose
elements are finite, with less work per element:
- a program takes NB scale blocks as an [NB, G] tile, one block per tile row, anywhere in the (contiguous)
  weight: the global scale is the tensor's (nvfp4, from `weight_amax_bits`) or none (mxfp4), so no row needs
  to be whole in a program, and the block amax reduces along axis 1 and broadcasts back without the [rows, K] ->
  [rows, K/G, G] reshape's shared-memory round trip (the general kernel does one per block-level value);
- the block rounding is `fp4_block_tiles.fp4_round_block_rows`, the W4A4 activation kernel's: nvfp4 divides by
  the block scale as `div_rn_by_reciprocal` (one correctly rounded reciprocal per block, two exact FMA
  corrections per element; fp_bits.py) when `fast_div_ok(tensor amax)` holds, else div_rn per element as
  before (weights of amax < 2**-58 or > 2**99).
- E2M1 codes by `e2m1_code` (on the float's bits) instead of `e2m1_encode`'s seven compares.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats import QTensor
from trace_rl.kernels.fp4_block_tiles import fp4_round_block_rows
from trace_rl.kernels.fp_bits import e2m1_code, fast_div_ok, finite_abs

FORMATS = ("nvfp4", "mxfp4")


@triton.jit
def nvfp4_tensor_scale(amax_ptr):
    """(tensor amax, global scale amax / 2688 or 1.0 for an all-zero weight) from the amax bits at amax_ptr."""
    t_amax = tl.load(amax_ptr).to(tl.float32, bitcast=True)
    return t_amax, tl.where(t_amax > 0, tl.math.div_rn(t_amax, 2688.0), 1.0)


@triton.jit
def fp4_block_codes(xb, gscale, fast_div, MX: tl.constexpr):
    """[N, G] float32 blocks (one per tile row) -> (E2M1 codes int32 [N, G], scale codes int32 [N]: E4M3 under
    the global scale `gscale` (nvfp4), or E8M0 (mxfp4); 0x7F / 255 for a block holding NaN/Inf)."""
    # block amax and NaN/Inf flag from one integer max of |x|'s bits (the order of non-negative floats, Inf and
    # NaN above every finite): 2 instructions per element instead of finite_abs's select, float max and flag
    # (~6); a NaN/Inf block's amax is then not its finite amax, but its scale is NaN whatever the amax
    amax_bits = tl.max(xb.to(tl.int32, bitcast=True) & 0x7FFFFFFF, axis=1)
    bad = amax_bits > 0x7F7FFFFF
    scaled, scale_code, _ = fp4_round_block_rows(xb, amax_bits.to(tl.float32, bitcast=True), bad, gscale,
                                                 fast_div, MX)
    return e2m1_code(scaled), scale_code


@triton.jit
def _quantize_weight_kernel(x_ptr, codes_ptr, scales_ptr, gscale_ptr, amax_ptr, n_blocks, MX: tl.constexpr,
                            NB: tl.constexpr):
    """Blocks i = program * NB .. + NB of the contiguous weight (block i: elements i * G ..; codes bytes
    i * G / 2 ..; scale i). No row index: a per-block division by the blocks per row cost more than the
    quantization (64-bit integer division). nvfp4: the tensor amax as float32 bits in amax_ptr (int32);
    program 0 stores the global scale."""
    G: tl.constexpr = 32 if MX else 16
    i = tl.program_id(0).to(tl.int64) * NB + tl.arange(0, NB)
    mask = i < n_blocks
    xb = tl.load(x_ptr + i[:, None] * G + tl.arange(0, G)[None, :], mask=mask[:, None], other=0.0).to(tl.float32)
    if MX:
        codes, scale_code = fp4_block_codes(xb, 1.0, False, True)
    else:
        t_amax, g = nvfp4_tensor_scale(amax_ptr)
        if tl.program_id(0) == 0:
            tl.store(gscale_ptr, g)
        codes, scale_code = fp4_block_codes(xb, g, fast_div_ok(t_amax), False)
    lo, hi = tl.split(tl.reshape(codes, [NB, G // 2, 2]))
    tl.store(codes_ptr + i[:, None] * (G // 2) + tl.arange(0, G // 2)[None, :], (lo | (hi << 4)).to(tl.uint8),
             mask=mask[:, None])
    tl.store(scales_ptr + i, scale_code.to(tl.uint8), mask=mask)


@triton.jit
def _weight_amax_kernel(x_ptr, amax_bits_ptr, n, BLOCK: tl.constexpr):
    """`row_quantize._tensor_amax_kernel` for a contiguous weight, as a flat tensor: BLOCK elements per program
    in one load each thread keeps 8 16-byte loads of in flight (the row kernel: one program and one same-address
    atomic per row, 12288 of them for an 8B gate_proj, a quarter of a 12288-wide row masked off)."""
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    xa, _ = finite_abs(tl.load(x_ptr + offs, mask=offs < n, other=0.0).to(tl.float32))
    tl.atomic_max(amax_bits_ptr, tl.max(xa, axis=0).to(tl.int32, bitcast=True))


AMAX_BLOCK = 16384


def weight_amax_bits(x: torch.Tensor) -> torch.Tensor:
    """int32 [1]: the float32 bits of max |x| over the finite elements of the contiguous tensor x (=
    `row_quantize.tensor_amax_bits`: a max, so the same bits whatever the reduction order)."""
    out = torch.zeros(1, device=x.device, dtype=torch.int32)
    if x.numel():
        _weight_amax_kernel[(triton.cdiv(x.numel(), AMAX_BLOCK),)](x, out, x.numel(), BLOCK=AMAX_BLOCK, num_warps=8)
    return out


@triton.jit
def _weights_amax_kernel(x_ptr, offs_ptr, numel_ptr, starts_ptr, amax_bits_ptr, T, BLOCK: tl.constexpr,
                         TP: tl.constexpr):
    """`_weight_amax_kernel` over T contiguous tensors in one launch (the weight sync's 252: one launch instead of
    252 launches' ramps and tails): tensor t holds numel[t] elements at x_ptr + offs[t] (int64 elements from x_ptr,
    may be negative) and takes programs starts[t] .. starts[t + 1]; its amax bits go to amax_bits_ptr[t]. offs[t]
    and numel[t] are multiples of 8 (the host checks): 16-byte loads, as in the one-tensor kernel."""
    pid = tl.program_id(0)
    j = tl.arange(0, TP)
    t = tl.sum((tl.load(starts_ptr + j, mask=j < T, other=0x7FFFFFFF) <= pid).to(tl.int32), axis=0) - 1
    offs = (pid - tl.load(starts_ptr + t)).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    base = tl.multiple_of(tl.load(offs_ptr + t), 8)
    n = tl.multiple_of(tl.load(numel_ptr + t), 8)
    xa, _ = finite_abs(tl.load(x_ptr + base + offs, mask=offs < n, other=0.0).to(tl.float32))
    tl.atomic_max(amax_bits_ptr + t, tl.max(xa, axis=0).to(tl.int32, bitcast=True))


def weights_amax_ok(ws: list) -> bool:
    """`weights_amax_bits` takes these: contiguous, one dtype and device, 16-byte aligned, numel multiples of 8."""
    return bool(ws) and all(w.dtype == ws[0].dtype and w.device == ws[0].device and w.is_contiguous()
                            and w.data_ptr() % 16 == 0 and w.numel() % 8 == 0 for w in ws)


def weights_amax_tables(ws: list) -> tuple:
    """The device tables of `weights_amax_bits(ws)` (built once where the same tensors are synced again, e.g. a
    CUDA graph: building them copies from the host)."""
    if not weights_amax_ok(ws):
        raise ValueError("weights_amax_bits takes contiguous tensors of one dtype on one device, 16-byte aligned, "
                         "with numel a multiple of 8 (`weights_amax_ok`)")
    es, base = ws[0].element_size(), ws[0].data_ptr()
    starts = [0]
    for w in ws:
        starts.append(starts[-1] + triton.cdiv(w.numel(), AMAX_BLOCK))
    dev = ws[0].device
    return (torch.tensor([(w.data_ptr() - base) // es for w in ws], dtype=torch.int64, device=dev),
            torch.tensor([w.numel() for w in ws], dtype=torch.int64, device=dev),
            torch.tensor(starts, dtype=torch.int32, device=dev))


def weights_amax_bits(ws: list, tables: tuple | None = None) -> torch.Tensor:
    """int32 [len(ws)]: `weight_amax_bits` of each contiguous tensor (one dtype, one device), one launch; element
    t (a [1] view) is what `quantize_relayout(..., amax_bits=...)` takes."""
    offs, numel, starts = weights_amax_tables(ws) if tables is None else tables
    out = torch.zeros(len(ws), device=ws[0].device, dtype=torch.int32)
    programs = sum(triton.cdiv(w.numel(), AMAX_BLOCK) for w in ws)       # from the host (graph capture)
    if programs:
        _weights_amax_kernel[(programs,)](ws[0], offs, numel, starts, out, len(ws), BLOCK=AMAX_BLOCK,
                                          TP=max(16, triton.next_power_of_2(len(ws))), num_warps=8)
    return out


def _blocks_per_program(n_blocks: int, G: int) -> tuple[int, int]:
    """(NB, num_warps): on the GPU 4096 elements per program of 4 warps (32 per thread); in the interpreter,
    where each program costs milliseconds, up to 1024 blocks."""
    from trace_rl.kernels import interpreting

    if interpreting():
        return max(1, min(1024, triton.next_power_of_2(n_blocks))), 4
    return 4096 // G, 4


def quantize_weight(x: torch.Tensor, fmt: str) -> QTensor:
    """`get_format(fmt).quantize(x)` for fmt "nvfp4" or "mxfp4", x [..., K] (K a multiple of the block): the
    same QTensor, bit for bit on finite blocks (a NaN/Inf block gets the NaN scale; its codes are unspecified,
    as in row_quantize)."""
    from trace_rl.formats.base import check_block_divisible

    if fmt not in FORMATS:
        raise ValueError(f"quantize_weight quantizes {' or '.join(FORMATS)}, not {fmt!r} (use kernels.quantize)")
    G = 32 if fmt == "mxfp4" else 16
    check_block_divisible(x, G, fmt)
    lead, K = tuple(x.shape[:-1]), x.shape[-1]
    x2 = x.reshape(-1, K).contiguous()   # a no-op for weights; the kernel indexes blocks of a flat tensor
    n_rows, dev = x2.shape[0], x.device
    codes = torch.empty(n_rows, K // 2, device=dev, dtype=torch.uint8)
    scales = torch.empty(n_rows, K // G, device=dev, dtype=torch.uint8)
    gscale = torch.ones((), device=dev, dtype=torch.float32) if fmt == "nvfp4" else None
    n_blocks = n_rows * (K // G)
    if n_blocks:
        amax = weight_amax_bits(x2) if fmt == "nvfp4" else codes
        nb, warps = _blocks_per_program(n_blocks, G)
        _quantize_weight_kernel[(triton.cdiv(n_blocks, nb),)](
            x2, codes, scales, gscale if gscale is not None else codes, amax, n_blocks, MX=fmt == "mxfp4", NB=nb,
            num_warps=warps)
    if fmt == "nvfp4":
        scales = scales.view(torch.float8_e4m3fn)
    return QTensor(codes.reshape(*lead, K // 2), scales.reshape(*lead, K // G), gscale, tuple(x.shape), x.dtype,
                   fmt)
