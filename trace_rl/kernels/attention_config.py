"""Launch configuration of the paged decode-attention kernel (trace_rl/kernels/paged_attention.py): the tile
(tokens per tile, warps, pipeline stages, register cap) per KV format, and the split-KV count per shape.

The numbers come from `benchmarks/attention_tune.py` on one H200 (raw results in
benchmarks/results/attention_tune_h200.json; docs/benchmarks.md, "Decode attention"). Pure Python: no Triton.
"""

from __future__ import annotations

from dataclasses import dataclass

REGISTERS_PER_SM = 65536


@dataclass(frozen=True)
class LaunchConfig:
    block_t: int                  # tokens per tile (the M of both MMAs)
    num_warps: int
    num_stages: int               # cp.async pipeline depth of the tile loop
    maxnreg: int | None           # register cap per thread (None: what ptxas needs)
    registers: int                # what the sm_90 build uses (Triton 3.6, attention_sass): sets CTAs per SM

    @property
    def ctas_per_sm(self) -> int:
        return max(1, REGISTERS_PER_SM // (32 * self.num_warps * self.registers))


# Per cache format, Qwen3 heads (128 dims; 4 or 8 KV heads, GQA 4-8), 64-token pages for quantized caches. H200
# sweep (benchmarks/attention_tune.py, results/attention_tune_h200.json; us at MoE 32/4 heads, 409 x 8192):
# - FP4: 128-token tiles, 4 warps, registers capped at 168 (3 CTAs per SM): nvfp4 709-750 us (0.61-0.65 of the
#   read ceiling) for 2-4 stages alike (within 1%); uncapped (214 registers, 2 CTAs) 966; 8 warps x 128
#   registers (4.2-4.4 SASS per element) 1259. 64-token tiles returned wrong results / an illegal address on the
#   GPU for FP4 caches (`decode_attention` refuses them there).
# - fp8: 2 cp.async stages with the 168 cap: 862-889 us (0.90-0.93) against 1575 (0.51) with one stage; 3 stages
#   876-905, uncapped 1020-1071.
TILES = {
    "bf16": LaunchConfig(64, 4, 2, None, 96),
    "fp8_e4m3": LaunchConfig(128, 4, 2, 168, 166),
    "nvfp4": LaunchConfig(128, 4, 3, 168, 168),
    "mxfp4": LaunchConfig(128, 4, 3, 168, 166),
}
# Below two waves of the capped fp8 tile (B x Hkv < 2 x SMs x 3) the uncapped one wins: MoE 128 x 8192 (512
# programs) 309 us against 336, 128 x 4096 159 against 173 (2 CTAs per SM fill their second wave).
SMALL_BATCH_TILES = {"fp8_e4m3": LaunchConfig(128, 4, 2, None, 185)}
# Fewer programs than this per SM: split the context to fill the GPU (FP4 at B x Hkv = 512: 2 splits 240 us
# against 277 with one; fp8 at 512 one split 309 against 318 with two, at 256 programs 158 against 162).
SPLIT_BELOW_PROGRAMS_PER_SM = {"bf16": 2.0, "fp8_e4m3": 1.0, "nvfp4": 4.0, "mxfp4": 4.0}
# Above two waves of resident CTAs the programs run in waves, and a last wave that is mostly empty costs a whole
# one (B x Hkv = 409 x 4 = 1636 programs on 132 SMs x 3 CTAs = 4.13 waves -> 5). A split count s costs
# ceil(P s / slots) waves of (tiles / s + SPLIT_OVERHEAD_TILES) tiles; the overhead (a split's prologue, its
# last partial tile, its share of the merge) is fitted to the sweep: it predicts nvfp4 at 409 x 8192 1 : 0.945 :
# 0.98 : 0.98 for 1-4 splits (measured 1 : 0.945 : 0.99 : 0.99), at 512 x 8192 1 : 0.96 : 1.0 : 1.0 (measured
# 1 : 0.97-0.98 : 1.01 : 1.02), at 512 x 4096 1 : 1.005 : 1.085 (measured 1 : 1.006 : 1.088).
SPLIT_OVERHEAD_TILES = 3.4
# bf16 keeps the fill rule only. Adding it here would change none of the measured bf16 cells (docs/benchmarks.md,
# run 3): B x Hkv = 100 x 8 = 800 programs is 1.2 waves of 5 CTAs per SM, below the model's two waves, and at
# B = 512 (6.2 waves, 257-1536 tokens) it picks one split, as now. Its overhead was fitted to the FP4 tiles; the
# memory-bound bf16 tile's is unknown. The engine times bf16 split counts instead (`split_variants`).
WAVE_SPLIT_FORMATS = ("fp8_e4m3", "nvfp4", "mxfp4")
# Split counts the engine times beside the launcher's choice (trace_rl/kv/cache.py, `candidates`).
TIMED_SPLITS = (1, 2, 3, 4)
TIMED_SPLIT_FORMATS = ("bf16",)          # the quantized formats' counts come from the measured wave model


def choose_splits(batch: int, kv_heads: int, capacity: int, block_t: int, sms: int,
                  programs_per_sm: float = 2.0, ctas_per_sm: int | None = None) -> int:
    """Split the context when B x kv heads programs cannot fill the GPU (>= programs_per_sm per SM); with
    `ctas_per_sm` and at least two waves of programs, pick 1-4 splits by the wave model above. Never below 4
    tiles per split."""
    programs = batch * kv_heads
    most = max(1, capacity // (4 * block_t))
    if ctas_per_sm is None or programs < 2 * sms * ctas_per_sm:
        want = max(1, -(-int(programs_per_sm * sms) // programs))
        return max(1, min(want, most))
    slots, tiles = sms * ctas_per_sm, -(-capacity // block_t)

    def cost(s: int) -> float:
        return -(-programs * s // slots) * (-(-tiles // s) + SPLIT_OVERHEAD_TILES)
    return min(range(1, min(4, most) + 1), key=cost)


def split_tokens(capacity: int, splits: int, block_t: int) -> tuple[int, int]:
    """(tokens per split, splits that launch) for `splits` requested over `capacity` tokens: whole tiles per
    split, so fewer may launch than were asked for (10 tiles in 4 splits: 3 tiles each, 4 splits; 12 in 5: 3 each,
    4 splits)."""
    tiles_per_split = -(-capacity // (splits * block_t))
    per_split = tiles_per_split * block_t
    return per_split, -(-capacity // per_split)


def launch_config(kv_format: str, batch: int, kv_heads: int, capacity: int, sms: int) -> tuple[LaunchConfig, int]:
    """(tile configuration, split count) for one decode step of `batch` sequences over a cache of `kv_heads`
    heads whose block tables hold `capacity` tokens (a static bound: no host sync, CUDA graphs)."""
    cfg = TILES[kv_format]
    if kv_format in SMALL_BATCH_TILES and batch * kv_heads < 2 * sms * cfg.ctas_per_sm:
        cfg = SMALL_BATCH_TILES[kv_format]
    waves = cfg.ctas_per_sm if kv_format in WAVE_SPLIT_FORMATS else None
    return cfg, choose_splits(batch, kv_heads, capacity, cfg.block_t, sms, SPLIT_BELOW_PROGRAMS_PER_SM[kv_format],
                              waves)


def split_variants(kv_format: str, batch: int, kv_heads: int, capacity: int, span: int, sms: int) -> list[int]:
    """Split counts (of TIMED_SPLITS) worth timing against the launcher's own choice for a step whose block
    tables hold `capacity` tokens and whose lengths are all <= `span`: the variant splits the span, not the
    capacity. Kept: at least 4 tiles per split, every split launched, and a launch other than the default one
    (one split is one split whatever the table; s splits of the whole table are the default when s is its count)."""
    if kv_format not in TIMED_SPLIT_FORMATS:
        return []
    cfg, default = launch_config(kv_format, batch, kv_heads, capacity, sms)
    span = min(span, capacity)
    out = []
    for s in TIMED_SPLITS:
        if s > max(1, span // (4 * cfg.block_t)) or split_tokens(span, s, cfg.block_t)[1] != s:
            continue
        if s == default and (s == 1 or span == capacity):
            continue
        out.append(s)
    return out
