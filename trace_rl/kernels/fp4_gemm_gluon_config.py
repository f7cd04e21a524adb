"""Launch configurations of the Gluon FP4 GEMM (fp4_gemm_gluon.py): `GluonConfig`, the shipped configs (DEFAULT,
SMALL_M, WIDE, WIDE_OVERLAP), `config_for` and `auto_split`. Plain Python, importable without Gluon, so the small-M
dispatch rule (gemm_dispatch.py) and the benchmarks read the shipped config itself instead of a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def step_k(fmt: str) -> int:
    """Columns per K step by default: the scale tile [BN rows, 16 bytes] (TMA's minimum box width) covers 256 nvfp4
    columns (a byte per 16) or 512 mxfp4 columns (a byte per 32); a step is 2 or 4 decode chunks of 128."""
    if fmt == "nvfp4":
        return 256
    if fmt == "mxfp4":
        return 512
    raise ValueError(f"the Gluon FP4 GEMM takes nvfp4 or mxfp4 weights, got {fmt!r}")


def scale_words(fmt: str, bk: int) -> int:
    """int32 scale words per weight row and K step of `bk` columns: a byte per 16 nvfp4 / 32 mxfp4 columns."""
    return bk // (64 if fmt == "nvfp4" else 128)


@dataclass(frozen=True)
class GluonConfig:
    """One launch of the warp-specialised kernel: BN weight rows x `bk(fmt)` columns per K step (`block_k`, 0:
    `step_k(fmt)`; a multiple of it) against BM tokens (the smallest of 8 .. 128 covering M, at most `block_m`; a
    grid over token tiles beyond it), `stages` ring slots, `split_k` programs per N and token tile (0:
    `auto_split`), `num_warps` consumer warps (4 or 8: one or two warpgroups), `overlap` (one wgmma group in flight
    during the next decode), `maxnreg`, the per-thread register budget the kernel is compiled for (the producer
    hands all but 24 of its registers to the consumers with setmaxnreg; maxnreg x (num_warps + 4) x 32 bounds the
    CTAs per SM), and `fin`: the small-M kernel (`_fp4_gemm_ws_fin_kernel`: the fast split-K epilogue, W4A4 row
    scales, bias, programmatic dependent launch) instead of `_fp4_gemm_ws_kernel` (same bits at the same split)."""

    block_n: int = 128
    stages: int = 4
    split_k: int = 0
    num_warps: int = 4
    overlap: bool = False
    maxnreg: int = 128
    block_m: int = 16
    block_k: int = 0
    fin: bool = False

    def check(self, fmt: str = "nvfp4") -> None:
        if self.block_m not in TOKEN_TILES:
            raise ValueError(f"GluonConfig {self}: block_m must be one of {TOKEN_TILES} (the wgmma N)")
        if self.num_warps not in (4, 8) or self.block_n % (16 * self.num_warps) or self.block_n > 256:
            raise ValueError(f"GluonConfig {self}: num_warps must be 4 or 8 and block_n a multiple of 16 x num_warps "
                             f"(<= 256: a TMA box holds at most 256 rows)")
        if not 2 <= self.stages <= 8 or self.split_k < 0:
            raise ValueError(f"GluonConfig {self}: stages must be in 2..8 and split_k >= 0")
        if self.block_k and (self.block_k % step_k(fmt) or self.block_k > 1024):
            raise ValueError(f"GluonConfig {self}: block_k must be 0 or a multiple of {step_k(fmt)} up to 1024 for "
                             f"{fmt} (whole 16-byte scale boxes)")

    def bk(self, fmt: str) -> int:
        """Columns per K step for `fmt`."""
        return self.block_k or step_k(fmt)

    def tile_m(self, M: int) -> int:
        """Tokens per program: the smallest wgmma N of TOKEN_TILES covering M, capped at `block_m`."""
        return next((t for t in TOKEN_TILES if t >= min(M, self.block_m)), self.block_m)

    def smem_bytes(self, block_m: int, fmt: str = "nvfp4") -> int:
        bk = self.bk(fmt)
        return self.stages * (self.block_n * bk // 2 + self.block_n * scale_words(fmt, bk) * 4 +
                              block_m * bk * 2) + 1024

    def ctas_per_sm(self, block_m: int, fmt: str = "nvfp4") -> int:
        by_smem = (228 * 1024) // (self.smem_bytes(block_m, fmt) + 1024)   # 228 KB per SM, 1 KB reserved per CTA
        by_regs = 65536 // (self.maxnreg * (self.num_warps + 4) * 32)
        return max(1, min(by_smem, by_regs))


TOKEN_TILES = (8, 16, 32, 64, 128)
DEFAULT = GluonConfig()
# M <= 16, shipped (issue 15; benchmarks/gemm_compute_kernels.py "n64_k512", gemm_fixed_kernels.py "n64_fin" /
# "n64_fin_pdl", measured on the H200 against the first config, DEFAULT): 64-row tiles, 512-column K steps for
# both formats (four decode chunks per step: the per-step barriers, waits and slot release over twice DEFAULT's
# nvfp4 weights; the nvfp4 scale box is 32 bytes), a 2-slot ring, 80 registers, overlap: 3 CTAs per SM and twice
# the tiles, so the auto split spreads the weight more evenly over the SMs; `fin`: the fast split-K epilogue
# (fp4_gemm_gluon_epilogue) and, launched with `pdl=True`, programmatic dependent launch. K must pad to a multiple
# of 512 (`small_m_fits`); other K take DEFAULT.
SMALL_M = GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True, block_k=512, fin=True)
# M > 16 (wgmma N = 32 / 64 / 128: each decoded weight tile feeds BM tokens). The accumulator [64 rows, BM] fp32 is
# BM / 2 registers per thread, so the wide tiles take 64 weight rows per consumer warpgroup (two warpgroups, BN =
# 128), at the lowest gated register budget with headroom (ptxas serialises every wgmma below a floor: 72 / 96 /
# 120 at BM = 32 / 64 / 128, GATE_WIDE); the activation tile (BM x step_k bf16) dominates shared memory, which sets
# the ring depth: nvfp4 BM = 32 at 3 slots fits 2 CTAs per SM (~103 KB, 80 registers), the rest run 1 CTA per SM.
# mxfp4's 512-column steps double the activation tile: BM = 128 does not fit two slots (324 KB), so mxfp4 grids 64-
# token tiles over M > 64.
WIDE = {"nvfp4": {32: GluonConfig(num_warps=8, maxnreg=80, block_m=32, stages=3),
                  64: GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=4),
                  128: GluonConfig(num_warps=8, maxnreg=128, block_m=128, stages=2)},
        "mxfp4": {32: GluonConfig(num_warps=8, maxnreg=80, block_m=32, stages=3),
                  64: GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=2)}}
# overlap (the next chunk's decode under the in-flight wgmma group) at the wide tiles: needs more registers (both
# decoded operands live); 1 CTA per SM either way. Benchmark variants, gated.
WIDE_OVERLAP = {64: GluonConfig(num_warps=8, maxnreg=128, block_m=64, stages=4, overlap=True),
                128: GluonConfig(num_warps=8, maxnreg=168, block_m=128, stages=2, overlap=True)}
SMEM_LIMIT = 227 * 1024          # an sm_90 CTA's dynamic shared memory


# Small weights at M <= 16 (issue 15: "ahead of gemlite at every M"; 4096x1024 at M = 1, where SMALL_M's auto split
# 4 gives 16 row tiles x 4 = 64 programs of two 512-column steps on 132 SMs, and the time is latency: PDL prologue,
# the two steps' decode, the split-K finish). Candidates, measured against SMALL_M by benchmarks/smallm_sweep.py
# (check `smallm`); NOT selected by `config_for` until SMALL_GRID names one. The K partition (columns per program)
# alone sets the bits: a candidate with SMALL_M's partition (split 4 of 4096 columns) is bit-identical to it, the
# others differ in the split-K rounding only (each is bit-identical to `_fp4_gemm_ws_kernel` at its own split).
#   split8        one 512-column step per program: 128 programs, half the decode per warp, 8 partials per tile
#   split2        four steps per program: 32 programs, a 2-partial finish (the other side of the trade)
#   k256_split4   nvfp4: 256-column steps, 4 slots (all four steps in flight): SMALL_M's partition (same bits),
#                 the first wgmma after 256 columns instead of 512
#   k256_split8   nvfp4: 2 steps of 256 per program: split8's partition (same bits as split8), finer pipeline
#   k256_split16  nvfp4: one 256-column step per program: 256 programs (2 per SM), 16 partials per tile
#   w8_split8     two consumer warpgroups x 128 rows, one 512-column step: 64 programs (split8's partition, same
#                 bits as split8), half the SMs free for the next PDL GEMM's prefetch
# (fmts: the formats a candidate applies to; mxfp4's K step is at least 512 columns.)
SMALL_GRID_CANDIDATES = {
    "split8": (GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True, block_k=512, fin=True, split_k=8),
               ("nvfp4", "mxfp4")),
    "split2": (GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True, block_k=512, fin=True, split_k=2),
               ("nvfp4", "mxfp4")),
    "k256_split4": (GluonConfig(block_n=64, stages=4, maxnreg=80, overlap=True, block_k=256, fin=True, split_k=4),
                    ("nvfp4", )),
    "k256_split8": (GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True, block_k=256, fin=True, split_k=8),
                    ("nvfp4", )),
    "k256_split16": (GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True, block_k=256, fin=True,
                                 split_k=16), ("nvfp4", )),
    "w8_split8": (GluonConfig(block_n=128, num_warps=8, stages=2, maxnreg=80, overlap=True, block_k=512, fin=True,
                              split_k=8), ("nvfp4", "mxfp4")),
    # Larger weights (Qwen3-8B's 4096x4096 / 4096x6144 / 4096x12288 / 12288x4096, K x N; check `smallwide`), where
    # SMALL_M's auto split already fills the 3 CTAs per SM (384 programs at 4096x12288, split 2; 12288x4096, split
    # 6): other splits trade a second wave against fewer / more partials; 256-column steps (4 slots: 1024 columns in
    # flight, SMALL_M's bytes) a finer pipeline at SMALL_M's partition (k256_split2 at 4096x12288, k256_split6 at
    # 12288x4096: same bits as SMALL_M there); two warpgroups x 128 rows half the programs of the same partition.
    "split3": (GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True, block_k=512, fin=True, split_k=3),
               ("nvfp4", "mxfp4")),
    "split4": (GluonConfig(block_n=64, stages=2, maxnreg=80, overlap=True, block_k=512, fin=True, split_k=4),
               ("nvfp4", "mxfp4")),
    "k256_split2": (GluonConfig(block_n=64, stages=4, maxnreg=80, overlap=True, block_k=256, fin=True, split_k=2),
                    ("nvfp4", )),
    "k256_split3": (GluonConfig(block_n=64, stages=4, maxnreg=80, overlap=True, block_k=256, fin=True, split_k=3),
                    ("nvfp4", )),
    "k256_split6": (GluonConfig(block_n=64, stages=4, maxnreg=80, overlap=True, block_k=256, fin=True, split_k=6),
                    ("nvfp4", )),
    "w8_split2": (GluonConfig(block_n=128, num_warps=8, stages=2, maxnreg=80, overlap=True, block_k=512, fin=True,
                              split_k=2), ("nvfp4", "mxfp4")),
    "w8_split4": (GluonConfig(block_n=128, num_warps=8, stages=2, maxnreg=80, overlap=True, block_k=512, fin=True,
                              split_k=4), ("nvfp4", "mxfp4")),
    # M = 16 on the large weights (issue 15: nvfp4 2.02-2.07x cuBLAS at M = 16 with every candidate above, target
    # 2.2x; check `m16`). SMALL_M and the k256 candidates run 3 CTAs per SM (80 registers x 8 warps; k256's 4 slots
    # ~70 KB at 16 tokens); these trade ring depth for more independent decode -> wgmma pipelines per SM, 256-column
    # steps (a 512-column slot alone is 34 KB at 16 tokens):
    #   q_split*    3 slots (52 KB at 16 tokens) and 64 registers (8 warps x 64 x 4 CTAs = 64K; the consumers get
    #               104 through setmaxnreg, spill-free with overlap): 4 CTAs per SM. K partitions: q_split2 at
    #               4096x12288 and q_split6 at 12288x4096 are SMALL_M's auto split there (same bits as shipped),
    #               q_split3 / q_split8 are split3's / split8's
    #   qn_split8   q_split8 on an 8-token wgmma N (block_m 8): M = 9..16 runs two token tiles (twice the programs,
    #               half the accumulator and activation slot each) instead of one 16-token tile
    #   p5_split*   2 slots (35 KB), 48 registers (consumers 72), no overlap (at 48 overlap serialises every
    #               wgmma): 5 CTAs per SM
    # (A narrower weight-row tile than 64 is not a config: one consumer warpgroup is one 64-row wgmma.)
    "q_split2": (GluonConfig(block_n=64, stages=3, maxnreg=64, overlap=True, block_k=256, fin=True, split_k=2),
                 ("nvfp4", )),
    "q_split3": (GluonConfig(block_n=64, stages=3, maxnreg=64, overlap=True, block_k=256, fin=True, split_k=3),
                 ("nvfp4", )),
    "q_split6": (GluonConfig(block_n=64, stages=3, maxnreg=64, overlap=True, block_k=256, fin=True, split_k=6),
                 ("nvfp4", )),
    "q_split8": (GluonConfig(block_n=64, stages=3, maxnreg=64, overlap=True, block_k=256, fin=True, split_k=8),
                 ("nvfp4", )),
    "qn_split8": (GluonConfig(block_n=64, stages=3, maxnreg=64, overlap=True, block_k=256, fin=True, split_k=8,
                              block_m=8), ("nvfp4", )),
    "p5_split3": (GluonConfig(block_n=64, stages=2, maxnreg=48, block_k=256, fin=True, split_k=3), ("nvfp4", )),
    "p5_split8": (GluonConfig(block_n=64, stages=2, maxnreg=48, block_k=256, fin=True, split_k=8), ("nvfp4", )),
}
# The M = 16 candidates (check `m16`), gated at 16 tokens besides 8.
M16_CANDIDATES = ("q_split2", "q_split3", "q_split6", "q_split8", "qn_split8", "p5_split3", "p5_split8")
# The rule `config_for` applies at M <= 16: per format, {weight class: {M bucket: config}}. A weight class is
# (min rows, max rows, K): a weight of padded rows in [min, max] and exactly K padded columns (the measured shapes
# only: no extrapolation to other K or rows); classes of a format must not overlap. M bucket 8 covers M = 1..8, 16
# covers M = 9..16 (M_BUCKETS); a missing bucket or class: SMALL_M, unchanged. A config applies only where its K
# step divides K. Filled from the `smallm` / `smallwide` checks' summary.json ("rule_proposal": its SMALL_GRID line
# is this dict as Python).
# Set from the H200 run of 2026-12-02 (`benchmarks/results/smallm_h200_1202f_summary.json`, 4096x1024 = K x N, graph
# medians, two rounds, each candidate won every round): nvfp4 k256_split16 0.72-0.78 of the shipped time at M = 1 / 4 /
# 16 (W4A16 and W4A4), 1.22x gemlite at M = 1 (shipped: 0.94x); mxfp4 split8 0.93-0.95 at M = 1 / 4, 1.06x gemlite at
# M = 1; at M = 16 no mxfp4 candidate won. Bits differ from SMALL_M's by the split-K partition only (deterministic).
# The larger classes from check `smallwide` (`benchmarks/results/smallwide_h200_1202f_summary.json`, same method, every
# winner <= 0.98 of the shipped time in every round at W4A16 and W4A4): nvfp4 N = 12288 x K = 4096 k256_split2 at M <= 8
# (0.96; SMALL_M's partition there, so the same bits: 2.17-2.20x -> 2.23-2.28x cuBLAS), N = 6144 k256_split2 (0.95),
# N = 4096 k256_split3 (0.92-0.93); mxfp4 N = 6144 split2 (0.93-0.95), N = 4096 split3 at M <= 8 (0.91).
M_BUCKETS = (8, 16)
SMALL_GRID: dict[str, dict[tuple[int, int, int], dict[int, GluonConfig]]] = {
    "nvfp4": {(1, 1024, 4096): {8: SMALL_GRID_CANDIDATES["k256_split16"][0],
                                16: SMALL_GRID_CANDIDATES["k256_split16"][0]},
              (12288, 12288, 4096): {8: SMALL_GRID_CANDIDATES["k256_split2"][0]},
              (6144, 6144, 4096): {8: SMALL_GRID_CANDIDATES["k256_split2"][0],
                                   16: SMALL_GRID_CANDIDATES["k256_split2"][0]},
              (4096, 4096, 4096): {8: SMALL_GRID_CANDIDATES["k256_split3"][0],
                                   16: SMALL_GRID_CANDIDATES["k256_split3"][0]}},
    "mxfp4": {(1, 1024, 4096): {8: SMALL_GRID_CANDIDATES["split8"][0]},
              (6144, 6144, 4096): {8: SMALL_GRID_CANDIDATES["split2"][0],
                                   16: SMALL_GRID_CANDIDATES["split2"][0]},
              (4096, 4096, 4096): {8: SMALL_GRID_CANDIDATES["split3"][0]}},
}


def m_bucket(M: int) -> int:
    """SMALL_GRID's M bucket of M <= 16 tokens: 8 (M = 1..8, token tile 8) or 16 (M = 9..16, token tile 16)."""
    return next(b for b in M_BUCKETS if M <= b)


# M = 64 (issue 15: W4A16 >= 1.6x cuBLAS BF16 at 4096x12288 and 12288x4096; WIDE's 64-token tile: 1.29-1.33x). What
# the grid does at M = 64 on 132 SMs (BM 64 = one token tile; nvfp4 256-column steps, mxfp4 512):
#   WIDE 64: 128 rows (two warpgroups), 1 CTA per SM (104 registers x 12 warps; nvfp4 4 slots = 201 KB, mxfp4 2 =
#   197 KB); 4096x12288: 96 row tiles, auto split 1 -> 96 programs on 132 SMs (27% of the SMs idle), 16 / 8 steps;
#   12288x4096: 32 row tiles, auto split 4 -> 128 programs, 12 / 6 steps each. One decode + MMA pipeline per SM.
# The kernel is not bytes-bound there (5.3 us of FP4 against 22-24 us): the candidates trade fill and the number of
# independent pipelines per SM (latency hiding of the decode -> wgmma chain) against split-K traffic and decode:
#   wide_split2 / wide_split4   WIDE at a fixed split: 4096x12288 -> 192 / 384 programs (1.5 / 2.9 waves of 4 / 8
#                               steps), 12288x4096 split 2 -> 64 programs of 24 steps (the other side)
#   wide_fin                    WIDE on the fin kernel (fast split-K epilogue; same bits at the same split)
#   wide_overlap                nvfp4: WIDE_OVERLAP's 64-token tile (128 registers, the decode under the wgmma)
#   wide_overlap_s2             mxfp4: the same with 2 slots (4 do not fit mxfp4's 64 KB activation slots)
#   wide_k512                   nvfp4: WIDE at 512-column steps, 2 slots (SMALL_M's step): half the per-step
#                               barriers, waits and slot releases per weight (mxfp4's step is 512 already)
#   n64_w4                      64 rows, one consumer warpgroup, 2 slots, 128 registers: nvfp4 2 CTAs per SM (86 KB
#                               each, 128 x 8 warps x 32): two independent pipelines per SM, 192 programs at
#                               4096x12288, auto split 4 (256 programs) at 12288x4096; mxfp4 1 CTA per SM (166 KB)
#   n64_w4_split2 / _split4     n64_w4 at a fixed split: 4096x12288 nvfp4 -> 384 / 768 programs of 8 / 4 steps over
#                               264 resident slots (at most 3 / 6 per SM: 3/4 of wide's 128 x 16-step critical
#                               path, + the partials); mxfp4 split 2 -> 384 programs of 4 steps at 1 CTA per SM
#   n64_w4_overlap              the same with overlap
#   bm32x2                      WIDE's 32-token tile over two token tiles (2 CTAs per SM, 80 registers): twice the
#                               decode, twice the programs
# Every candidate is `_fp4_gemm_ws_kernel` (or its fin twin) at its split: the bits depend on the K partition only
# (tests/kernels/test_fp4_gemm_gluon_m64.py checks each against WIDE at the same split). fmts: where it applies.
M64_CANDIDATES = {
    "wide_split2": (GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=4, split_k=2), ("nvfp4", )),
    "wide_split4": (GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=4, split_k=4), ("nvfp4", )),
    "mx_wide_split2": (GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=2, split_k=2), ("mxfp4", )),
    "mx_wide_split4": (GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=2, split_k=4), ("mxfp4", )),
    "wide_fin": (GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=4, fin=True), ("nvfp4", )),
    "mx_wide_fin": (GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=2, fin=True), ("mxfp4", )),
    "wide_overlap": (GluonConfig(num_warps=8, maxnreg=128, block_m=64, stages=4, overlap=True), ("nvfp4", )),
    "wide_k512": (GluonConfig(num_warps=8, maxnreg=104, block_m=64, stages=2, block_k=512), ("nvfp4", )),
    "wide_overlap_s2": (GluonConfig(num_warps=8, maxnreg=128, block_m=64, stages=2, overlap=True), ("mxfp4", )),
    "n64_w4": (GluonConfig(block_n=64, num_warps=4, maxnreg=128, block_m=64, stages=2), ("nvfp4", "mxfp4")),
    "n64_w4_split2": (GluonConfig(block_n=64, num_warps=4, maxnreg=128, block_m=64, stages=2, split_k=2),
                      ("nvfp4", "mxfp4")),
    "n64_w4_split4": (GluonConfig(block_n=64, num_warps=4, maxnreg=128, block_m=64, stages=2, split_k=4),
                      ("nvfp4", )),
    "n64_w4_overlap": (GluonConfig(block_n=64, num_warps=4, maxnreg=128, block_m=64, stages=2, overlap=True),
                       ("nvfp4", "mxfp4")),
    "bm32x2": (GluonConfig(num_warps=8, maxnreg=80, block_m=32, stages=3), ("nvfp4", "mxfp4")),
}
# The rule `config_for` applies at 32 < M <= 64: per format, {(padded N, padded K) or None (every shape): config}.
# Empty (the default): WIDE's 64-token tile, unchanged. Filled from the `m64` check's summary.json
# ("rule_proposal"), e.g. {"nvfp4": {(12288, 4096): M64_CANDIDATES["n64_w4"][0]}}.
# Set from the H200 run of 2026-12-02 (`benchmarks/results/m64_h200_1202f_summary.json`, graph medians, two rounds, each
# pick won every round): N = 12288 x K = 4096 nvfp4 wide_overlap 21.7 us = 1.33x cuBLAS (WIDE 1.21x), mxfp4
# wide_overlap_s2 1.35x (1.32x); N = 4096 x K = 12288 n64_w4 1.46x / 1.43x (1.26x / 1.33x). Issue 15's 1.6x is not
# reached. The shipped fp4_linear takes these (on the fin kernel: `mid_m_config`) only for the weights
# gemm_dispatch.GLUON_MID_M lists (check `midm`); elsewhere they are what the Gluon path gives when called directly.
M64_GRID: dict[str, dict[tuple[int, int] | None, GluonConfig]] = {
    "nvfp4": {(12288, 4096): M64_CANDIDATES["wide_overlap"][0], (4096, 12288): M64_CANDIDATES["n64_w4"][0]},
    "mxfp4": {(12288, 4096): M64_CANDIDATES["wide_overlap_s2"][0], (4096, 12288): M64_CANDIDATES["n64_w4"][0]},
}


