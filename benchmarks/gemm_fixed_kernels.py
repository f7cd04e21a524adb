"""The fixed cost of the Gluon W4A16 FP4 GEMM at M <= 16 (issue 15): what a launch costs with no K step at all, and
probe variants that cut it (benchmarks/gemm_fixed.py times them; the shipped kernel is unchanged).

Why (benchmarks/results/gemm_compute_h200_1202c.json, `no_k_steps_us`: the compute-only binary with zero K steps):
split 1 (mxfp4 4096x12288, 96 CTAs) 2.6-2.8 us; split 2 4.6-5.5; split 4 4.8-5.8; split 6 5.4-6.7; split 8 6.3-8.6.
The split-K epilogue is most of it. Its path on the program that reduces (sm_90 SASS of `_finish`, Triton 3.6,
n64_k512 nvfp4 bm 16), each step waiting on the one before:
  STG x8 (partial) -> BAR.SYNC -> MEMBAR.ALL.CTA + MEMBAR.ALL.GPU (the acq_rel ticket's release: waits for the
  partial's stores to be acknowledged by L2) -> ATOMG.E.ADD.STRONG.GPU (an L2 round trip) -> CCTL.IVALL ->
  SHFL/STS -> BAR.SYNC -> LDS (the ticket) -> the reduction loop (runtime trip count: ptxas unrolls it by 4 with a
  remainder, so split 6 / 8 take 2 dependent rounds of LDG.E.STRONG.GPU) -> the row factors' LDG (only now: one more
  round trip, from HBM the first time) -> FMUL -> STG.
Variants (`VARIANTS`, all on n64_k512's config: 64-row tiles, 512-column steps, 3 CTAs/SM):
- `n64_fin`: `_finish_fast` (now the library's small-M epilogue, fp4_gemm_gluon_epilogue.py): the row factors
  loaded before the partial is stored (under the fence and the ticket),
  the split a constexpr so the reduction is straight-line code (every partial's loads issued before the first add);
  adds in the same order from the same zeros as `_finish`, so bit-equal to n64_k512;
- `n64_nosplit`: the shipped kernel at split 1 (192 / 64 programs): its no-K time minus n64_k512's is what the
  split-K epilogue costs; at 4096x12288 also a candidate (no epilogue, x1.37 busiest SM);
- `n64_fin_pdl` (shipped since: fp4_gemm_gluon.SMALL_M with `pdl=True`): n64_fin launched as a programmatic
  dependent launch (PDL, `launch_pdl`; captured into the graph
  as a programmatic edge): every CTA signals `griddepcontrol.launch_dependents` at once, so the next GEMM's CTAs
  are scheduled as this one's exit and run their launch, barrier init, setmaxnreg and the first STAGES steps' weight
  TMAs (weights: no earlier kernel writes them) under its tail; `griddepcontrol.wait` before the first activation
  TMA and before any global write (partials, ticket, out). Same math as n64_fin (bit-equal to n64_k512). Whether a
  model's step gets this depends on the kernel before it launching dependents too (cuBLAS, torch ops do not);
- `n64_nosplit_pdl`: the same at split 1 (`_finish_fast`'s direct store): no split-K epilogue and the setup under
  the previous call's tail, at the price of n64_nosplit's imbalance (x1.37 at 4096x12288);
- `empty`: an empty Gluon kernel launched at the same grid in the same graph: the launch floor no kernel avoids
  (and the same with PDL: the floor of overlapped launches).
Gluon has no interpreter: these run on an sm_90 GPU only; `gate_case` compiles them for sm_90 on any machine.
"""

from __future__ import annotations

from dataclasses import replace

import gemm_compute_kernels as gc
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

# the shipped small-M kernel's pieces (moved into the library from this probe: fp4_gemm_gluon, its epilogue module)
from trace_rl.kernels import fp4_gemm_gluon_ring as ring
from trace_rl.kernels.fp4_gemm_gluon import _fp4_gemm_ws_fin_kernel, _shared_layouts
from trace_rl.kernels.fp4_gemm_gluon_epilogue import _finish_fast, _gdc_launch, _gdc_wait
from trace_rl.kernels.hopper_fp4 import COLS, ROWS

