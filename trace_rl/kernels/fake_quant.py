"""Fused fake quantization for the trainer: quantize-dequantize a tensor in one kernel (one read, one write).

`fake_quantize(x, fmt)` returns `get_format(fmt).fake_quantize(x)` (= dequantize(quantize(x)) in x's
dtype) bit for bit; `fake_quantize(x, fmt, record)` returns what `correction.guided.guided_quantize(x,
record, fmt)` gives, cast to x's dtype (TRACE: the rollout's block scales and mantissa bits instead of
amaxes; rows the record marks invalid round to nearest with their own scales, as the reference does).

One program holds BLOCK_M whole rows in registers (BLOCK_K = K rounded up to a power of two), so a row's
amax, its block scales and its values come from one load; nothing is written but the output (no codes,
no scales). The straight-through gradient needs no kernel: backward passes the incoming gradient
unchanged (backends/fake_quant.py).

Formats (`FORMAT_IDS`): activations and KV per row (`nvfp4:row`, `mxfp4`, `fp8_e4m3:row`,
`fp8_e4m3:block` = 1x128), weights per output row with `nvfp4`'s and `fp8_e4m3:tensor`'s tensor amax
taken first by `_amax_bits_kernel` (an integer atomic max of float bits, on the device). Outputs are
float32 or bfloat16; the bf16 rounding is done on integer bits (round to nearest even, NaN -> 0x7FC0)
so the kernel is bit-exact in Triton's CPU interpreter too, whose float casts to bf16 are not faithful.
The arithmetic mirrors the formats' references (trace_rl/formats) operation by operation: correctly
rounded division (`div_rn`), E4M3 rounding on integer bits, E8M0 exponents from exponent bits.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats import get_format
from trace_rl.formats.base import check_block_divisible
from trace_rl.kernels.fp_bits import e4m3_round, e4m3_to_float, e8m0_inverse, e8m0_scale_code, e8m0_to_float

FMT_NVFP4 = 0        # E2M1 x E4M3 blocks of 16, float32 global scale per tensor (weights)
FMT_NVFP4_ROW = 1    # ... global scale per row (activations, KV)
FMT_MXFP4 = 2        # E2M1 x E8M0 blocks of 32
FMT_FP8_ROW = 3      # E4M3, one float32 scale per row
FMT_FP8_TENSOR = 4   # E4M3, one float32 scale per tensor (weights)
FMT_FP8_BLOCK = 5    # E4M3, one float32 scale per 1x128 block
FORMAT_IDS = {"nvfp4": FMT_NVFP4, "nvfp4:row": FMT_NVFP4_ROW, "mxfp4": FMT_MXFP4, "fp8_e4m3:row": FMT_FP8_ROW,
              "fp8_e4m3:tensor": FMT_FP8_TENSOR, "fp8_e4m3:block": FMT_FP8_BLOCK}
GROUP = {FMT_NVFP4: 16, FMT_NVFP4_ROW: 16, FMT_MXFP4: 32, FMT_FP8_BLOCK: 128}   # others: the whole row
GUIDED_IDS = (FMT_NVFP4_ROW, FMT_MXFP4)
OUT_DTYPES = (torch.float32, torch.bfloat16)


@triton.jit
def _amax_bits_kernel(x_ptr, out_ptr, n_rows, K, stride_x, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """out (int32, zeroed) = float32 bits of max |x| over the finite elements: an integer atomic max
    orders non-negative floats correctly."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    amax = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        mask = (rows < n_rows)[:, None] & (cols < K)[None, :]
        xa = tl.abs(tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_x + cols[None, :], mask=mask,
                            other=0.0).to(tl.float32))
        amax = tl.maximum(amax, tl.max(tl.where(xa < float("inf"), xa, 0.0), axis=1))
    tl.atomic_max(out_ptr, tl.max(amax, axis=0).to(tl.int32, bitcast=True))