def m64_grid_config(M: int, fmt: str, n_padded: int | None, k_padded: int | None) -> GluonConfig | None:
    """M64_GRID's config for M tokens on an [n_padded, k_padded] weight (that shape's entry, else the None entry),
    or None (WIDE applies): only at 32 < M <= 64 and where the config's K step divides k_padded."""
    tiles = M64_GRID.get(fmt) or {}
    if not 32 < M <= 64 or not tiles:
        return None
    c = tiles.get((n_padded, k_padded), tiles.get(None))
    return c if c is not None and (k_padded is None or k_padded % c.bk(fmt) == 0) else None


def mid_m_config(M: int, fmt: str, n_padded: int | None = None, k_padded: int | None = None) -> GluonConfig:
    """The config `fp4_linear` launches at 16 < M <= gemm_dispatch.MID_M_LIMIT where gemm_dispatch.GLUON_MID_M sends
    it to Gluon: `config_for`'s choice (WIDE's token tile, or M64_GRID's pick at 32 < M <= 64) on the `fin` kernel,
    which takes the W4A4 row scale, the bias and programmatic dependent launch as the small-M path does (the same
    main loop; the fast split-K finish gives the same bits as `_finish` at the same split)."""
    if M <= 16:
        raise ValueError(f"mid_m_config: M = {M}; M <= 16 takes config_for's small-M config")
    return replace(config_for(M, fmt, k_padded, n_padded), fin=True)


