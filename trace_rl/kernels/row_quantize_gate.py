"""The sm_90 compile gate's cases (trace_rl/kernels/sass_gate.py) for the row quantizer (row_quantize.py and
its block-tile W4A4 kernel, fp4_block_tiles.py; kept apart so those files stay under ~500 lines): the tiles
`_dequant_tiles` and `_tiles` pick for the Qwen3-30B-A3B shapes (hidden 2048; SiLU x mul of the 768-wide
experts). Both kernels are loop-free at these widths (a whole row is one tile), so the whole kernel counts, per
element a thread quantizes.

Budgets: what Triton 3.6 compiles them to today (SASS instructions up to the last EXIT, so the out-of-line
slow path of the IEEE divisions is not counted; CPU compile, 2026-12-01) plus ~10%:
    quantize_dequant nvfp4:row K2048      889 instr / 16 elem = 55.6  -> budget 61
    quantize_dequant nvfp4:row silu K768 1718 instr / 24 elem = 71.6  -> budget 79 (the fast SiLU form)
    quantize_dequant nvfp4:row silu exact K768   2039 / 24 = 85.0     -> budget 94 (swiglu.EXACT_SILU, shipped:
        torch's exp and IEEE division, +14 per element; 2026-12-02)
    quantize_dequant nvfp4:row silu exact K12288 2092 / 24 = 87.2     -> budget 96 (the Qwen3-8B down projection's
        input, issue 16; 16 warps, 64 registers: fp4_block_tiles.SILU_MUL_MAX_WARPS; at 8 warps 82.4 per element
        but 122 registers, and Triton 3.9 spills)
    quantize_dequant mxfp4 K2048          415 instr / 16 elem = 25.9  -> budget 29
    (PDL variants, `pdl_wait`, 2026-12-03: +1 instruction (ACQBULK, griddepcontrol.wait) over launch_dependents'
    PREEXIT, +2 where the kernel had neither: nvfp4:row K4096 897 / 16 = 56.1, mxfp4 K4096 417 / 16 = 26.1,
    nvfp4:row K12288 53.5, mxfp4 K12288 24.7, nvfp4:row silu exact K12288 2094 / 24 = 87.25; the same budgets)
    quantize_rows nvfp4:row K2048        1087 instr / 16 elem = 67.9  -> budget 75
    quantize_rows fp8_e4m3:row K2048      697 instr / 16 elem = 43.6  -> budget 48
    quantize_weight nvfp4 (4096 / program)       52.1 per elem      -> budget 57 (Triton 3.9, 2026-12-02)
    quantize_weight mxfp4 (4096 / program)       26.2 per elem      -> budget 29
    (Triton 3.6, 2026-12-02, wsync2: the block amax / NaN flag as one integer max, e2m1_code without the IMAD.HI
    moves, the zero block step without a select: quantize_weight nvfp4 52.5 -> 50.7 (both division paths),
    mxfp4 24.9 -> 18.8 -> budget 21)
    quantize_relayout nvfp4 (16 x 256 tile, fast-division path)  33.7 per elem -> budget 37
        (the first version's K loop: 66.2, both paths; this one with both paths: 52.2)
    quantize_relayout mxfp4 (16 x 256 tile)      22.3 per elem      -> budget 25
    weight_amax (16384 / program, bf16)           7.3 per elem      -> budget 8 (memory-bound: ~1.5 ms of issue
        for the 8B weights against ~3.3 ms of reading them)
    weights_amax (T tensors in one launch)        7.7 per elem      -> budget 9 (the tensor search: +27 per program)
"""

from __future__ import annotations

from trace_rl.kernels.fp4_block_tiles import _dequant_tiles, _quantize_dequant_rows_kernel
from trace_rl.kernels.row_quantize import FMT_FP8_ROW, FMT_NVFP4_ROW, _quantize_rows_kernel, _tiles

ROWS = 4096        # tokens in the batch; the tiles do not depend on it past a few rows


