"""Candidate launches of the Gluon grouped FP4 GEMM (fp4_grouped_gluon.py) for 25-32 rows per expert (B = 409-512
routed tokens at top-8 of 128 experts: issue 15's missed 2.5x over BF16 `torch._grouped_mm`). Timed against the
shipped tiles by benchmarks/moe512.py (check `moe512`); `tile_config` resolves their names, so TILE_RULE can take one
once the H200 has measured it faster (and bit-identical: none changes the arithmetic, only which program runs a
token tile and how many CTAs share an SM).

Why these (the shipped picks: 32 at B = 409, "64x64" at 512; fp4_grouped_gluon_schedule.program_tiles models the
tile deal):
- "32b": the 32-token tile (2 CTAs per SM, 16 consumer warps) in the `balanced` order: at B = 512 about half the
  experts hold 33-46 rows (two 32-token tiles), and the `expert` order deals the slowest program 11-12 tiles
  against a mean of 8.4 (balanced: 9);
- "32x64" / "32x64b": one consumer warpgroup of 64 weight rows x 32 tokens, 2 slots, 80 registers: 3 CTAs per SM
  (12 consumer warps) and twice the items, so the last round of tiles is half as long;
- "32x64o" / "32x64ob": the same with `overlap` (the next chunk decoded under the in-flight wgmma group; spill-free
  at 80 registers with one full wait per step): the 64-token tile gained 8% from it;
- "32d" (fp4_grouped_gluon_dual.py): tiles of up to 64 rows, each weight step decoded once and multiplied with the
  first 32 rows and, only where the tile has more, with the next 32 (a second accumulator and activation slot):
  every expert up to 64 rows decoded once (as the 64-token tiles) at the 32-token tile's MMA for experts up to 32
  rows; 2 slots, 2 CTAs per SM (103 KB), balanced order; B = 409 and 512 become one round of 1536 tiles (5.8 per
  program) instead of 6.2-8.4 32-token tiles;
- "64x64b" / mxfp4 "64b": the shipped 64-token picks in the balanced order (one tile per expert up to 64 rows: the
  order matters only for empty experts and past 64 rows; the control that the order itself costs nothing).
"""

from __future__ import annotations

from dataclasses import dataclass

from trace_rl.kernels.fp4_gemm_gluon_config import GluonConfig


@dataclass(frozen=True)
class GroupedGluonConfig(GluonConfig):
    """A GluonConfig plus the grouped kernel's tile order: `balanced` (fp4_grouped_gluon_schedule: the flat list of
    token tiles dealt round-robin, every program floor or ceil(tiles / programs)) instead of the shipped `expert`
    order (items of (expert, N tile); an item runs all its expert's token tiles)."""

    balanced: bool = False
    dual: bool = False      # fp4_grouped_gluon_dual: tiles of up to 2 x block_m rows, the second half's MMA only
                            # where the tile has more than block_m rows (a second activation slot per stage)

    def smem_bytes(self, block_m: int, fmt: str = "nvfp4") -> int:
        return super().smem_bytes(block_m, fmt) + (self.stages * block_m * self.bk(fmt) * 2 if self.dual else 0)


def _c(block_n, num_warps, maxnreg, block_m, stages, overlap=False, balanced=False, dual=False) -> GroupedGluonConfig:
    return GroupedGluonConfig(block_n=block_n, num_warps=num_warps, maxnreg=maxnreg, block_m=block_m, stages=stages,
                              overlap=overlap, balanced=balanced or dual, dual=dual)


GROUPED_CANDIDATES = {
    "nvfp4": {"32b": _c(128, 8, 80, 32, 3, balanced=True),
              "32x64": _c(64, 4, 80, 32, 2),
              "32x64b": _c(64, 4, 80, 32, 2, balanced=True),
              "32x64o": _c(64, 4, 80, 32, 2, overlap=True),
              "32x64ob": _c(64, 4, 80, 32, 2, overlap=True, balanced=True),
              "64x64b": _c(64, 4, 96, 64, 2, balanced=True),
              "32d": _c(128, 8, 80, 32, 2, dual=True)},
    "mxfp4": {"32b": _c(128, 8, 80, 32, 3, balanced=True),
              "32x64b": _c(64, 4, 80, 32, 2, balanced=True),
              "32x64ob": _c(64, 4, 80, 32, 2, overlap=True, balanced=True),
              "64b": _c(128, 8, 104, 64, 2, balanced=True),
              "32d": _c(128, 8, 80, 32, 2, dual=True)},
}

# Compile gate budgets (SASS per weight element of the K loop; Triton 3.6, sm_90): the balanced order adds nothing
# to the K loop (its prefix and lookup run per tile); measured nvfp4 2.73-2.80, mxfp4 2.39-2.45 (+ ~5%).
CANDIDATE_BUDGET = {"nvfp4": 2.95, "mxfp4": 2.6}
# dual configs: the gate counts their two-wgmma K loop (one decode, twice the HGMMA per chunk): measured nvfp4 3.11,
# mxfp4 2.76 (+ ~5%)
DUAL_BUDGET = {"nvfp4": 3.25, "mxfp4": 2.9}
