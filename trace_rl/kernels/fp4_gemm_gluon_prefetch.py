"""Prefetch-all configs of the Gluon FP4 GEMM for the W4A4 linear whose activation quantize is its own PDL launch
(issue 15's o_proj miss: W4A4 / W4A16 1.16-1.48 at M <= 16 on 4096x4096, K x N), and the per-shape table that
selects them. Plain Python (importable without Gluon), like fp4_gemm_gluon_config.py.

Why: under PDL (`fp4_matmul_gluon(pdl=True)`, `_producer_pdl`) the small-M GEMM's producer issues the weight words and
scales of its first `stages` ring slots BEFORE griddepcontrol.wait (the weight is never written by a kernel of the
step: fp4_gemm_gluon_epilogue's contract), and every activation tile, every later slot and the finish after it. In
`fp4_linear`'s W4A4 path the kernel it waits for is the activation quantize (`quantize_dequant_bf16`, its own PDL
launch: ~1.5-2.5 us), so a CTA with more K steps than ring slots streams `stages` steps under the quantize and the
rest only after it completed. The shipped o_proj config (nvfp4 `k256_split3`: 6 steps of 256 columns per CTA, 4
slots; mxfp4 `split3`: 3 steps of 512, 2 slots) leaves 2 / 1 steps behind the wait. A prefetch-all config has a ring
as deep as its CTA's K steps (`stages >= cdiv(K steps, split)`), so every weight load is in flight before the wait
and the quantize's latency overlaps the whole weight stream; the price is shared memory (fewer CTAs per SM) or a
larger split (more partials). The contract stays: only weight words and scales before the wait, never x or the
row scales (the producer is unchanged; the config alone decides how much of the weight goes first).

Bits: a config's result depends on its K partition only (the columns per split: 128-column chunks accumulate in
order inside a split, the splits add in split order, `_finish_fast`). pf_k256_split3 and pf_k512_split3 have the
shipped nvfp4 o_proj partition (1536 / 1536 / 1024 columns), pf_k512_split3 also the shipped mxfp4 one at M <= 8:
bit-identical there; the others match the float64 reference within the configs' tolerance (tests).

`W4A4_PDL_GRID`, the table `fp4_linear` reads only for a W4A4 call whose x it quantizes itself with a PDL launch
(`kernels.linear.w4a4_quantize_pdl`): {format: {(padded N, padded K): {M bucket 8 / 16: config}}}; a missing entry
keeps `config_for`'s pick (SMALL_GRID / SMALL_M). W4A16, the prequantized W4A4 (fused producers) and eager calls
never read it. Filled from check `oprojpf`'s summary.json (`rule_proposal`): a candidate goes in only where it beat
the shipped config in every round by >= 2% at W4A4.
"""

from __future__ import annotations

from trace_rl.kernels.fp4_gemm_gluon_config import (
    SMALL_GRID_CANDIDATES,
    SMEM_LIMIT,
    TOKEN_TILES,
    GluonConfig,
    _cdiv,
    config_for,
    m_bucket,
)

# The o_proj candidates (Qwen3-8B 4096x4096, K x N: 16 nvfp4 steps of 256 / 8 steps of 512 per row tile; 64 row
# tiles of 64). Ring bytes at 16 tokens (smem_bytes): 256-column slot 17 KB, 512-column 34 KB (nvfp4) / 33 KB (mxfp4).
#   pf_k256_split2   nvfp4: 8 steps of 256, 8 slots (137 KB: 1 CTA per SM), 128 programs
#   pf_k256_split3   nvfp4: 6 steps, 6 slots (103 KB: 2 per SM), 192 programs; the shipped partition (same bits)
#   pf_k512_split2   4 steps of 512, 4 slots (137 / 133 KB: 1 per SM), 128 programs; nvfp4: pf_k256_split2's bits
#   pf_k512_split3   3 steps of 512 (3 / 3 / 2), 3 slots (103 / 100 KB: 2 per SM), 192 programs; the shipped
#                    partition of both formats at M <= 8 (same bits)
# and the earlier candidates that already prefetch all of o_proj's weight (named, not redefined): k256_split4 (nvfp4:
# 4 steps, 4 slots, 256 programs at 3 per SM) and split4 (2 steps of 512, 2 slots; mxfp4 M = 9..16's shipped SMALL_M
# runs it: its auto split is 4 there).
_PF = dict(block_n=64, maxnreg=80, overlap=True, fin=True)
PREFETCH_ALL_CANDIDATES: dict[str, tuple[GluonConfig, tuple[str, ...]]] = {
    "pf_k256_split2": (GluonConfig(stages=8, block_k=256, split_k=2, **_PF), ("nvfp4", )),
    "pf_k256_split3": (GluonConfig(stages=6, block_k=256, split_k=3, **_PF), ("nvfp4", )),
    "pf_k512_split2": (GluonConfig(stages=4, block_k=512, split_k=2, **_PF), ("nvfp4", "mxfp4")),
    "pf_k512_split3": (GluonConfig(stages=3, block_k=512, split_k=3, **_PF), ("nvfp4", "mxfp4")),
    "k256_split4": SMALL_GRID_CANDIDATES["k256_split4"],
    "split4": SMALL_GRID_CANDIDATES["split4"],
}
# the weight shapes the candidates are for: (padded N, padded K) = o_proj's
PREFETCH_ALL_SHAPES = ((4096, 4096), )


