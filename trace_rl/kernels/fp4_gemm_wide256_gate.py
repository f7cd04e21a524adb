"""Compile-gate cases (sass_gate.py) of the 256-token Gluon FP4 GEMM (fp4_gemm_wide256.py), Triton 3.6 only.

What the gate holds it to: the decoded tile stays in registers (register-A HGMMA, no STS/LDSM in the loop), no spills,
at most one full wgmma wait per step (overlap: none but the loop's one), no write of an in-flight HGMMA's A
registers (`a_in_flight`: the overlap loop's first version did that, nan / inf on the H200), the warp-specialised
structure (setmaxnreg, mbarrier waits, TMA), and SASS per weight element of the consumer's 128-column step within
budget (overlap: the loop holds a pair of steps)."""

from __future__ import annotations

import triton

from trace_rl.kernels.fp4_gemm_wide256 import (
    BK,
    SCALE_BOX_WORDS,
    VARIANTS,
    WIDE64_2CTA,
    Wide256Config,
    _fp4_gemm_wide256_kernel,
    shared_layouts,
)
from trace_rl.kernels.hopper_fp4 import COLS, ROWS

# (config, token tile, SASS budget per weight element): filled from the measured values (+ ~3%). Selecting the step's
# scale words out of the 16-byte aligned scale box (fp4_gemm_wide256.scale_box: an unaligned TMA coordinate is an
# illegal instruction) costs 5-8 instructions per step (nvfp4 2 LDS + 2 SEL, mxfp4 4 LDS + 3 SEL per scale word,
# and the step's position): measured 3.06-3.28 nvfp4, 3.11 mxfp4 (3.00 / 2.92 before, with the unaligned box).
GATE = tuple((c, 256, 3.35) for c in VARIANTS.values()) + ((VARIANTS["w256"], 128, 3.3),
                                                          (VARIANTS["w256"], 64, 3.2), (WIDE64_2CTA, 64, 3.15))
GATE_MX = ((VARIANTS["w256"], 256, 3.2), )