def small_m_fits(k_padded: int, fmt: str) -> bool:
    """Whether SMALL_M's K step divides the weight's padded K (its scale rows must also be 16-byte aligned)."""
    return k_padded % SMALL_M.bk(fmt) == 0


def small_grid_class(fmt: str, n_padded: int, k_padded: int) -> tuple[int, int, int] | None:
    """The SMALL_GRID weight class (min rows, max rows, K) of an [n_padded, k_padded] weight, or None."""
    return next((key for key in SMALL_GRID.get(fmt) or {}
                 if key[2] == k_padded and key[0] <= n_padded <= key[1]), None)


def small_grid_config(M: int, fmt: str, n_padded: int | None, k_padded: int | None) -> GluonConfig | None:
    """SMALL_GRID's config for M tokens on an [n_padded, k_padded] weight, or None (SMALL_M applies): only at
    M <= 16, for a weight in one of the format's classes, at an M bucket the class names, where the config's step
    divides K."""
    if M > 16 or n_padded is None or k_padded is None:
        return None
    key = small_grid_class(fmt, n_padded, k_padded)
    c = SMALL_GRID[fmt][key].get(m_bucket(M)) if key is not None else None
    return c if c is not None and k_padded % c.bk(fmt) == 0 else None


def config_for(M: int, fmt: str = "nvfp4", k_padded: int | None = None,
               n_padded: int | None = None) -> GluonConfig:
    """SMALL_M at M <= 16 (SMALL_GRID's config for a small weight where one is set, `small_grid_config`; DEFAULT
    where `k_padded` is given and SMALL_M's K step does not divide it), else the format's WIDE config for the
    smallest token tile covering M (the largest one past it: a grid over token tiles; M64_GRID's config where one
    is set at 32 < M <= 64, `m64_grid_config`)."""
    if M <= 16:
        small = small_grid_config(M, fmt, n_padded, k_padded)
        if small is not None:
            return small
        return SMALL_M if k_padded is None or small_m_fits(k_padded, fmt) else DEFAULT
    m64 = m64_grid_config(M, fmt, n_padded, k_padded)
    if m64 is not None:
        return m64
    tiles = WIDE[fmt]
    return tiles[next((t for t in sorted(tiles) if t >= M), max(tiles))]


def auto_split(n_tiles: int, kb: int, ctas: int) -> int:
    """The largest split keeping every program resident at once (n_tiles x split <= `ctas` = SMs x CTAs per SM)
    and >= 2 K steps per program: each program's ring keeps STAGES steps in flight, so a second wave would only
    add a pipeline fill."""
    split = 1
    while n_tiles * (split + 1) <= ctas and kb // (split + 1) >= 2:
        split += 1
    return _cdiv(kb, _cdiv(kb, split))       # no empty split
