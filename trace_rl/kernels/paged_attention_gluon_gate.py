"""The sm_90 compile gate's cases (trace_rl/kernels/sass_gate.py; Triton 3.6 only) for the Gluon FP4-KV decode
attention: the warp-specialised kernel (paged_attention_gluon.py) and its persistent variant
(paged_attention_gluon_persistent.py), whose main loop is the tile loop inside the item loop. Kept apart so those
files stay under ~500 lines; the notes below say what each case compiles to and what was tried.
"""

from __future__ import annotations

import triton

from trace_rl.formats import kv_layout as L
from trace_rl.kernels.paged_attention_gluon import (
    BLOCK_T,
    HEAD_DIM,
    PAGE,
    GluonAttentionConfig,
    _block_sig,
    _decode_attention_ws_kernel,
    _words,
)
from trace_rl.kernels.paged_attention_gluon_persistent import _decode_attention_persistent_kernel


def gate_case(c: GluonAttentionConfig, group: int = 4, kv_heads: int = 8, budget: float = 3.35,
              kv_format: str = "nvfp4:row", full_waits: int = 2, redo: bool = False, pdl: bool = False):
    from trace_rl.kernels.sass_gate import GateCase

    w = _words(kv_format)
    mx = c.mx(kv_format)
    kg, vg = (_block_sig(w["ks"], "i32"), _block_sig(w["vs"], "i32")) if mx else \
        (_block_sig(w["kg"], "fp32"), _block_sig(w["vg"], "fp32"))              # mxfp4: the launcher's placeholders
    sig = dict(q_ptr="*bf16", out_ptr="*bf16", bt_ptr="*i32", lens_ptr="*i32",
               kc_desc=_block_sig(w["kc"], "i32"), ks_desc=_block_sig(w["ks"], "i32"), kg_desc=kg,
               vc_desc=_block_sig(w["vc"], "i32"), vs_desc=_block_sig(w["vs"], "i32"), vg_desc=vg, qk_scale="fp32",
               stride_qb="i32", stride_qh="i32", stride_ob="i32", stride_oh="i32", stride_bt="i32")
    consts = dict(HKV=kv_heads, GROUP=group, N=c.n_pad, D=HEAD_DIM, DV=L.v_rows(HEAD_DIM), PAGE=PAGE, T=BLOCK_T,
                  STAGES=c.stages, MX=mx)
    name = kv_format.split(":")[0] + {1: " bias", 3: " checked"}.get(mx, "")
    kernel, kind = _decode_attention_ws_kernel, "ws"
    if c.persistent:      # its main loop is the inner (tile) loop of the item loop
        kernel, kind = _decode_attention_persistent_kernel, "persistent"
        sig["work"] = "i32"
    consts["UNROLL"] = c.unroll       # an iteration of the tile loop runs `unroll` tiles, each with its 2 full waits
    consts["COLMAX"] = c.col_max
    consts["LAUNCH_DEPS"] = c.launch_dependents   # as the launcher: griddepcontrol.launch_dependents (PREEXIT)
    if redo:          # mx_checked's second launch: the exact kernel, run only where the checked output is not finite
        consts["REDO"] = True
        kind += " redo"
    require, first_before, options = ("USETMAXREG", "SYNCS.PHASECHK", "UTMALDG", "SYNCS.ARRIVE"), (), ()
    if pdl:           # redo_pdl: the checked launch signals launch_dependents (PREEXIT) after its tile loop; the REDO,
        consts["PDL"] = True      # launched with launch_pdl, waits (ACQBULK) before its first global access
        kind += " pdl"
        require += ("ACQBULK", ) if redo else ("PREEXIT", )
        first_before = ("ACQBULK", ) if redo else ()
        options = (("launch_pdl", True), ) if redo else ()
    if c.launch_dependents:     # after the tile loop, for the engine's next PDL kernel (o_proj's W4A4 quantize)
        require += ("PREEXIT", ) if "PREEXIT" not in require else ()
    full_waits *= c.unroll
    kind += "" if c.unroll == 1 else f" u{c.unroll}"
    kind += "" if c.n_pad == 16 else f" n{c.n_pad}"
    kind += " colmax" if c.col_max else ""
    return GateCase(f"attention gluon {kind} {name} g{group} s{c.stages} r{c.maxnreg}", kernel, sig,
                    consts, 4, 1, c.unroll * BLOCK_T * (HEAD_DIM + L.v_rows(HEAD_DIM)) / 128, budget,
                    ("q_ptr", "out_ptr", "bt_ptr", "lens_ptr", "stride_qb", "stride_qh", "stride_ob", "stride_oh",
                     "stride_bt"),
                    max_full_waits=full_waits, options=(("maxnreg", c.maxnreg), ) + options, innermost=c.persistent,
                    require=require, first_before=first_before, forbid=())


