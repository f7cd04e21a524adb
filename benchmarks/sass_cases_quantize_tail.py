"""`benchmarks/sass_diff.py --cases` file: every constexpr configuration the code launches of the three kernels that
share the W4A4 block-tile quantizer's chunk loop and nvfp4:row global-scale tail (fp4_block_tiles.py):
`_quantize_dequant_rows_kernel` (row_quantize.launch_quantize_rows), `_epilogue_silu_quantize_kernel`
(epilogue_silu_quantize.py) and `_add_rms_norm_quantize_kernel` (rmsnorm_quantize.py), at the tiles their launchers
pick. `_dequant_tiles` gives NCH 1 or 3 for every width up to 16384 (NCH 2 / 4 never win its padding rule), so each
kernel is compiled at one NCH = 1 and one NCH = 3 width per format, with and without SiLU x mul, row scale, residual,
h store, launch_dependents as its launcher passes them. Budgets are not checked here (sass_gate does that)."""

from trace_rl.kernels.fp4_block_tiles import _dequant_tiles, _quantize_dequant_rows_kernel
from trace_rl.kernels.sass_gate import GateCase

FORMATS = (("nvfp4:row", False, 16), ("mxfp4", True, 32))
FUSION = (("enable_fp_fusion", True),)      # swiglu.silu_launch_args: every SiLU launch contracts


def _case(name, kernel, sig, constexprs, warps, divisible, options=()):
    return GateCase(name, kernel, sig, constexprs, warps, 1, 1.0, 1e9, divisible=divisible, register_a=False,
                    forbid=(), whole_kernel=True, options=options)


def _quantize_dequant_cases():
    sig = dict(x_ptr="*bf16", out_ptr="*bf16", gscale_ptr="*fp32", n_rows="i32", K="i32", stride_x="i32",
               stride_out="i32")
    div = ("x_ptr", "out_ptr", "gscale_ptr", "K", "stride_x", "stride_out")
    out = []
    for fmt, mx, g in FORMATS:
        for k in (2048, 768, 12288):                       # NCH 1 (one row / program), 3 (two rows), 3 (16 warps)
            for silu in (False, True):
                for dependents in ((False, True) if not silu else (False,)):
                    rows, nb, nch, warps = _dequant_tiles(4096, k, g, silu)
                    out.append(_case(f"quantize_dequant {fmt} K{k} nch{nch}{' silu' if silu else ''}"
                                     f"{' dependents' if dependents else ''}", _quantize_dequant_rows_kernel, sig,
                                     dict(MX=mx, ROWS=rows, NB=nb, NCH=nch, SILU_MUL=silu, SILU_EXACT=silu,
                                          SILU_INTERP=False, LAUNCH_DEPENDENTS=dependents), warps, div,
                                     FUSION if silu else ()))
    return out


def _epilogue_cases():
    from trace_rl.kernels.epilogue_silu_quantize import _epilogue_silu_quantize_kernel

    sig = dict(y_ptr="*fp32", rf_ptr="*fp32", rs_ptr="*fp32", out_ptr="*bf16", gscale_ptr="*fp32", n_rows="i32",
               K="i32", stride_y="i32", stride_out="i32")
    div = ("y_ptr", "rf_ptr", "rs_ptr", "out_ptr", "gscale_ptr", "K", "stride_y", "stride_out")
    out = []
    for fmt, mx, g in FORMATS:
        for k in (2048, 768, 12288):
            for row_scale in (True, False):
                rows, nb, nch, warps = _dequant_tiles(4096, k, g, True)
                out.append(_case(f"epilogue_silu_quantize {fmt} K{k} nch{nch} row_scale={row_scale}",
                                 _epilogue_silu_quantize_kernel, sig,
                                 dict(MX=mx, ROWS=rows, NB=nb, NCH=nch, HAS_ROW_SCALE=row_scale, SILU_EXACT=True,
                                      SILU_INTERP=False), warps, div, FUSION))
    return out


def _rmsnorm_quantize_cases():
    from trace_rl.kernels.rmsnorm import _tiles
    from trace_rl.kernels.rmsnorm_quantize import _add_rms_norm_quantize_kernel

    sig = dict(x_ptr="*bf16", r_ptr="*bf16", w_ptr="*bf16", h_ptr="*bf16", r_out_ptr="*bf16", q_ptr="*bf16",
               gscale_ptr="*fp32", n_rows="i32", N="i32", eps="fp32", stride_x="i32", stride_r="i32", stride_h="i32",
               stride_ro="i32", stride_q="i32")
    div = ("x_ptr", "r_ptr", "w_ptr", "h_ptr", "r_out_ptr", "q_ptr", "gscale_ptr", "N", "stride_x", "stride_r",
           "stride_h", "stride_ro", "stride_q")
    out = []
    for fmt, mx, _ in FORMATS:
        for n in (4096, 2048):                              # one row / program (4 warps), two rows
            for residual in (True, False):
                for store_h in (False, True):
                    block_m, block_n, warps = _tiles(4096, n)
                    out.append(_case(f"add_rms_norm_quantize {fmt} N{n} residual={residual} store_h={store_h}",
                                     _add_rms_norm_quantize_kernel, sig,
                                     dict(HAS_RESIDUAL=residual, STORE_H=store_h, MX=mx, BLOCK_M=block_m,
                                          BLOCK_N=block_n), warps, div))
    return out


def cases():
    return _quantize_dequant_cases() + _epilogue_cases() + _rmsnorm_quantize_cases()
