"""Compile-gate cases (trace_rl/kernels/sass_gate.py) of the Gluon FP4 GEMM (fp4_gemm_gluon.py): every config it ships
or a benchmark launches, compiled for sm_90 by Triton 3.6 on any machine (the Gluon API is experimental and
version-pinned: no cases under another Triton)."""

from __future__ import annotations

import dataclasses

import triton

from trace_rl.kernels.fp4_gemm_gluon import (
    SMALL_M,
    WIDE,
    WIDE_OVERLAP,
    GluonConfig,
    _fp4_gemm_ws_fin_kernel,
    _fp4_gemm_ws_kernel,
    _shared_layouts,
    scale_words,
)
from trace_rl.kernels.fp4_gemm_gluon_config import M16_CANDIDATES, M64_CANDIDATES, SMALL_GRID_CANDIDATES
from trace_rl.kernels.hopper_fp4 import COLS, ROWS

# Compile gate (sass_gate.py; Triton 3.6 only: the Gluon API is experimental and version-pinned). The consumer's K
# loop must keep the decoded tile in registers (register-A HGMMA, no STS/LDSM), spill nothing, and the kernel must
# hold the warp-specialised structure: setmaxnreg (the partitions' register split), mbarrier waits and TMA loads.
# Measured (Triton 3.6, sm_90, per weight element of the consumer's K step): 2.52 for one consumer warpgroup
# (LOP3 5, SHF 4, HMUL2 4 per 8 weights; scale pairs PRMT + LEA 0.5 per weight; 2 HGMMA 64x16x16 per 16 K), 2.55
# with overlap, 2.73 with two warpgroups (the step's fixed bookkeeping over half the weights). Budgets: + ~3%.
# With both chunks' words loaded at the top of the step, ptxas issues each of the first chunk's HGMMAs as soon as
# its k16 fragment is decoded and decodes the second chunk under them (its 16 HGMMAs then issue back to back).
# The register budgets are the benchmark's variants (benchmarks/gemm_gluon.py), each gated: below them ptxas keeps
# the kernel spill-free by serialising every wgmma (a full wait after each HGMMA: one warpgroup at maxnreg 48-64,
# or 80 with overlap; two warpgroups at 56), or spills.
GATE = ((GluonConfig(), 16, 2.6), (GluonConfig(), 8, 2.6), (GluonConfig(overlap=True), 16, 2.65),
        (GluonConfig(stages=2, maxnreg=72), 16, 2.6), (GluonConfig(stages=3, maxnreg=72), 8, 2.6),
        (GluonConfig(num_warps=8, maxnreg=80), 16, 2.85),
        (GluonConfig(num_warps=8, maxnreg=80, overlap=True), 16, 2.85),
        (GluonConfig(num_warps=8, maxnreg=80, overlap=True), 8, 2.85))
# mxfp4 (512-column steps: four chunks, loaded and decoded in pairs; one scale word per row and chunk)
GATE_MX = ((GluonConfig(stages=2), 16, 2.5), (GluonConfig(stages=2), 8, 2.5),
           (GluonConfig(num_warps=8, maxnreg=80, overlap=True, stages=2), 16, 2.8))
# Wide token tiles (WIDE; HGMMA 64xBMx16 with the register A operand): the decode per weight element does not depend
# on BM (2.70-2.77 nvfp4, 2.38-2.40 mxfp4, two warpgroups), so SASS per weight element x token falls as 1 / BM:
# 0.17 at BM = 16, 0.085 at 32, 0.043 at 64, 0.021 at 128. The register floors (the lowest spill-free budgets whose
# wgmmas are not serialised: 72 / 96 / 120 at BM = 32 / 64 / 128; 64 / 88 / 112 serialise all 16 HGMMAs) are gated
# beside WIDE's budgets, so a ptxas that needs more registers shows up here. overlap costs more (BM = 32 at 80
# serialises) and is not WIDE's choice; WIDE_OVERLAP (BM 64 / 128 at 128 / 168 registers: 2.79 / 2.77, one full
# wait per step at most) is gated for the benchmark.
GATE_WIDE = tuple((c, c.block_m, 2.8) for c in WIDE["nvfp4"].values()) + \
    ((GluonConfig(num_warps=8, maxnreg=72, block_m=32, stages=3), 32, 2.85),
     (GluonConfig(num_warps=8, maxnreg=96, block_m=64, stages=4), 64, 2.8),
     (GluonConfig(num_warps=8, maxnreg=120, block_m=128, stages=2), 128, 2.8))