BASE = {v.name: v for v in gc.VARIANTS}["n64_k512"]
FIN = replace(BASE, name="n64_fin")
NOSPLIT = replace(BASE, name="n64_nosplit", nv=replace(BASE.nv, split_k=1), mx=replace(BASE.mx, split_k=1))
FIN_PDL = replace(BASE, name="n64_fin_pdl")
NOSPLIT_PDL = replace(NOSPLIT, name="n64_nosplit_pdl")
VARIANTS = (BASE, FIN, NOSPLIT, FIN_PDL, NOSPLIT_PDL)
PDL_VARIANTS = (FIN_PDL.name, NOSPLIT_PDL.name)
FAST = (FIN.name, ) + PDL_VARIANTS          # launched through this module's kernels


@gluon.jit
def _x_producer_pdl(x_desc, x_bufs, ready, empty, m0, kb_lo, n_iters, BK: gl.constexpr, STAGES: gl.constexpr):
    """gemm_compute_kernels._x_producer after `_gdc_wait` (the compute-only probe reads only activations)."""
    _gdc_wait()
    gc._x_producer(x_desc, x_bufs, ready, empty, m0, kb_lo, n_iters, BK, STAGES)


@gluon.jit
def _k_range(KB, SPLIT: gl.constexpr):
    """(first K step, K steps) of program pid_k: as the shipped kernel, with the split a constexpr."""
    pid_k = gl.program_id(1)
    per_split = gl.cdiv(KB, SPLIT)
    kb_lo = pid_k * per_split
    n_iters = gl.minimum(kb_lo + per_split, KB) - kb_lo
    return kb_lo, n_iters


@gluon.jit(do_not_specialize=["M", "N", "KB", "sixteen"])
def _compute_ws_fin_kernel(w_desc, s_desc, x_desc, rf_ptr, out_ptr, part_ptr, count_ptr, M, N, KB, stride_om,
                           sixteen, BN: gl.constexpr, BK: gl.constexpr, BM: gl.constexpr, STAGES: gl.constexpr,
                           OVERLAP: gl.constexpr, MX: gl.constexpr, SPLIT: gl.constexpr,
                           PDL: gl.constexpr = False):
    """gemm_compute_kernels._compute_ws_kernel (no weight bytes read) with `_finish_fast`."""
    pid_n = gl.program_id(0)
    pid_k = gl.program_id(1)
    pid_m = gl.program_id(2)
    tile = pid_m * gl.num_programs(0) + pid_n
    kb_lo, n_iters = _k_range(KB, SPLIT)
    w_bufs, s_bufs, x_bufs, ready, empty = ring.alloc_ring(w_desc, s_desc, x_desc, STAGES)
    if PDL:
        _gdc_launch()
        (acc, ) = gl.warp_specialize([
            (gc._compute_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, sixteen, BN, BK, BM, STAGES,
                                    OVERLAP, MX, False)),
            (_x_producer_pdl, (x_desc, x_bufs, ready, empty, pid_m * BM, kb_lo, n_iters, BK, STAGES)),
        ], [1], [24])
    else:
        (acc, ) = gl.warp_specialize([
            (gc._compute_consumer, (w_bufs, s_bufs, x_bufs, ready, empty, n_iters, sixteen, BN, BK, BM, STAGES,
                                    OVERLAP, MX, False)),
            (gc._x_producer, (x_desc, x_bufs, ready, empty, pid_m * BM, kb_lo, n_iters, BK, STAGES)),
        ], [1], [24])
    _finish_fast(acc, pid_n, pid_m, tile, pid_k, M, N, rf_ptr, out_ptr, part_ptr, count_ptr, stride_om, rf_ptr,
                 rf_ptr, BN, BM, SPLIT, PDL, False, False)


@gluon.jit
def _empty_kernel(out_ptr, PDL: gl.constexpr = False):
    """Nothing (the launch floor): program (0, 0, 0) stores one word, so the kernel is not dead code. PDL: launch
    dependents at once, wait before the store (the floor of back-to-back launches that overlap)."""
    if PDL:
        _gdc_launch()
        _gdc_wait()
    first = (gl.program_id(0) + gl.program_id(1) + gl.program_id(2)) == 0
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = gl.arange(0, 128, layout=L)
    gl.store(out_ptr + offs, gl.zeros([128], gl.float32, L), mask=(offs == 0) & first)


def full(x2, w, v, out):
    """out = x2 @ W^T under variant `v` (one of VARIANTS). Returns (kernel, plan)."""
    if v.name not in FAST:
        return gc.full(x2, w, v, out)
    p, (w_desc, s_desc, x_desc), part, counters = gc._launch_args(x2, w, v, out)
    c = p["config"]
    kern = _fp4_gemm_ws_fin_kernel[p["grid"]](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters, w.row_factor, w.row_factor, x2.shape[0], w.n,
        p["kb"], out.stride(0),
        BN=c.block_n, BK=p["bk"], BM=p["bm"], STAGES=c.stages, OVERLAP=c.overlap, MX=w.fmt == "mxfp4",
        SPLIT=p["grid"][1], PDL=v.name in PDL_VARIANTS, num_warps=c.num_warps, maxnreg=c.maxnreg,
        **({"launch_pdl": True} if v.name in PDL_VARIANTS else {}))
    return kern, p