# Compile gate (sass_gate.py; Triton 3.6 only). Per K/V element of a 128-token tile (256 per consumer thread), sm_90,
# Triton 3.6, Qwen3-8B heads (group 4): 789 SASS in the loop, 3.08 per element (the shipped nvfp4 kernel: 3.31), no
# spills, every HGMMA with a register A operand, 2 full wgmma waits per tile (the previous PV before the QK issue, the
# QK before the softmax), the consumer in R0-R194 under setmaxnreg 232 (maxnreg 128: 2 CTAs per SM). Groups of 9-16
# (no half-column softmax): 3.28. The main loop may hold STSM (the P^T store), LDSM (the K scale words) and STS (the
# cross-warp max): the decoded tiles stay in registers (convert_layout(assert_trivial=True) into the wgmma operand
# layout). 3 stages cost ~20 more SASS per tile (slot = it % 3). Before the half-column softmax: 3.28 at group 4.
# Below maxnreg 128 ptxas serialises every wgmma (C7514) or spills: 96 (3.54, serialised), 88 and 80 (3 CTAs per
# SM: serialised and 12-45 spill accesses per tile).
# Where ptxas puts the work (SASS of the full-tile loop, in order): the ready wait; the K code extraction (~115
# LOP3/SHF, under the previous PV); the PV wait; the K scale multiplies (64 HMUL2) interleaved with the 16 QK HGMMAs;
# the slot release; the QK wait, placed right after the last HGMMA; then the whole V^T decode (~226), the softmax and
# the 16 PV HGMMAs (in flight under the next tile's K code extraction). ptxas schedules WARPGROUP.DEPBAR as early as
# it can and sinks the decode below it: also with 256 registers, with vt in the wait's deps, with the slot release
# after the wait, and with the V^T decode written before the QK issue (3.16 per element, the decode still after the
# wait). Inside one warpgroup only the K code extraction overlaps an MMA; the overlap of V^T decode and the QK MMA
# that the source asks for comes from the other resident CTA's warps.
# mxfp4, the bias folded (MX 2, opt-in mx_fold=True): 806 SASS, 3.15 per element at group 4 (851, 3.32 at group 16; 810,
# 3.16 at group 1), no spills, 2 full waits, the consumer in R0-R180 (R0-R212 at group 16): the scale pairs cost
# ~7 ops per V scale word (and, min.u16x2, mad) against nvfp4's 2, and no factor loads or multiplies. Through
# kv_decode's 2**125 bias HMUL2 instead (mx_fold=False, MX 1, the default, exact for every scale byte): 878, 3.43 at
# group 4 (968, 3.78 at group 16: over issue 15's 3.5 budget, gated at 3.8 so it cannot grow), R0-R206: +128 HMUL2,
# 0.5 per element.
GATE = ((GluonAttentionConfig(), 4, 3.15, "nvfp4:row"), (GluonAttentionConfig(stages=2), 4, 3.15, "nvfp4:row"),
        (GluonAttentionConfig(), 16, 3.35, "nvfp4:row"), (GluonAttentionConfig(), 4, 3.5, "mxfp4"),
        (GluonAttentionConfig(), 16, 3.9, "mxfp4"), (GluonAttentionConfig(mx_fold=True), 4, 3.25, "mxfp4"),
        (GluonAttentionConfig(mx_fold=True), 16, 3.45, "mxfp4"),
        # the SASS-reduction variants (opt-in, bit-identical; docs/benchmarks.md "Decode attention" has the class
        # breakdown, trace_rl/kernels/sass_histogram.py), group 4 unless said: col_max (the column max with one
        # barrier, _col_max) nvfp4 2.87 (group 16: 3.18), mxfp4 3.29 exact / 2.89 folded; n_pad=8 (N = 8) nvfp4 3.03
        # alone, 2.81 with col_max; unroll=2 (two tiles per loop iteration) nvfp4 3.06 alone (group 16: 3.21), 2.83
        # with col_max (group 16: 3.11). All three (paged_attention_gluon.LEAN): nvfp4 2.78 (groups 1 and 8 alike;
        # 2.73 with 2 stages), mxfp4 3.21 exact / 2.82 folded; the register copies 0.32 -> 0.12 per element (nvfp4),
        # the max's 3 barriers -> 1. Unroll 3 / 4 (N = 8, gl.max): 3.02 / 2.95, worse than 2 (2.86)
        (GluonAttentionConfig(unroll=2), 4, 3.08, "nvfp4:row"), (GluonAttentionConfig(unroll=2), 16, 3.23, "nvfp4:row"),
        (GluonAttentionConfig(n_pad=8), 4, 3.05, "nvfp4:row"),
        (GluonAttentionConfig(col_max=True), 4, 2.9, "nvfp4:row"),
        (GluonAttentionConfig(col_max=True), 16, 3.2, "nvfp4:row"),
        (GluonAttentionConfig(col_max=True), 4, 3.35, "mxfp4"),
        (GluonAttentionConfig(n_pad=8, unroll=2, col_max=True), 4, 2.8, "nvfp4:row"),
        (GluonAttentionConfig(n_pad=8, unroll=2, col_max=True), 1, 2.8, "nvfp4:row"),
        (GluonAttentionConfig(n_pad=8, unroll=2, col_max=True), 8, 2.8, "nvfp4:row"),
        (GluonAttentionConfig(n_pad=8, unroll=2, col_max=True), 4, 3.28, "mxfp4"),
        (GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, mx_fold=True), 4, 2.89, "mxfp4"),
        (GluonAttentionConfig(col_max=True, unroll=2), 16, 3.13, "nvfp4:row"),
        (GluonAttentionConfig(col_max=True, unroll=2), 4, 2.85, "nvfp4:row"),
        (GluonAttentionConfig(col_max=True, unroll=2), 4, 3.35, "mxfp4"),
        # the persistent variant (paged_attention_gluon_persistent.py; its tile loop, inside the item loop). With
        # col_max its nvfp4 loop is no longer serialised (below): 2.91 at group 4 (3.23 at 16), LEAN 2.79 / mxfp4 3.22
        (GluonAttentionConfig(persistent=True, col_max=True), 4, 2.95, "nvfp4:row"),
        (GluonAttentionConfig(persistent=True, col_max=True), 16, 3.25, "nvfp4:row"),
        (GluonAttentionConfig(persistent=True, n_pad=8, unroll=2, col_max=True), 4, 2.81, "nvfp4:row"),
        (GluonAttentionConfig(persistent=True, n_pad=8, unroll=2, col_max=True), 4, 3.29, "mxfp4"),
        (GluonAttentionConfig(persistent=True), 4, 3.5, "mxfp4"),
        (GluonAttentionConfig(persistent=True), 16, 3.8, "mxfp4"),
        (GluonAttentionConfig(persistent=True, mx_fold=True), 4, 3.25, "mxfp4"),
        # every mxfp4 case (MX != 0) also pays the probability flush (paged_attention_gluon_tiles.MX_P_FLUSH: p and
        # alpha below 2**-51 to 0, so the checked fold's products stay normal): +0.03-0.06 per element, one FMUL per
        # score element (ex2.ftz of s - m - 75, x 2**75) and a select per column; a compare + select per element
        # instead cost +0.07-0.09 and serialised the N = 16 configs' wgmma waits. With the flush (before): LEAN exact
        # 3.26 (3.21), folded 2.87 (2.82), LEAN_CHECKED 2.92 / 2.91 at groups 8 / 4 (2.86), checked N = 16 3.45 at
        # group 16 (3.35), persistent checked 2.92 (2.87), exact DEFAULT 3.48 / 3.89 at groups 4 / 16 (3.43 / 3.78),
        # REDO 3.27 (3.21); the other mxfp4 numbers in these comments are from before it. nvfp4's SASS is unchanged.
        # mxfp4 checked (mx_checked, MX 3: the 2**5-offset fold, exact for stored bytes MX_CHK_LO (64) .. 134; +Inf V
        # pairs outside that window on both ends, the largest K (stored - 64, unsigned) kept per thread;
        # paged_attention_gluon_kv.MX_CHK): LEAN_CHECKED 2.86 at groups 8 and 4 (1463 SASS; the folded fold_lean's
        # 2.82) against the exact LEAN's 3.21, and N = 16 (DEFAULT + mx_checked) 3.35 at group 16 (858) against the
        # exact 3.78. The window's low end costs +0.05 (2.81 / 3.31 with the window 1..134, which was not exact: bytes
        # 1..12 made folded products subnormal): per V scale word one add per byte pair (the 0x8000 - LO offset that
        # lets one min.s16x2 clamp both ends), the byte split a PRMT instead of shift + and (which pays back about half
        # of it); K's check stays 2 integer max per tile (the subtract folds into the pair's IMAD), plus the stale-row
        # mask in the last tile. nvfp4's and the exact / folded mxfp4 cases' SASS are unchanged by it (the MX 3 code
        # is all behind constexpr branches: benchmarks/sass_diff.py --only attention)
        (GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, mx_checked=True), 8, 2.94, "mxfp4"),
        (GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, mx_checked=True), 4, 2.94, "mxfp4"),
        (GluonAttentionConfig(mx_checked=True), 16, 3.47, "mxfp4"),
        # the persistent LEAN_CHECKED (its REDO is the one-program-per-item exact kernel): 2.87 (exact 3.24)
        (GluonAttentionConfig(persistent=True, n_pad=8, unroll=2, col_max=True, mx_checked=True), 4, 2.95, "mxfp4"))