def gate_case(c: Wide256Config, block_m: int, budget: float, fmt: str = "nvfp4"):
    from trace_rl.kernels.sass_gate import GateCase

    wl, sl, xl = shared_layouts(block_m)
    sig = dict(w_desc=f"tensordesc<i32[{BK // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
               s_desc=f"tensordesc<i32[{c.block_n}, {SCALE_BOX_WORDS}],{sl!r}>",
               x_desc=f"tensordesc<bf16[{block_m}, {BK}],{xl!r}>", rf_ptr="*fp32", out_ptr="*bf16",
               part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32", KB="i32", SPLIT_K="i32", stride_om="i32")
    consts = dict(BN=c.block_n, BM=block_m, STAGES=c.slots(block_m), OVERLAP=c.overlap, MX=fmt == "mxfp4")
    return GateCase(f"gemm wide256 {fmt} {block_m}x{c.block_n}x{BK} s{c.slots(block_m)}"
                    f"{' overlap' if c.overlap else ''} r{c.maxnreg}", _fp4_gemm_wide256_kernel, sig, consts,
                    c.num_warps, 1,
                    _steps_per_iteration(c) * c.block_n * BK / (32 * c.num_warps), budget,
                    ("rf_ptr", "out_ptr", "part_ptr", "count_ptr", "stride_om"),
                    max_full_waits=1, options=(("maxnreg", c.maxnreg), ), a_in_flight=True,
                    require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE"))


def _steps_per_iteration(c: Wide256Config) -> int:
    """K steps per iteration of the main loop: overlap runs them in pairs (fp4_gemm_wide256._steps256)."""
    return 2 if c.overlap else 1


# the stream-K schedule (fp4_gemm_wide256_sk.py): (config, token tile, budget, format)
GATE_SK = ((VARIANTS["w256"], 256, 3.3, "nvfp4"), (VARIANTS["w256_nooverlap"], 256, 3.25, "nvfp4"),
           (VARIANTS["w256"], 128, 3.25, "nvfp4"), (VARIANTS["w256"], 64, 3.25, "nvfp4"),
           (VARIANTS["w256"], 256, 3.15, "mxfp4"),
           (WIDE64_2CTA, 64, 3.25, "nvfp4"), (WIDE64_2CTA, 64, 3.1, "mxfp4"))

# the register-side two-segment fix-up (fp4_gemm_wide256_sk2.py): the configs benchmarks/skfix.py times
# (measured 3.18 / 3.16 / 3.17 / 3.04 / 3.03 / 3.02: the loop is sk's, +~3%)
GATE_SK2 = ((VARIANTS["w256"], 256, 3.3, "nvfp4"), (VARIANTS["w256_nooverlap"], 256, 3.25, "nvfp4"),
            (VARIANTS["w256"], 128, 3.3, "nvfp4"), (VARIANTS["w256"], 256, 3.15, "mxfp4"),
            (VARIANTS["w256"], 128, 3.15, "mxfp4"), (VARIANTS["w256_nooverlap"], 256, 3.1, "mxfp4"))


def sass_gate_cases():
    if not triton.__version__.startswith("3.6"):
        return []
    return [gate_case(c, bm, b) for c, bm, b in GATE] + [gate_case(c, bm, b, "mxfp4") for c, bm, b in GATE_MX] + \
        [sk_gate_case(c, bm, b, f) for c, bm, b, f in GATE_SK] + \
        [sk_gate_case(c, bm, b, f, sk2=True) for c, bm, b, f in GATE_SK2]


def sk_gate_case(c: Wide256Config, block_m: int, budget: float, fmt: str = "nvfp4", maxseg: int = 3,
                 sk2: bool = False):
    """The stream-K schedule (fp4_gemm_wide256_sk.py; `sk2`: fp4_gemm_wide256_sk2.py's register-side fix-up): the
    same step, the tile loop around it (`innermost`)."""
    from trace_rl.kernels.fp4_gemm_wide256_sk import _fp4_gemm_wide256_sk_kernel
    from trace_rl.kernels.fp4_gemm_wide256_sk2 import _fp4_gemm_wide256_sk2_kernel
    from trace_rl.kernels.sass_gate import GateCase

    wl, sl, xl = shared_layouts(block_m)
    sig = dict(w_desc=f"tensordesc<i32[{BK // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
               s_desc=f"tensordesc<i32[{c.block_n}, {SCALE_BOX_WORDS}],{sl!r}>",
               x_desc=f"tensordesc<bf16[{block_m}, {BK}],{xl!r}>", rf_ptr="*fp32", out_ptr="*bf16",
               part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32", KB="i32", n_tiles="i32", TOTAL="i32",
               stride_om="i32", **({"MAXSEG": "i32"} if sk2 else {}))
    consts = dict(BN=c.block_n, BM=block_m, STAGES=c.slots(block_m), OVERLAP=c.overlap, MX=fmt == "mxfp4",
                  **({} if sk2 else {"MAXSEG": maxseg}))
    return GateCase(f"gemm wide256 {'sk2' if sk2 else 'sk'} {fmt} {block_m}x{c.block_n}x{BK} s{c.slots(block_m)}"
                    f"{' overlap' if c.overlap else ''} r{c.maxnreg}",
                    _fp4_gemm_wide256_sk2_kernel if sk2 else _fp4_gemm_wide256_sk_kernel, sig, consts,
                    c.num_warps, 1, _steps_per_iteration(c) * c.block_n * BK / (32 * c.num_warps), budget,
                    ("rf_ptr", "out_ptr", "part_ptr", "count_ptr", "stride_om"),
                    max_full_waits=1, options=(("maxnreg", c.maxnreg), ), innermost=True, a_in_flight=True,
                    require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE"))
