"""The decode-attention launch policy (trace_rl/kernels/attention_config.py): one tile per format; splits fill the GPU
when the sequences x KV heads cannot, follow the wave model when they can; never below 4 tiles per split."""

import pytest

from trace_rl.kernels.attention_config import (
    SMALL_BATCH_TILES,
    SPLIT_BELOW_PROGRAMS_PER_SM,
    TILES,
    WAVE_SPLIT_FORMATS,
    choose_splits,
    launch_config,
    split_tokens,
    split_variants,
)


@pytest.mark.parametrize("kv_format", sorted(TILES))
def test_launch_config_per_shape(kv_format):
    sms = 132
    cfg = TILES[kv_format]
    assert cfg.ctas_per_sm >= 1 and cfg.registers <= (cfg.maxnreg or 255)
    for batch, kv_heads, capacity in ((512, 4, 8192), (409, 4, 4096), (32, 8, 32768), (1, 8, 8192), (3, 4, 256)):
        got, splits = launch_config(kv_format, batch, kv_heads, capacity, sms)
        programs = batch * kv_heads
        small = programs < 2 * sms * cfg.ctas_per_sm
        assert got == (SMALL_BATCH_TILES.get(kv_format, cfg) if small else cfg)
        assert 1 <= splits <= max(1, capacity // (4 * got.block_t))
        if programs < 2 * sms * got.ctas_per_sm or kv_format not in WAVE_SPLIT_FORMATS:
            fill = -(-int(SPLIT_BELOW_PROGRAMS_PER_SM[kv_format] * sms) // programs)
            assert splits == max(1, min(fill, capacity // (4 * got.block_t)))
        else:
            assert splits <= 4
    assert launch_config(kv_format, 1, 8, 32768, sms)[1] > 1               # one sequence: split the context


def test_split_counts_measured_on_the_h200():
    """The wave model picks what the sweep measured fastest (benchmarks/results/attention_tune_h200.json)."""
    assert launch_config("nvfp4", 409, 4, 8192, 132)[1] == 2               # 709 us against 750 with one split
    assert launch_config("nvfp4", 512, 4, 4096, 132)[1] == 1               # 465 against 468 (2) and 506 (3)
    assert launch_config("nvfp4", 128, 4, 8192, 132)[1] == 2               # 240 against 277
    assert launch_config("fp8_e4m3", 128, 4, 8192, 132) == (SMALL_BATCH_TILES["fp8_e4m3"], 1)   # 309 against 318
    assert launch_config("fp8_e4m3", 409, 4, 8192, 132) == (TILES["fp8_e4m3"], 2)               # 862 against 889


def test_choose_splits_fills_the_gpu():
    assert choose_splits(32, 8, 32768, 128, 132, 4.0) == 3               # 256 programs -> ~4 per SM
    assert choose_splits(2, 8, 1024, 128, 132, 4.0) == 2                 # capped: 4 tiles per split
    assert choose_splits(4096, 8, 8192, 128, 132, 4.0) == 1              # no wave model: the fill rule


def test_split_tokens_whole_tiles():
    assert split_tokens(8448, 1, 64) == (8448, 1)
    assert split_tokens(640, 4, 64) == (192, 4)                          # 10 tiles: 3 + 3 + 3 + 1
    assert split_tokens(768, 5, 64) == (192, 4)                          # 12 tiles in 5: 3 each, 4 launch


def test_split_variants_time_what_the_launcher_would_not_run():
    """bf16, Qwen3-8B KV heads, 132 SMs. B = 100 (the issue-16 cells, one split by default): 2-4 splits of the
    span; short spans keep 4 tiles per split; other formats follow the measured wave model (none)."""
    assert launch_config("bf16", 100, 8, 8448, 132)[1] == 1
    assert split_variants("bf16", 100, 8, 8448, 8448, 132) == [2, 3, 4]
    assert split_variants("bf16", 100, 8, 8448, 4608, 132) == [2, 3, 4]    # L = 4352: splits of its bucket
    assert split_variants("bf16", 100, 8, 8448, 512, 132) == [2]           # 8 tiles: 2 splits of 4
    assert split_variants("bf16", 100, 8, 8448, 256, 132) == []            # 4 tiles: one split, the default
    assert split_variants("bf16", 1, 8, 8448, 512, 132) == [1, 2]          # the default splits the table 33 ways
    assert launch_config("bf16", 11, 8, 8448, 132)[1] == 3                 # 88 programs: 3 splits fill the GPU
    assert split_variants("bf16", 11, 8, 8448, 8448, 132) == [1, 2, 4]     # 3 of the whole table is the default
    assert split_variants("bf16", 11, 8, 8448, 4608, 132) == [1, 2, 3, 4]  # 3 of the span is not
    for kv_format in ("fp8_e4m3", "nvfp4", "mxfp4"):
        assert split_variants(kv_format, 100, 8, 8448, 8448, 132) == []