# The persistent variant over nvfp4: ptxas serialises every wgmma of its tile loop (C7513, "non wgmma instructions
# defining input registers of a wgmma between start and end of the pipeline stage": 32 full waits, 3.36 per element
# at group 4, 3.67 at 16), whatever the register budget (maxnreg 128-168 alike) and with the factor loads after the
# QK wait; without the per-token factor loads (fk = fv = 1) or with one item per program it is not serialised (3.13).
# Also serialised: two items unrolled (static_range), the item loop around a warp_specialize region per item, padded
# accumulator columns made distinct (acc * 0); a noinline per-item function trades it for C7510 (pipeline crossing a
# function boundary). Where in its pipeline ptxas finds the offending definition is not visible in the PTX (no
# definition of an in-flight wgmma register on any path; the same copies into the padded accumulator columns inside
# the PV stage as the shipped kernel's).
# Gated as it is, so that it cannot get worse unseen; benchmarks/attention_short_h200.sh measures what it costs.
# col_max=True (the column max through one convert_layout instead of gl.max's two-round reduction) ends the
# serialisation (2 full waits per tile, 2.91 per element; GATE above): gl.max's cross-warp rounds in the loop were
# what ptxas could not prove clear of the pipeline.
GATE_SERIALISED = ((GluonAttentionConfig(persistent=True), 4, 3.45, "nvfp4:row"),
                   (GluonAttentionConfig(persistent=True), 16, 3.75, "nvfp4:row"))