@triton.jit
def _with_sign_of(mag, x):
    """mag (>= 0 or NaN) with x's sign bit: E2M1/E4M3 codes take the sign of the value they encode."""
    sign = x.to(tl.uint32, bitcast=True) & 0x80000000
    return (mag.to(tl.uint32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def _e2m1_nearest(a):
    """The E2M1 magnitude nearest to a >= 0 (ties to the even index, saturating at 6), without indices:
    the grid is 0..2 in steps of 1/2, 2..4 in steps of 1, 4..6 in steps of 2, and an even index is an
    even multiple of the step, so (a + C) - C with C = step * 2**23 (whose ulp is the step) rounds it
    exactly as round-half-even does. Two correctly rounded float adds; NaN stays NaN."""
    c = tl.where(a < 2.0, 4194304.0, tl.where(a < 4.0, 8388608.0, 16777216.0))
    return tl.minimum((a + c) - c, 6.0)


@triton.jit
def _nearest(blocks, gscale, FMT: tl.constexpr):
    """Round-to-nearest quantize-dequantize of x [M, NB, G] (float32) with its own block scales;
    `gscale` [M] is the nvfp4 global scale (row or tensor) or the fp8 tensor scale, unused otherwise."""
    xa = tl.abs(blocks)
    finite = xa < float("inf")                           # False for NaN too
    block_amax = tl.max(tl.where(finite, xa, 0.0), axis=2)    # [M, NB]
    bad = tl.max(tl.where(finite, 0, 1), axis=2) > 0
    if FMT >= 3:                                         # FP8 E4M3: scale = amax / 448 per group
        if FMT == 4:
            scale = gscale[:, None] + tl.zeros_like(block_amax)
        else:
            scale = tl.where(block_amax > 0, tl.math.div_rn(block_amax, 448.0), 1.0)
        scaled = tl.minimum(tl.math.div_rn(xa, scale[:, :, None]), 448.0)
        _, mag = e4m3_round(scaled)
        value = _with_sign_of(mag * scale[:, :, None], blocks)
        return tl.where(finite, value, float("nan"))     # NaN and +-Inf -> NaN (E4M3 has no Inf)
    if FMT == 2:                                         # MXFP4: step 2**(floor(log2 amax) - 2)
        scale_code = e8m0_scale_code(block_amax)
        inv_step = e8m0_inverse(scale_code)
        a = xa * inv_step[:, :, None]                    # exact: a power of two
        step = e8m0_to_float(tl.where(bad, 255, scale_code))
    else:                                                # NVFP4: E4M3 block scale x float32 global
        g = gscale[:, None]
        _, scale_val = e4m3_round(tl.minimum(tl.math.div_rn(tl.math.div_rn(block_amax, 6.0), g), 448.0))
        step = tl.where(bad, float("nan"), scale_val * g)
        # the reference's `x * 0 where step == 0` as a division by +inf (per block, not per element)
        a = tl.math.div_rn(xa, tl.where(step == 0, float("inf"), step)[:, :, None])
    return _with_sign_of(_e2m1_nearest(a) * step[:, :, None], blocks)


@triton.jit
def _guided(blocks, bit, scale_codes, gs, FMT: tl.constexpr):
    """TRACE: |x| [M, NB, G] divided by the rollout's step, clipped to 6; of the two E2M1 magnitudes
    around it (indices j, j+1 with j <= 6) the one whose index parity is the rollout's mantissa bit
    (`bit` [M, NB, G] int32); the sign is x's; NaN stays NaN.

    Without indices: q = the grid step around a (1/2 below 2, 1 below 4, 2 above), f = floor(a / q)
    (exact; f = 2 for every a in [4, 6], so j <= 6), the lower magnitude is f * q and j has f's parity."""
    if FMT == 2:    # x / 2**e as x * 2**-e: exact, no division (code 255: NaN)
        step = e8m0_to_float(scale_codes)
        inv_bits = tl.where(scale_codes == 254, 0x00400000, (254 - tl.minimum(scale_codes, 254)) << 23)
        inv_step = tl.where(scale_codes == 255, float("nan"), inv_bits.to(tl.float32, bitcast=True))
        a = tl.abs(blocks) * inv_step[:, :, None]
    else:           # the reference's `x * 0 where step == 0` as a division by +inf (per block)
        step = e4m3_to_float(scale_codes) * gs[:, None]
        a = tl.math.div_rn(tl.abs(blocks), tl.where(step == 0, float("inf"), step)[:, :, None])
    a = tl.minimum(a, 6.0, propagate_nan=tl.PropagateNan.ALL)
    q = tl.where(a < 2.0, 0.5, tl.where(a < 4.0, 1.0, 2.0))
    f = tl.where(a < 2.0, tl.floor(a * 2.0), tl.where(a < 4.0, tl.floor(a), 2.0))
    parity = ((f + 8388608.0).to(tl.int32, bitcast=True) & 1)
    mag = tl.where(parity == bit, f, f + 1.0) * q
    return _with_sign_of(mag * step[:, :, None], blocks)


@triton.jit
def _bf16_bits(v):
    """float32 -> bfloat16 bits (int16), round to nearest even, NaN -> 0x7FC0 (as torch's CPU cast): the
    interpreter's own cast is not faithful."""
    bits = v.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(v != v, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.int16, bitcast=True)


@triton.jit
def _row_scale(x, amax_ptr, FMT: tl.constexpr):
    """[M] float32: nvfp4's global scale (per tensor from the tensor amax, or per row) or fp8's tensor
    scale; 1.0 for formats whose scales are per block only."""
    if FMT == 0 or FMT == 4:      # tensor amax (from _amax_bits_kernel) / 2688 (nvfp4) or / 448 (fp8)
        t_amax = tl.load(amax_ptr).to(tl.float32, bitcast=True)
        g = tl.where(t_amax > 0, tl.math.div_rn(t_amax, 2688.0 if FMT == 0 else 448.0), 1.0)
        return g + tl.zeros([x.shape[0]], dtype=tl.float32)
    elif FMT == 1:                # nvfp4:row: amax of the row's finite elements / 2688
        xa = tl.abs(x)
        amax = tl.max(tl.where(xa < float("inf"), xa, 0.0), axis=1)
        return tl.where(amax > 0, tl.math.div_rn(amax, 2688.0), 1.0)
    else:
        return tl.full([x.shape[0]], 1.0, dtype=tl.float32)


@triton.jit
def _fake_quant_kernel(
    x_ptr, out_ptr, amax_ptr, sc_ptr, gs_ptr, bits_ptr, valid_ptr,
    n_rows, K, stride_x, stride_out, stride_sc, stride_gs, stride_bits, rows_per_valid,
    FMT: tl.constexpr, GUIDED: tl.constexpr, HAS_VALID: tl.constexpr, OUT_BF16: tl.constexpr,
    NATIVE_BF16: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr, G: tl.constexpr,
):
    """Rows [BLOCK_M, K <= BLOCK_K] of x -> out. GUIDED: `bits_ptr` holds each block's G mantissa bits as
    one G-bit word (the record's bytes viewed as int16 / int32), `sc_ptr` the block scale codes."""
    NB: tl.constexpr = BLOCK_K // G
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    r64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    mask = row_mask[:, None] & (cols < K)[None, :]
    x = tl.load(x_ptr + r64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    blocks = tl.reshape(x, [BLOCK_M, NB, G])

    if GUIDED:
        bcols = tl.arange(0, NB)
        bmask = row_mask[:, None] & (bcols < K // G)[None, :]
        sc = tl.load(sc_ptr + r64[:, None] * stride_sc + bcols[None, :], mask=bmask, other=0).to(tl.int32)
        if FMT == 1:
            gs = tl.load(gs_ptr + r64 * stride_gs, mask=row_mask, other=1.0)
        else:
            gs = tl.full([BLOCK_M], 1.0, dtype=tl.float32)
        word = tl.load(bits_ptr + r64[:, None] * stride_bits + bcols[None, :], mask=bmask, other=0).to(tl.int32)
        bit = (word[:, :, None] >> tl.arange(0, G)[None, None, :]) & 1
        value = _guided(blocks, bit, sc, gs, FMT)
        if HAS_VALID:   # rows the rollout did not record round to nearest (only programs that hold one pay)
            ok = tl.load(valid_ptr + rows // rows_per_valid, mask=row_mask, other=1) != 0
            if tl.min(ok.to(tl.int32), axis=0) == 0:
                value = tl.where(ok[:, None, None], value, _nearest(blocks, _row_scale(x, amax_ptr, FMT), FMT))
    else:
        value = _nearest(blocks, _row_scale(x, amax_ptr, FMT), FMT)

    value = tl.reshape(value, [BLOCK_M, BLOCK_K])
    dst = out_ptr + r64[:, None] * stride_out + cols[None, :]
    if OUT_BF16:
        if NATIVE_BF16:   # cvt.rn.bf16.f32: round to nearest even, as torch
            tl.store(dst, value.to(tl.bfloat16).to(tl.int16, bitcast=True), mask=mask)
        else:
            tl.store(dst, _bf16_bits(value), mask=mask)
    else:
        tl.store(dst, value, mask=mask)


def _interpreting() -> bool:
    from trace_rl.kernels import interpreting

    return interpreting()


def tiles(n_rows: int, K: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_K, num_warps). Whole rows in one tile (a row's amax and values from one load);
    ~4K elements per program, 16 per thread. The interpreter costs milliseconds per program: few, big."""
    block_k = triton.next_power_of_2(K)
    if _interpreting():
        return max(1, min(64, triton.next_power_of_2(n_rows), 16384 // block_k)), block_k, 4
    block_m = max(1, min(64, 4096 // block_k))
    return block_m, block_k, max(4, min(16, block_m * block_k // 512))


def _rows(t: torch.Tensor, width: int) -> torch.Tensor:
    t2 = t.reshape(-1, width)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def supports(x: torch.Tensor, fmt_name: str, record=None) -> str:
    """'' when `fake_quantize` has a kernel for this call, else why not (the caller runs the reference)."""
    name = get_format(fmt_name).name
    if name not in FORMAT_IDS:
        return f"no fake-quantize kernel for {name!r} (kernels: {', '.join(FORMAT_IDS)})"
    if record is not None and FORMAT_IDS[name] not in GUIDED_IDS:
        return f"guided rounding is defined for nvfp4:row and mxfp4, not {name!r}"
    if x.dtype not in OUT_DTYPES:
        return f"fake-quantize kernels write float32 or bfloat16, not {x.dtype}"
    if x.dim() == 0 or (name.endswith("block") and x.dim() < 1):
        return "0-d tensor"
    return ""


def amax_bits(x2: torch.Tensor) -> torch.Tensor:
    """int32 [1]: float32 bits of max |x| over the finite elements of x2 [rows, K] (0 when empty)."""
    out = torch.zeros(1, device=x2.device, dtype=torch.int32)
    n_rows, K = x2.shape
    if n_rows and K:
        block_k = min(1024, triton.next_power_of_2(K))
        block_m = max(1, 4096 // block_k) if not _interpreting() else max(1, min(64, triton.next_power_of_2(n_rows)))
        _amax_bits_kernel[(triton.cdiv(n_rows, block_m),)](x2, out, n_rows, K, x2.stride(0), BLOCK_M=block_m,
                                                            BLOCK_K=block_k, num_warps=4)
    return out


def fake_quantize(x: torch.Tensor, fmt_name: str, record=None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] quantize-dequantized per row in `fmt_name`, in x's dtype (float32 or bfloat16), bit-exact
    with the reference; with a `correction.guided.GuidanceRecord`, TRACE's guided rounding."""
    why = supports(x, fmt_name, record)
    if why:
        raise ValueError(f"fake_quantize kernel: {why}; use get_format(...).fake_quantize / guided_quantize")
    name = get_format(fmt_name).name
    fmt = FORMAT_IDS[name]
    K = x.shape[-1]
    G = GROUP.get(fmt)
    if G is not None:
        check_block_divisible(x, G, name)
    x2 = _rows(x, K)
    n_rows = x2.shape[0]
    out = torch.empty_like(x2, memory_format=torch.contiguous_format) if out is None else out.view(-1, K)
    if n_rows == 0 or K == 0:
        return out.view(x.shape)
    block_m, block_k, warps = tiles(n_rows, K)
    G = G or block_k
    amax = amax_bits(x2) if fmt in (FMT_NVFP4, FMT_FP8_TENSOR) else out
    sc = gs = bits = valid = out
    stride_sc = stride_gs = stride_bits = rows_per_valid = 0
    if record is not None:
        sc = _rows(record.scales, K // G)
        bits = _rows(record.bits, K // 8).view(torch.int16 if G == 16 else torch.int32)   # G bits per block
        if sc.shape[0] != n_rows or bits.shape[0] != n_rows:
            raise ValueError(f"guidance record covers {sc.shape[0]} rows of {K}, activation has {n_rows}: "
                             f"the record must come from the same tokens and layer")
        stride_sc, stride_bits = sc.stride(0), bits.stride(0)
        if fmt == FMT_NVFP4_ROW:
            gs = _rows(record.global_scale.float(), 1)
            stride_gs = gs.stride(0)
        if record.valid is not None:
            valid = record.valid.reshape(-1)
            if n_rows % max(valid.numel(), 1):
                raise ValueError(f"guidance valid mask has {valid.numel()} entries for {n_rows} rows")
            rows_per_valid = n_rows // valid.numel()
            valid = valid.view(torch.uint8) if valid.dtype == torch.bool else valid.to(torch.uint8)
    out_bf16 = x.dtype == torch.bfloat16
    _fake_quant_kernel[(triton.cdiv(n_rows, block_m),)](
        x2, out.view(torch.int16) if out_bf16 else out, amax, sc, gs, bits, valid,
        n_rows, K, x2.stride(0), out.stride(0), stride_sc, stride_gs, stride_bits, rows_per_valid,
        FMT=fmt, GUIDED=record is not None, HAS_VALID=record is not None and record.valid is not None,
        OUT_BF16=out_bf16, NATIVE_BF16=not _interpreting(), BLOCK_M=block_m, BLOCK_K=block_k, G=G, num_warps=warps)
    return out.view(x.shape)
