"""Launch configurations of the Gluon FP4 GEMM (fp4_gemm_gluon.py): `GluonConfig`, the shipped configs (DEFAULT,
SMALL_M, WIDE, WIDE_OVERLAP), `config_for` and `auto_split`. Plain Python, importable without Gluon, so the small-M
dispatch rule (gemm_dispatch.py) and the benchmarks read the shipped config itself instead of a copy.
"""

from __future__ import annotations

from dataclasses import dataclass


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


def small_m_fits(k_padded: int, fmt: str) -> bool:
    """Whether SMALL_M's K step divides the weight's padded K (its scale rows must also be 16-byte aligned)."""
    return k_padded % SMALL_M.bk(fmt) == 0


def config_for(M: int, fmt: str = "nvfp4", k_padded: int | None = None) -> GluonConfig:
    """SMALL_M at M <= 16 (DEFAULT where `k_padded` is given and SMALL_M's K step does not divide it), else the
    format's WIDE config for the smallest token tile covering M (the largest one past it: a grid over token
    tiles)."""
    if M <= 16:
        return SMALL_M if k_padded is None or small_m_fits(k_padded, fmt) else DEFAULT
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