# mx_checked's REDO launch (the exact kernel with a check of the checked output first): its tile loop is the exact
# LEAN's (3.21 at group 8), compiled here so that the REDO constexpr cannot break unseen
GATE_REDO = ((GluonAttentionConfig(n_pad=8, unroll=2, col_max=True), 8, 3.29, "mxfp4"), )
# redo_pdl (LEAN_CHECKED_PDL): the checked launch with its launch_dependents after the tile loop (the ws kernel and the
# persistent one; the loop's SASS is LEAN_CHECKED's) and the REDO with griddepcontrol.wait before any global access
GATE_PDL = ((GluonAttentionConfig(n_pad=8, unroll=2, col_max=True, mx_checked=True), 8, 2.94, "mxfp4", False),
            (GluonAttentionConfig(persistent=True, n_pad=8, unroll=2, col_max=True, mx_checked=True), 4, 2.95, "mxfp4",
             False),
            (GluonAttentionConfig(n_pad=8, unroll=2, col_max=True), 8, 3.29, "mxfp4", True))


def sass_gate_cases():
    if not triton.__version__.startswith("3.6"):
        return []
    return [gate_case(c, group, budget=budget, kv_format=fmt) for c, group, budget, fmt in GATE] + \
        [gate_case(c, group, budget=budget, kv_format=fmt, redo=True) for c, group, budget, fmt in GATE_REDO] + \
        [gate_case(c, group, budget=budget, kv_format=fmt, redo=redo, pdl=True)
         for c, group, budget, fmt, redo in GATE_PDL] + \
        [gate_case(c, group, budget=budget, kv_format=fmt, full_waits=32) for c, group, budget, fmt in GATE_SERIALISED]
