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


# Per cache format, Qwen3 heads (128 dims; 4 or 8 KV heads, GQA 4-8), 64-token pages for quantized caches, and
# the programs per SM below which the context is split (`choose_splits`).
TILES = {
    "bf16": LaunchConfig(64, 4, 2, None, 96),
    "fp8_e4m3": LaunchConfig(128, 4, 1, None, 179),
    "nvfp4": LaunchConfig(128, 4, 3, 168, 168),
    "mxfp4": LaunchConfig(128, 4, 3, 168, 166),
}
SPLIT_BELOW_PROGRAMS_PER_SM = {"bf16": 2.0, "fp8_e4m3": 2.0, "nvfp4": 4.0, "mxfp4": 4.0}


def choose_splits(batch: int, kv_heads: int, capacity: int, block_t: int, sms: int,
                  programs_per_sm: float = 2.0) -> int:
    """Split the context only when B x kv heads programs cannot fill the GPU (>= programs_per_sm per SM);
    never below 4 tiles per split."""
    programs = batch * kv_heads
    want = max(1, -(-int(programs_per_sm * sms) // programs))
    return max(1, min(want, capacity // (4 * block_t)))


def launch_config(kv_format: str, batch: int, kv_heads: int, capacity: int, sms: int) -> tuple[LaunchConfig, int]:
    """(tile configuration, split count) for one decode step of `batch` sequences over a cache of `kv_heads`
    heads whose block tables hold `capacity` tokens (a static bound: no host sync, CUDA graphs)."""
    cfg = TILES[kv_format]
    return cfg, choose_splits(batch, kv_heads, capacity, cfg.block_t, sms, SPLIT_BELOW_PROGRAMS_PER_SM[kv_format])