def _evened_split(kb: int, split: int) -> tuple[int, int]:
    """(splits, K steps per split) of `split` over kb K steps, evened out so no split is empty: the launcher's
    arithmetic (fp4_gemm_gluon.launch_grid, not importable here without Gluon)."""
    s = _cdiv(kb, _cdiv(kb, max(1, min(split, kb))))
    return s, _cdiv(kb, s)


def steps_per_program(c: GluonConfig, fmt: str, k_padded: int) -> int:
    """K steps each program of `c` (an explicit split) runs on a weight of `k_padded` columns (`_evened_split`)."""
    if not c.split_k:
        raise ValueError(f"steps_per_program: {c} has no explicit split_k (the auto split depends on the device)")
    return _evened_split(k_padded // c.bk(fmt), c.split_k)[1]


def prefetches_all(c: GluonConfig, fmt: str, k_padded: int) -> bool:
    """Whether every weight step of each program is requested before the PDL wait: the ring holds them all."""
    return c.stages >= steps_per_program(c, fmt, k_padded)


def check_prefetch_all(name: str, c: GluonConfig, fmt: str, k_padded: int) -> None:
    """A prefetch-all config for `fmt` at `k_padded` columns: a valid `fin` config with an explicit split whose K step
    divides K, whose ring fits an sm_90 CTA at the largest small-M token tile (16) and holds all of a program's steps.
    Raises ValueError saying what does not hold and what to change."""
    c.check(fmt)
    if not c.fin or not c.split_k:
        raise ValueError(f"{name}: {c} must be a `fin` config (PDL, W4A4 row scale) with an explicit split_k")
    if k_padded % c.bk(fmt):
        raise ValueError(f"{name}: the {c.bk(fmt)}-column {fmt} K step does not divide K = {k_padded}")
    bm = TOKEN_TILES[1]
    if c.smem_bytes(bm, fmt) > SMEM_LIMIT:
        raise ValueError(f"{name}: {c.stages} slots of {c.bk(fmt)} {fmt} columns at {bm} tokens need "
                         f"{c.smem_bytes(bm, fmt)} bytes of shared memory (> {SMEM_LIMIT}): raise split_k (fewer "
                         f"steps per program, so fewer slots) or lower block_k")
    steps = steps_per_program(c, fmt, k_padded)
    if c.stages < steps:
        raise ValueError(f"{name}: {c.stages} ring slots for {steps} K steps per program at K = {k_padded}: not "
                         f"prefetch-all (the last {steps - c.stages} steps load after the PDL wait); set stages = "
                         f"{steps} or raise split_k")


# {format: {(padded N, padded K): {M bucket (8: M 1..8, 16: M 9..16): config}}}: module doc. Filled from check
# `oprojpf` (2026-12-03, H200, benchmarks/results/oprojpf_h200_1203d_summary.json; 35 GPU tests passed): o_proj W4A4 /
# W4A16 at M = 16 nvfp4 1.48 -> 1.14 (pf_k256_split2, 0.77 of the shipped time), mxfp4 1.20 -> 1.07 (pf_k512_split2,
# 0.89). Bucket 8 stays empty: no candidate won at M = 1 (0.99-1.03 of the shipped time), though they did at M = 4 / 8.
W4A4_PDL_GRID: dict[str, dict[tuple[int, int], dict[int, GluonConfig]]] = {
    "nvfp4": {(4096, 4096): {16: PREFETCH_ALL_CANDIDATES["pf_k256_split2"][0]}},
    "mxfp4": {(4096, 4096): {16: PREFETCH_ALL_CANDIDATES["pf_k512_split2"][0]}},
}


def w4a4_pdl_config(M: int, fmt: str, n_padded: int, k_padded: int) -> GluonConfig | None:
    """The table's config for a W4A4 linear of M rows quantized by its own PDL launch on an [n_padded, k_padded]
    weight, or None (config_for's pick applies): only at M <= 16, for a listed shape and M bucket, where the
    config's step divides K."""
    if not 1 <= M <= 16:
        return None
    c = (W4A4_PDL_GRID.get(fmt) or {}).get((n_padded, k_padded), {}).get(m_bucket(M))
    return c if c is not None and k_padded % c.bk(fmt) == 0 else None


def shipped_w4a4_config(M: int, fmt: str, n_padded: int, k_padded: int) -> GluonConfig:
    """The config the W4A4 PDL path launches: the table's, else config_for's (what W4A16 runs)."""
    return w4a4_pdl_config(M, fmt, n_padded, k_padded) or config_for(M, fmt, k_padded, n_padded)


def same_partition(a: GluonConfig, b: GluonConfig, fmt: str, k_padded: int, split_b: int | None = None) -> bool:
    """Whether two configs split K into the same column ranges (then their results are bit-identical: module doc).
    `split_b`: b's launched split where b has none (SMALL_M's auto split)."""
    def cols(c, split):
        bk = c.bk(fmt)
        kb = k_padded // bk
        s, per = _evened_split(kb, split)
        return [(i * per * bk, min((i + 1) * per, kb) * bk) for i in range(s)]
    return cols(a, a.split_k) == cols(b, b.split_k or split_b or 1)
