"""The decode-attention launch policy (trace_rl/kernels/attention_config.py): one tile per format, splits only when
the sequences x KV heads cannot fill the GPU, never below 4 tiles per split."""

import pytest

from trace_rl.kernels.attention_config import SPLIT_BELOW_PROGRAMS_PER_SM, TILES, choose_splits, launch_config


@pytest.mark.parametrize("kv_format", sorted(TILES))
def test_launch_config_per_shape(kv_format):
    sms = 132
    cfg = TILES[kv_format]
    assert cfg.ctas_per_sm >= 1 and cfg.registers <= (cfg.maxnreg or 255)
    many = int(SPLIT_BELOW_PROGRAMS_PER_SM[kv_format] * sms)           # programs that fill the GPU alone
    for batch, kv_heads, capacity in ((512, 4, 8192), (many, 1, 8192), (32, 8, 32768), (1, 8, 8192), (3, 4, 256)):
        got, splits = launch_config(kv_format, batch, kv_heads, capacity, sms)
        assert got == cfg
        assert 1 <= splits <= max(1, capacity // (4 * cfg.block_t))
        if batch * kv_heads >= many:
            assert splits == 1
    assert launch_config(kv_format, 1, 8, 32768, sms)[1] > 1               # one sequence: split the context


def test_choose_splits_fills_the_gpu():
    assert choose_splits(32, 8, 32768, 128, 132, 4.0) == 3               # 256 programs -> ~4 per SM
    assert choose_splits(2, 8, 1024, 128, 132, 4.0) == 2                 # capped: 4 tiles per split