GATE_WIDE += tuple((c, c.block_m, 2.85) for c in WIDE_OVERLAP.values())
GATE_WIDE_MX = tuple((c, c.block_m, 2.45) for c in WIDE["mxfp4"].values())


def gate_case(c: GluonConfig, block_m: int, budget: float, fmt: str = "nvfp4", split: int = 2, pdl: bool = False,
              row_scale: bool = False):
    """The case of config `c` at `block_m` tokens; a `fin` config at the constexpr `split`, `pdl` and `row_scale`
    (W4A4, with a bias) it compiles for."""
    from trace_rl.kernels.sass_gate import GateCase

    if c.fin:
        return _fin_gate_case(c, block_m, budget, fmt, split, pdl, row_scale)
    bk = c.bk(fmt)
    wl, sl, xl = _shared_layouts(block_m, bk)
    sig = dict(w_desc=f"tensordesc<i32[{bk // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
               s_desc=f"tensordesc<i32[{c.block_n}, {scale_words(fmt, bk)}],{sl!r}>",
               x_desc=f"tensordesc<bf16[{block_m}, {bk}],{xl!r}>", rf_ptr="*fp32", out_ptr="*bf16",
               part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32", KB="i32", SPLIT_K="i32", stride_om="i32")
    consts = dict(BN=c.block_n, BK=bk, BM=block_m, STAGES=c.stages, OVERLAP=c.overlap, MX=fmt == "mxfp4")
    return GateCase(f"gemm gluon ws {fmt} {block_m}x{c.block_n}x{bk} w{c.num_warps}s{c.stages}"
                    f"{' overlap' if c.overlap else ''} r{c.maxnreg}", _fp4_gemm_ws_kernel, sig, consts,
                    c.num_warps, 1, c.block_n * bk / (32 * c.num_warps), budget,
                    ("rf_ptr", "out_ptr", "part_ptr", "count_ptr", "stride_om"),
                    max_full_waits=1 if c.overlap else bk // COLS,
                    options=(("maxnreg", c.maxnreg), ),
                    require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE"))


def _fin_gate_case(c: GluonConfig, block_m: int, budget: float, fmt: str, split: int, pdl: bool, row_scale: bool):
    from trace_rl.kernels.sass_gate import GateCase

    bk = c.bk(fmt)
    wl, sl, xl = _shared_layouts(block_m, bk)
    sig = dict(w_desc=f"tensordesc<i32[{bk // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
               s_desc=f"tensordesc<i32[{c.block_n}, {scale_words(fmt, bk)}],{sl!r}>",
               x_desc=f"tensordesc<bf16[{block_m}, {bk}],{xl!r}>", rf_ptr="*fp32", out_ptr="*bf16",
               part_ptr="*fp32", count_ptr="*i32", row_scale_ptr="*fp32", bias_ptr="*fp32", M="i32", N="i32",
               KB="i32", stride_om="i32")
    consts = dict(BN=c.block_n, BK=bk, BM=block_m, STAGES=c.stages, OVERLAP=c.overlap, MX=fmt == "mxfp4",
                  SPLIT=split, PDL=pdl, HAS_ROW_SCALE=row_scale, HAS_BIAS=row_scale)
    # PDL: griddepcontrol.launch_dependents (PREEXIT) and .wait (ACQBULK) must be there
    require = ("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE") + (("PREEXIT", "ACQBULK") if pdl else ())
    return GateCase(f"gemm gluon fin {fmt} {block_m}x{c.block_n}x{bk} w{c.num_warps}s{c.stages}"
                    f"{' overlap' if c.overlap else ''} r{c.maxnreg} split{split}{' pdl' if pdl else ''}"
                    f"{' w4a4 bias' if row_scale else ''}", _fp4_gemm_ws_fin_kernel, sig, consts,
                    c.num_warps, 1, c.block_n * bk / (32 * c.num_warps), budget,
                    ("rf_ptr", "out_ptr", "part_ptr", "count_ptr", "row_scale_ptr", "bias_ptr", "stride_om"),
                    max_full_waits=1 if c.overlap else bk // COLS,
                    options=(("maxnreg", c.maxnreg), ) + ((("launch_pdl", True), ) if pdl else ()),
                    require=require)


# The shipped small-M config (SMALL_M: 64 rows x 512 columns per step, 2 slots, 80 registers, overlap, `fin`) as
# `fp4_linear` launches it: PDL on, at the splits of the shapes on 132 SMs (4096x12288: 2; 12288x4096: 6;
# 4096x1024: 4) and token tiles 8 / 16, W4A16 and W4A4 (row scale, with a bias); one without PDL (`pdl=False`).
GATE_SMALL_M = ((SMALL_M, 16, "nvfp4", 2, True, False), (SMALL_M, 8, "nvfp4", 6, True, True),
                (SMALL_M, 16, "nvfp4", 4, False, False), (SMALL_M, 8, "mxfp4", 2, True, False),
                (SMALL_M, 16, "mxfp4", 6, True, True), (SMALL_M, 16, "nvfp4", 1, True, False))
# Measured (Triton 3.6, sm_90): nvfp4 2.64-2.68 SASS per weight element of the consumer's K step, mxfp4 2.42-2.43
# (four chunks per step: the step's bookkeeping over 512 columns); 80 registers, no spills. Budgets: + ~3%.
SMALL_M_BUDGET = {"nvfp4": 2.75, "mxfp4": 2.5}


# The small-weight candidates (SMALL_GRID_CANDIDATES, benchmarks/smallm_sweep.py) as the sweep launches them (PDL, at
# their explicit split): each at token tile 8 with the W4A4 row scale and bias (nvfp4) and 16 (mxfp4); the split is
# a constexpr of the finish only, so one case per candidate and format covers its main loop. Measured (Triton 3.6):
# 2.68 (nvfp4) / 2.42-2.43 (mxfp4) SASS per weight element at 512-column steps, 2.77-2.80 at 256 (nvfp4: the
# step's bookkeeping over half the columns); 80 registers, no spills. Budgets: + ~3%.
SMALL_GRID_BUDGET = {("split8", "nvfp4"): 2.75, ("split8", "mxfp4"): 2.5, ("split2", "nvfp4"): 2.75,
                     ("split2", "mxfp4"): 2.5, ("k256_split4", "nvfp4"): 2.9, ("k256_split8", "nvfp4"): 2.9,
                     ("k256_split16", "nvfp4"): 2.9, ("w8_split8", "nvfp4"): 2.75, ("w8_split8", "mxfp4"): 2.5,
                     # the larger-weight candidates (check `smallwide`): the same main loops as above (split only
                     # changes the finish); k256 at 4 slots as k256_split4
                     ("split3", "nvfp4"): 2.75, ("split3", "mxfp4"): 2.5, ("split4", "nvfp4"): 2.75,
                     ("split4", "mxfp4"): 2.5, ("k256_split2", "nvfp4"): 2.9, ("k256_split3", "nvfp4"): 2.9,
                     ("k256_split6", "nvfp4"): 2.9, ("w8_split2", "nvfp4"): 2.75, ("w8_split2", "mxfp4"): 2.5,
                     ("w8_split4", "nvfp4"): 2.75, ("w8_split4", "mxfp4"): 2.5,
                     # the M = 16 candidates (check `m16`; 256-column steps, 4 / 5 CTAs per SM). Measured (Triton
                     # 3.6, sm_90): q / qn (64 registers, overlap) 2.82-2.83, p5 (48, no overlap) 2.71-2.72 at 8
                     # and 16 tokens, no spills, at most one full wgmma wait per step
                     **{(n, "nvfp4"): 2.9 if n.startswith("q") else 2.8 for n in M16_CANDIDATES}}


def small_grid_gate_cases():
    """Per candidate and format one case at the token tile 8 (nvfp4, W4A4 with bias) / 16 (mxfp4); the M = 16
    candidates (M16_CANDIDATES) also at 16 tokens, W4A16 (the issue's point; qn's token tile stays 8)."""
    cases = []
    for name, (c, fmts) in SMALL_GRID_CANDIDATES.items():
        for f in fmts:
            bm = 8 if f == "nvfp4" else 16
            case = gate_case(c, bm, SMALL_GRID_BUDGET[(name, f)], f, c.split_k, True, f == "nvfp4")
            cases.append(dataclasses.replace(case, name=f"{case.name} [small grid {name}]"))
            if name in M16_CANDIDATES and c.tile_m(16) == 16:
                case = gate_case(c, 16, SMALL_GRID_BUDGET[(name, f)], f, c.split_k, True, False)
                cases.append(dataclasses.replace(case, name=f"{case.name} [small grid {name} m16]"))
    return cases


# The M = 64 candidates (M64_CANDIDATES, benchmarks/m64_sweep.py) at their token tile (64; bm32x2: 32), fin ones at
# split 4 (the split is a constexpr of the finish only). Measured (Triton 3.6, sm_90, 2026-12-02): nvfp4 2.73 / 2.77
# (64 rows, one warpgroup, without / with overlap; wide_fin 2.73, wide_k512 2.64), mxfp4 2.40-2.42, 104-128
# registers, no spills. Budgets: + ~3-5%.
M64_BUDGET = {"nvfp4": 2.9, "mxfp4": 2.5}


def m64_gate_cases():
    """One case per new compile: a candidate that is a gated config (WIDE / WIDE_OVERLAP or an earlier candidate) at
    another split (a runtime argument of `_fp4_gemm_ws_kernel`) is that case already."""
    gated = {(dataclasses.replace(c, split_k=0), "nvfp4") for c, _, _ in GATE_WIDE} | \
        {(dataclasses.replace(c, split_k=0), "mxfp4") for c, _, _ in GATE_WIDE_MX}
    cases = []
    for name, (c, fmts) in M64_CANDIDATES.items():
        for f in fmts:
            if not c.fin and (dataclasses.replace(c, split_k=0), f) in gated:
                continue
            if not c.fin:
                gated.add((dataclasses.replace(c, split_k=0), f))
            case = gate_case(c, c.block_m, M64_BUDGET[f], f, 4)
            cases.append(dataclasses.replace(case, name=f"{case.name} [m64 {name}]"))
    return cases


# The mid-M configs `fp4_linear` launches where gemm_dispatch.GLUON_MID_M lists a weight (mid_m_config: WIDE's token
# tiles and M64_GRID's per-shape picks on the `fin` kernel), as it launches them: PDL on, W4A16 and W4A4 (row scale +
# bias) alternating, split 2 and 1 (the direct store). One case per distinct config and token tile, over the
# shapes M64_GRID names and a shape it does not (WIDE), at M = 24 / 64 / 128 (token tiles 32 / 64 / 128; mxfp4's
# largest is 64). Budgets: M64_BUDGET (the same main loops as the m64 candidates).
MID_M_SHAPES = ((6144, 4096), (12288, 4096), (4096, 12288))       # (padded N, padded K)


def mid_m_gate_cases():
    from trace_rl.kernels.fp4_gemm_gluon_config import mid_m_config

    cases, seen = [], set()
    for fmt in ("nvfp4", "mxfp4"):
        for M in (24, 64, 128):
            for n, k in MID_M_SHAPES:
                c = mid_m_config(M, fmt, n, k)
                bm = c.tile_m(M)
                if (c, bm, fmt) in seen:
                    continue
                seen.add((c, bm, fmt))
                w4a4 = len(seen) % 2 == 1
                case = gate_case(c, bm, M64_BUDGET[fmt], fmt, 1 if len(seen) % 3 == 0 else 2, True, w4a4)
                cases.append(dataclasses.replace(case, name=f"{case.name} [mid M {M} {n}x{k}]"))
    return cases


# The prefetch-all candidates for the W4A4 PDL path (fp4_gemm_gluon_prefetch.PREFETCH_ALL_CANDIDATES, check `oprojpf`)
# as `fp4_linear` would launch them there: PDL, the W4A4 row scale (with a bias), at token tiles 8 and 16, each at its
# split (a constexpr of the finish only). The ones that are earlier candidates (k256_split4, split4) are gated above.
# Budgets as the small-grid candidates' at the same step width (the ring depth changes the slot arithmetic only).
# Measured (Triton 3.6, sm_90, 2026-12-03): nvfp4 256-column steps 2.79-2.82 (6 / 8 slots), 512 2.66-2.69, mxfp4
# 2.41-2.44; 80 registers, no spills.
PREFETCH_ALL_BUDGET = {(256, "nvfp4"): 2.9, (512, "nvfp4"): 2.75, (512, "mxfp4"): 2.5}


def prefetch_all_gate_cases():
    from trace_rl.kernels.fp4_gemm_gluon_prefetch import PREFETCH_ALL_CANDIDATES

    cases = []
    for name, (c, fmts) in PREFETCH_ALL_CANDIDATES.items():
        if name in SMALL_GRID_CANDIDATES:
            continue
        for f in fmts:
            for bm in (8, 16):
                case = gate_case(c, bm, PREFETCH_ALL_BUDGET[(c.bk(f), f)], f, c.split_k, True, True)
                cases.append(dataclasses.replace(case, name=f"{case.name} [prefetch-all {name}]"))
    return cases


def sass_gate_cases():
    if not triton.__version__.startswith("3.6"):
        return []
    return [gate_case(c, bm, b) for c, bm, b in GATE + GATE_WIDE] + \
        [gate_case(c, bm, b, "mxfp4") for c, bm, b in GATE_MX + GATE_WIDE_MX] + \
        [gate_case(c, bm, SMALL_M_BUDGET[f], f, s, p, r) for c, bm, f, s, p, r in GATE_SMALL_M] + \
        small_grid_gate_cases() + m64_gate_cases() + mid_m_gate_cases() + prefetch_all_gate_cases()