def compute_only(x2, w, v, out, k_steps: int | None = None):
    """The compute-only probe under variant `v` (k_steps = 0: the fixed cost alone). Returns (kernel, plan)."""
    if v.name not in FAST:
        return gc.compute_only(x2, w, v, out, k_steps)
    p, (w_desc, s_desc, x_desc), part, counters = gc._launch_args(x2, w, v, out)
    c = p["config"]
    kern = _compute_ws_fin_kernel[p["grid"]](
        w_desc, s_desc, x_desc, w.row_factor, out, part, counters, x2.shape[0], w.n,
        p["kb"] if k_steps is None else k_steps, out.stride(0), 16, BN=c.block_n, BK=p["bk"], BM=p["bm"],
        STAGES=c.stages, OVERLAP=c.overlap, MX=w.fmt == "mxfp4", SPLIT=p["grid"][1], PDL=v.name in PDL_VARIANTS,
        num_warps=c.num_warps, maxnreg=c.maxnreg, **({"launch_pdl": True} if v.name in PDL_VARIANTS else {}))
    return kern, p


def empty(grid, scratch, pdl: bool = False):
    """The empty kernel at `grid` (4 warps), writing one float of `scratch` (pdl: launched as a programmatic
    dependent of the kernel before it)."""
    if pdl:
        return _empty_kernel[tuple(grid)](scratch, PDL=True, num_warps=4, launch_pdl=True)
    return _empty_kernel[tuple(grid)](scratch, num_warps=4)


def gate_case(v, fmt: str, bm: int, mode: str = "full", split: int = 2):
    """sass_gate case of what `full` / `compute_only` launch for a variant (n64_fin: at `split`, a constexpr)."""
    from trace_rl.kernels.sass_gate import GateCase

    if v.name not in FAST:
        return gc.gate_case(v, fmt, bm, mode)
    c = v.config(bm, fmt)
    bk = v.bk(fmt)
    wl, sl, xl = _shared_layouts(bm, bk)
    sig = dict(w_desc=f"tensordesc<i32[{bk // COLS}, {c.block_n // ROWS}, 256],{wl!r}>",
               s_desc=f"tensordesc<i32[{c.block_n}, {gc.scale_words(fmt, bk)}],{sl!r}>",
               x_desc=f"tensordesc<bf16[{bm}, {bk}],{xl!r}>", rf_ptr="*fp32", out_ptr="*bf16",
               part_ptr="*fp32", count_ptr="*i32", M="i32", N="i32", KB="i32", stride_om="i32")
    consts = dict(BN=c.block_n, BK=bk, BM=bm, STAGES=c.stages, OVERLAP=c.overlap, MX=fmt == "mxfp4", SPLIT=split,
                  PDL=v.name in PDL_VARIANTS)
    if mode == "full":       # the library kernel: its W4A4 row scale and bias pointers, both off
        kernel = _fp4_gemm_ws_fin_kernel
        sig = {**{k: s for k, s in sig.items() if k not in ("M", "N", "KB", "stride_om")}, "row_scale_ptr": "*fp32",
               "bias_ptr": "*fp32", "M": "i32", "N": "i32", "KB": "i32", "stride_om": "i32"}
        consts |= dict(HAS_ROW_SCALE=False, HAS_BIAS=False)
    else:
        kernel = _compute_ws_fin_kernel
        sig = {**{k: s for k, s in sig.items() if k != "stride_om"}, "stride_om": "i32", "sixteen": "i32"}
    return GateCase(f"gemmfix {v.name} {mode} {fmt} bm{bm} split{split} {c.block_n}x{bk} w{c.num_warps}"
                    f"s{c.stages} r{c.maxnreg}", kernel, sig, consts, c.num_warps, 1,
                    c.block_n * bk / (32 * c.num_warps), 99.0,
                    ("rf_ptr", "out_ptr", "part_ptr", "count_ptr", "stride_om"), max_full_waits=99,
                    options=(("maxnreg", c.maxnreg), ) + ((("launch_pdl", True), ) if v.name in PDL_VARIANTS else ()),
                    require=("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG"))