def sass_gate_cases():
    from trace_rl.kernels.sass_gate import GateCase

    cases = []
    sig = dict(x_ptr="*bf16", out_ptr="*bf16", gscale_ptr="*fp32", n_rows="i32", K="i32", stride_x="i32",
               stride_out="i32")
    for name, mx, K, silu, exact, budget in (("nvfp4:row K2048", False, 2048, False, False, 61.0),
                                             ("nvfp4:row silu K768", False, 768, True, False, 79.0),
                                             ("nvfp4:row silu exact K768", False, 768, True, True, 94.0),
                                             ("nvfp4:row silu exact K12288", False, 12288, True, True, 96.0),
                                             ("mxfp4 K2048", True, 2048, False, False, 29.0)):
        rows, nb, nch, warps = _dequant_tiles(ROWS, K, 32 if mx else 16, silu)
        cases.append(GateCase(f"quantize_dequant {name}", _quantize_dequant_rows_kernel, sig,
                              dict(MX=mx, ROWS=rows, NB=nb, NCH=nch, SILU_MUL=silu, SILU_EXACT=exact,
                                   SILU_INTERP=False), warps, 1,
                              rows * K / (32 * warps), budget,
                              divisible=("x_ptr", "out_ptr", "gscale_ptr", "K", "stride_x", "stride_out"),
                              register_a=False, forbid=(), whole_kernel=True,
                              options=(("enable_fp_fusion", True),) if silu else ()))
    # the small-M W4A4 linear's quantize launch before the Gluon GEMM (kernels.linear): griddepcontrol
    # .launch_dependents (PREEXIT) first, at the K = 4096 (one row per program)
    for name, mx, budget in (("nvfp4:row K4096 launch_dependents", False, 61.0),
                             ("mxfp4 K4096 launch_dependents", True, 29.0)):
        rows, nb, nch, warps = _dequant_tiles(16, 4096, 32 if mx else 16)
        cases.append(GateCase(f"quantize_dequant {name}", _quantize_dequant_rows_kernel, sig,
                              dict(MX=mx, ROWS=rows, NB=nb, NCH=nch, SILU_MUL=False, SILU_EXACT=False,
                                   SILU_INTERP=False, LAUNCH_DEPENDENTS=True), warps,
                              1, rows * 4096 / (32 * warps), budget,
                              divisible=("x_ptr", "out_ptr", "gscale_ptr", "K", "stride_x", "stride_out"),
                              register_a=False, forbid=(), whole_kernel=True, require=("PREEXIT", )))
    # the same launched with PDL inside a CUDA-graph capture (kernels.linear.w4a4_quantize_pdl): launch_dependents,
    # then griddepcontrol.wait (ACQBULK) before the first global load or store; o_proj's K = 4096, the down
    # projection's 12288 (SiLU x mul fused: FP4Backend.quantize_silu_mul_input), and the general kernel's bf16 rows
    # past 16384 (fp4_linear's quantize there)
    for name, mx, K, silu, budget in (("nvfp4:row K4096 pdl_wait", False, 4096, False, 61.0),
                                      ("mxfp4 K4096 pdl_wait", True, 4096, False, 29.0),
                                      ("nvfp4:row K12288 pdl_wait", False, 12288, False, 61.0),
                                      ("mxfp4 K12288 pdl_wait", True, 12288, False, 29.0),
                                      ("nvfp4:row silu exact K12288 pdl_wait", False, 12288, True, 96.0)):
        rows, nb, nch, warps = _dequant_tiles(16, K, 32 if mx else 16, silu)
        cases.append(GateCase(f"quantize_dequant {name}", _quantize_dequant_rows_kernel, sig,
                              dict(MX=mx, ROWS=rows, NB=nb, NCH=nch, SILU_MUL=silu, SILU_EXACT=silu,
                                   SILU_INTERP=False, PDL_WAIT=True), warps,
                              1, rows * K / (32 * warps), budget,
                              divisible=("x_ptr", "out_ptr", "gscale_ptr", "K", "stride_x", "stride_out"),
                              register_a=False, forbid=(), whole_kernel=True, require=("PREEXIT", "ACQBULK"),
                              first_before=("ACQBULK", ),
                              options=(("enable_fp_fusion", True),) if silu else ()))
    # `quantize` (codes and scales out): nvfp4:row and fp8 rows, K = 2048
    # (and the general kernel's PDL variant, which fp4_linear launches for bf16 rows past 16384: the same wait rule)
    for name, fmt, budget, pdl in (("nvfp4:row K2048", FMT_NVFP4_ROW, 75.0, False),
                                   ("fp8_e4m3:row K2048", FMT_FP8_ROW, 48.0, False),
                                   ("nvfp4:row K2048 pdl_wait", FMT_NVFP4_ROW, 75.0, True)):
        K = 2048
        block_m, block_k, warps = _tiles(ROWS, K, 16)
        sig = dict(x_ptr="*bf16", codes_ptr="*u8", scales_ptr="*fp32" if fmt == FMT_FP8_ROW else "*u8",
                   gscale_ptr="*fp32" if fmt == FMT_NVFP4_ROW else "*u8", dest_ptr="*u8", n_rows="i32", K="i32",
                   stride_x="i32", stride_codes="i32", stride_scales="i32", heads="i32")
        cases.append(GateCase(f"quantize_rows {name}", _quantize_rows_kernel, sig,
                              dict(FMT=fmt, HAS_DEST=False, EMIT_BF16=False, BLOCK_M=block_m, BLOCK_K=block_k,
                                   SINGLE=K <= block_k, SILU_MUL=False, FAST_DIV=False, SILU_EXACT=False,
                                   SILU_INTERP=False, PDL_WAIT=pdl), warps, 1,
                              block_m * K / (32 * warps), budget,
                              divisible=("x_ptr", "codes_ptr", "scales_ptr", "K", "stride_x", "stride_codes",
                                         "stride_scales"),
                              register_a=False, forbid=(), whole_kernel=True,
                              require=("PREEXIT", "ACQBULK") if pdl else (), first_before=("ACQBULK", ) if pdl else ()))
    # the weight sync's block-tile quantizer (`quantize(w, fmt, fast=True)`); nvfp4 counts both division paths
    from trace_rl.kernels.weight_quantize import _blocks_per_program, _quantize_weight_kernel

    for name, mx, budget in (("nvfp4", False, 57.0), ("mxfp4", True, 21.0)):
        G = 32 if mx else 16
        nb, warps = _blocks_per_program(1 << 20, G)
        sig = dict(x_ptr="*bf16", codes_ptr="*u8", scales_ptr="*u8", gscale_ptr="*fp32", amax_ptr="*i32",
                   n_blocks="i32")
        cases.append(GateCase(f"quantize_weight {name}", _quantize_weight_kernel, sig, dict(MX=mx, NB=nb), warps, 1,
                              nb * G / (32 * warps), budget, divisible=("x_ptr", "codes_ptr", "scales_ptr"),
                              register_a=False, forbid=(), whole_kernel=True))
    # the weight sync's quantize with the Hopper re-layout fused into its store (quantize_relayout.py): loop-free,
    # per element a thread quantizes (32); nvfp4 on its fast-division path (FAST_ONLY: the div_rn fallback,
    # taken for weights of amax < 2**-58 or > 2**99, compiles out), and the flat weight amax before it
    from trace_rl.kernels.quantize_relayout import KC, _quantize_relayout_kernel
    from trace_rl.kernels.weight_quantize import AMAX_BLOCK, _weight_amax_kernel

    sig = dict(x_ptr="*bf16", codes_ptr="*i32", scales_ptr="*u8", gscale_ptr="*fp32", amax_ptr="*i32",
               values_ptr="*i32", out_scales_ptr="*u8", rf_ptr="*fp32", N="i32", K="i32", KP="i32", stride_v="i32",
               stride_os="i32")
    for name, mx, budget in (("nvfp4", False, 37.0), ("mxfp4", True, 25.0)):
        cases.append(GateCase(f"quantize_relayout {name}", _quantize_relayout_kernel, sig,
                              dict(MX=mx, KC=KC, FAST_ONLY=True), 2 * KC, 1, 32, budget,
                              divisible=("x_ptr", "codes_ptr", "scales_ptr", "values_ptr", "out_scales_ptr", "K", "KP",
                                         "stride_v", "stride_os"), register_a=False, forbid=(), whole_kernel=True))
    cases.append(GateCase("weight_amax", _weight_amax_kernel, dict(x_ptr="*bf16", amax_bits_ptr="*i32", n="i32"),
                          dict(BLOCK=AMAX_BLOCK), 8, 1, AMAX_BLOCK / 256, 8.0, divisible=("x_ptr", "n"),
                          register_a=False, forbid=(), whole_kernel=True))
    from trace_rl.kernels.weight_quantize import _weights_amax_kernel

    cases.append(GateCase("weights_amax (252 tensors)", _weights_amax_kernel,
                          dict(x_ptr="*bf16", offs_ptr="*i64", numel_ptr="*i64", starts_ptr="*i32",
                               amax_bits_ptr="*i32", T="i32"), dict(BLOCK=AMAX_BLOCK, TP=256), 8, 1, AMAX_BLOCK / 256,
                          9.0, divisible=("x_ptr", "offs_ptr", "numel_ptr", "starts_ptr"), register_a=False, forbid=(),
                          whole_kernel=True))
    return cases
