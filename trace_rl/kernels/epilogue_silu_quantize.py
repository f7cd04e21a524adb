"""The stacked gate/up GEMM's FP4 epilogue fused into the down projection's SiLU x mul W4A4 quantize (issue 16).

At large decode batches the MLP's gate/up run as one cuBLAS GEMM on the stacked operand cache (operand_cache.py,
`stacked_matmul`): float32 accumulator y [M, 2K], then `fp4_dequant._epilogue_kernel` writes bf16 gate | up
(y x row factor[n] x row scale[m], one rounding), then the quantize kernel's SILU_MUL operand reads it back
(`row_quantize.quantize_dequant_bf16(silu_mul=True)`). Here the quantize reads y itself and applies the epilogue's
math per element before the SiLU: `y * rf[n]`, then `* row_scale[m]` (nvfp4:row activations; mxfp4 has none), each
a float32 multiply in that order, then the one round to bf16 (round to nearest even, `.to(tl.bfloat16)`), exactly
`fp4_gemm._epilogue_store`'s operations (two multiplies: nothing a compiler could contract). The result is the same
bf16 gate and up values, so the same SiLU x mul (`swiglu.silu_mul_f32`) and the same codes, scales and row scales
bit for bit; one launch and the bf16 [M, 2K] intermediate (a write and a read) disappear.

No bias: the stacked operand cache never holds a part with one (`engine.operand_cache.stack_groups`); a bias would
add `+ bias[n]` after the products, which a fused-multiply-add contraction could round differently, so
`epilogue_silu_mul_quantize` refuses it rather than risk other bits. Output bf16 only (the epilogue's out_dtype of
a bf16 model); rows up to 16384 wide (the block-tile kernel's one row in registers, `fuses`).

The kernel is `fp4_block_tiles._quantize_dequant_rows_kernel`'s body (the one helper both call,
`_quantize_dequant_row_chunks`) with this file's loader (`_load_epilogue`): the same chunks, block stats, rounding
and stores. Torch reference: `epilogue_silu_mul_quantize_reference`, the
composition of the three references (the epilogue in torch, `swiglu.silu_mul_reference`,
`rmsnorm_quantize.quantize_dequant_reference`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from trace_rl.formats import get_format
from trace_rl.kernels.fp4_block_tiles import _dequant_tiles, _quantize_dequant_row_chunks
from trace_rl.kernels.swiglu import silu_launch_args, silu_mul_f32

W4A4_ROW_FORMATS = {"nvfp4:row": 16, "mxfp4": 32}


@triton.jit
def _load_epilogue(src, row0, n_rows, k0, K, ROWS: tl.constexpr, NB: tl.constexpr, G: tl.constexpr):
    """Columns k0 .. k0 + NB*G of the SiLU x mul operand as a [ROWS * NB, G] float32 block tile
    (`fp4_block_tiles._quantize_dequant_row_chunks`' loader; src = (y_ptr, rf_ptr, rs_ptr, stride_y, HAS_ROW_SCALE,
    SILU_EXACT, SILU_INTERP)), from the float32 accumulator y [rows, 2K]: gate = bf16(y[:, c] * rf[c] * rs),
    up = bf16(y[:, K + c] * rf[K + c] * rs) (the epilogue's operations in its order), then `silu_mul_f32` as the
    SILU_MUL loader does."""
    y_ptr, rf_ptr, rs_ptr, stride_y, HAS_ROW_SCALE, SILU_EXACT, SILU_INTERP = src
    i = tl.arange(0, ROWS * NB)
    rows = row0 + i // NB
    cols = (k0 + (i % NB) * G)[:, None] + tl.arange(0, G)[None, :]
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols < K)
    ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_y + cols
    g = tl.load(ptrs, mask=mask, other=0.0) * tl.load(rf_ptr + cols, mask=mask, other=1.0)
    u = tl.load(ptrs + K, mask=mask, other=0.0) * tl.load(rf_ptr + K + cols, mask=mask, other=1.0)
    if HAS_ROW_SCALE:
        rs = tl.load(rs_ptr + rows, mask=row_ok, other=1.0)[:, None]
        g = g * rs
        u = u * rs
    return silu_mul_f32(g.to(tl.bfloat16), u.to(tl.bfloat16), SILU_EXACT, SILU_INTERP)


@triton.jit
def _epilogue_silu_quantize_kernel(y_ptr, rf_ptr, rs_ptr, out_ptr, gscale_ptr, n_rows, K, stride_y, stride_out,
                                   MX: tl.constexpr, ROWS: tl.constexpr, NB: tl.constexpr, NCH: tl.constexpr,
                                   HAS_ROW_SCALE: tl.constexpr, SILU_EXACT: tl.constexpr = False,
                                   SILU_INTERP: tl.constexpr = False):
    """`_quantize_dequant_rows_kernel(SILU_MUL=True)` on the epilogue of y (module doc): the same
    `_quantize_dequant_row_chunks` (ROWS rows per program, a row as NCH (1..4) chunks of NB blocks of G; row amax,
    block scales, code value x block step in bf16 to out, the nvfp4:row global scale to gscale_ptr) with this
    file's loader."""
    _quantize_dequant_row_chunks(_load_epilogue, (y_ptr, rf_ptr, rs_ptr, stride_y, HAS_ROW_SCALE, SILU_EXACT,
                                                  SILU_INTERP),
                                 out_ptr, gscale_ptr, tl.program_id(0) * ROWS, n_rows, K, stride_out, MX, ROWS, NB,
                                 NCH)


def fuses(k: int, fmt_name: str) -> bool:
    """Whether a down projection of input width k (gate | up of 2k) in `fmt_name` (per token) fits the kernel:
    whole blocks and a row in registers (the block-tile kernel's tiles, up to 16384)."""
    block = W4A4_ROW_FORMATS.get(get_format(fmt_name).name)
    return block is not None and k > 0 and k % block == 0 and _dequant_tiles(1, k, block, True) is not None


def _check(y: torch.Tensor, rf: torch.Tensor, row_scale: torch.Tensor | None, fmt_name: str) -> str:
    name = get_format(fmt_name).name
    if name not in W4A4_ROW_FORMATS:
        raise ValueError(f"epilogue_silu_mul_quantize: W4A4 activations are quantized per token to "
                         f"{' or '.join(W4A4_ROW_FORMATS)}, not {fmt_name!r} (pass per_token(act_fmt))")
    if y.dim() != 2 or y.dtype != torch.float32 or y.shape[1] % 2 or y.stride(1) != 1:
        raise ValueError(f"epilogue_silu_mul_quantize: y must be the GEMM's float32 [M, 2K] accumulator with unit "
                         f"column stride, got {y.dtype} {tuple(y.shape)} strides {y.stride()}")
    k = y.shape[1] // 2
    if rf.dtype != torch.float32 or rf.dim() != 1 or rf.shape[0] < 2 * k:
        raise ValueError(f"epilogue_silu_mul_quantize: rf must be float32 [>= {2 * k}] (the stack's row factors), "
                         f"got {rf.dtype} {tuple(rf.shape)}")
    if row_scale is not None and (row_scale.dtype != torch.float32 or row_scale.shape != (y.shape[0],)):
        raise ValueError(f"epilogue_silu_mul_quantize: row_scale must be float32 [{y.shape[0]}], got "
                         f"{row_scale.dtype} {tuple(row_scale.shape)}")
    if not fuses(k, name):
        raise ValueError(f"epilogue_silu_mul_quantize: rows of {k} are not whole {name} blocks or exceed the "
                         f"one-row tile (16384); run factor_matmul's epilogue then quantize_dequant_bf16")
    return name


def epilogue_silu_mul_quantize(y: torch.Tensor, rf: torch.Tensor, row_scale: torch.Tensor | None,
                               fmt_name: str, maxnreg: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(bf16 [M, K] code value x block step, float32 [M] row global scale or None (mxfp4)) = `quantize_dequant_bf16(
    epilogue(y, rf, row_scale), fmt_name, silu_mul=True)` in one launch, the same bits (module doc); epilogue =
    `fp4_dequant.factor_matmul`'s after its GEMM, bf16 out, no bias. `maxnreg` (benchmarks only): a register cap
    for the launch (the same instructions, maybe spilled: the same bits; `sass_gate_cases` says why)."""
    name = _check(y, rf, row_scale, fmt_name)
    m, k = y.shape[0], y.shape[1] // 2
    out = torch.empty(m, k, device=y.device, dtype=torch.bfloat16)
    gscale = torch.empty(m, device=y.device, dtype=torch.float32) if name == "nvfp4:row" else None
    if m:
        rows, nb, nch, warps = _dequant_tiles(m, k, W4A4_ROW_FORMATS[name], True)
        _epilogue_silu_quantize_kernel[(triton.cdiv(m, rows),)](
            y, rf, row_scale if row_scale is not None else rf, out, gscale if gscale is not None else rf, m, k,
            y.stride(0), out.stride(0), MX=name == "mxfp4", ROWS=rows, NB=nb, NCH=nch,
            HAS_ROW_SCALE=row_scale is not None, num_warps=warps, **silu_launch_args(),
            **({} if maxnreg is None else {"maxnreg": maxnreg}))
    return out, gscale


def epilogue_reference(y: torch.Tensor, rf: torch.Tensor, row_scale: torch.Tensor | None) -> torch.Tensor:
    """The FP4 epilogue in torch (`factor_matmul`'s CPU branch, no bias): bf16(y x rf[n] x row_scale[m])."""
    out = y * rf[:y.shape[1]]
    if row_scale is not None:
        out = out * row_scale.float()[:, None]
    return out.to(torch.bfloat16)


def epilogue_silu_mul_quantize_reference(y: torch.Tensor, rf: torch.Tensor, row_scale: torch.Tensor | None,
                                         fmt_name: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The torch spec: `epilogue_reference`, `swiglu.silu_mul_reference`, `rmsnorm_quantize.quantize_dequant_reference`
    (torch's SiLU: on the GPU the kernel's exact SiLU gives its bits; the CPU's exp may differ in the last bit)."""
    from trace_rl.kernels.rmsnorm_quantize import quantize_dequant_reference
    from trace_rl.kernels.swiglu import silu_mul_reference

    name = _check(y, rf, row_scale, fmt_name)
    return quantize_dequant_reference(silu_mul_reference(epilogue_reference(y, rf, row_scale)), name)


def sass_gate_cases():
    """The sm_90 compile gate (sass_gate.py): the launch at Qwen3-8B's down-projection input (K = 12288, the tile
    `_dequant_tiles(.., silu_mul=True)` picks), exact SiLU, nvfp4:row (row scale) and mxfp4. Loop-free: the whole
    kernel counts (up to the last EXIT). Budgets ~10% over Triton 3.6's count (CPU compile, 2026-12-02): nvfp4:row
    2309 SASS / 24 elements = 96.2 per element, 91 registers (the separate SILU_MUL quantize at this tile: 87.2, 64
    registers: the epilogue adds the row-factor loads and multiplies), mxfp4 1453 / 24 = 60.5, 76 registers; no
    spills. 91 registers x 16 warps fit one program per SM where 64 fit two; `maxnreg=64` (benchmarks only) spills
    32 bytes; which is faster is the `mlpfuse` check's to say."""
    from trace_rl.kernels.sass_gate import GateCase

    sig = dict(y_ptr="*fp32", rf_ptr="*fp32", rs_ptr="*fp32", out_ptr="*bf16", gscale_ptr="*fp32", n_rows="i32",
               K="i32", stride_y="i32", stride_out="i32")
    cases = []
    for name, mx, budget in (("nvfp4:row", False, 106.0), ("mxfp4", True, 67.0)):
        k = 12288
        rows, nb, nch, warps = _dequant_tiles(4096, k, 32 if mx else 16, True)
        cases.append(GateCase(f"epilogue_silu_quantize {name} K{k}", _epilogue_silu_quantize_kernel, sig,
                              dict(MX=mx, ROWS=rows, NB=nb, NCH=nch, HAS_ROW_SCALE=not mx, SILU_EXACT=True,
                                   SILU_INTERP=False), warps, 1, rows * k / (32 * warps), budget,
                              divisible=("y_ptr", "rf_ptr", "rs_ptr", "out_ptr", "gscale_ptr", "K", "stride_y",
                                         "stride_out"),
                              register_a=False, forbid=(), whole_kernel=True, options=(("enable_fp_fusion", True),)))
    return cases


__all__ = ["epilogue_reference", "epilogue_silu_mul_quantize", "epilogue_silu_mul_quantize_reference", "fuses"]
