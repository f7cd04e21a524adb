"""CPU: the prefetch-all configs of the Gluon FP4 GEMM for o_proj's W4A4 PDL path (fp4_gemm_gluon_prefetch.py) and
the attention's launch_dependents switch (issue 15's o_proj miss; GPU: test_oproj_prefetch_gpu.py, check `oprojpf`):
- every candidate is a valid `fin` config that fits an sm_90 CTA at 16 tokens and holds all of a program's K steps at
  o_proj's K = 4096 (`check_prefetch_all`), and the check says what is wrong otherwise;
- the K partitions (bits) of the candidates against the shipped o_proj configs;
- the table `W4A4_PDL_GRID` is read only where it applies (M <= 16, listed shape and bucket, step divides K) and only
  on fp4_linear's W4A4 path with its own PDL quantize (`w4a4_pdl_gemm_config`); W4A16 never reads it;
- the attention configs and the Triton attention signal launch_dependents by default."""

from dataclasses import replace

import pytest
import torch

from trace_rl.kernels import fp4_gemm_gluon_prefetch as pf
from trace_rl.kernels import linear
from trace_rl.kernels.fp4_gemm_gluon_config import SMALL_GRID_CANDIDATES, SMALL_M, GluonConfig, config_for
from trace_rl.kernels.fp4_gemm_gluon_prefetch import (
    PREFETCH_ALL_CANDIDATES,
    check_prefetch_all,
    prefetches_all,
    same_partition,
    steps_per_program,
    w4a4_pdl_config,
)
from trace_rl.kernels.hopper_fp4 import padded_shape

CASES = [(name, fmt) for name, (_, fmts) in PREFETCH_ALL_CANDIDATES.items() for fmt in fmts]


@pytest.mark.parametrize("name,fmt", CASES)
def test_candidates_prefetch_all_of_o_proj(name, fmt):
    c, _ = PREFETCH_ALL_CANDIDATES[name]
    for _n, k in pf.PREFETCH_ALL_SHAPES:
        check_prefetch_all(name, c, fmt, k)
        assert prefetches_all(c, fmt, k) and c.stages == steps_per_program(c, fmt, k), "no slot left idle"


def test_steps_per_program():
    cand = {n: c for n, (c, _) in PREFETCH_ALL_CANDIDATES.items()}
    assert steps_per_program(cand["pf_k256_split2"], "nvfp4", 4096) == 8
    assert steps_per_program(cand["pf_k256_split3"], "nvfp4", 4096) == 6
    assert steps_per_program(cand["pf_k512_split3"], "mxfp4", 4096) == 3
    assert steps_per_program(cand["pf_k512_split2"], "nvfp4", 4096) == 4
    # the shipped o_proj configs leave steps behind the wait: nvfp4 k256_split3 6 steps / 4 slots, mxfp4 split3 3 / 2
    assert not prefetches_all(config_for(1, "nvfp4", 4096, 4096), "nvfp4", 4096)
    assert not prefetches_all(config_for(1, "mxfp4", 4096, 4096), "mxfp4", 4096)
    assert steps_per_program(cand["pf_k256_split3"], "nvfp4", 1536) == 2          # 6 steps over split 3
    with pytest.raises(ValueError, match="explicit split_k"):
        steps_per_program(SMALL_M, "nvfp4", 4096)


def test_check_prefetch_all_says_what_is_wrong():
    base = dict(block_n=64, maxnreg=80, overlap=True, fin=True)
    with pytest.raises(ValueError, match="shared memory.*raise split_k"):      # 8 x 34 KB slots at 16 tokens
        check_prefetch_all("big", GluonConfig(stages=8, block_k=512, split_k=1, **base), "nvfp4", 4096)
    with pytest.raises(ValueError, match="not prefetch-all.*set stages = 6"):
        check_prefetch_all("short", GluonConfig(stages=4, block_k=256, split_k=3, **base), "nvfp4", 4096)
    with pytest.raises(ValueError, match="`fin` config"):
        check_prefetch_all("plain", GluonConfig(stages=4, block_k=256, split_k=4, block_n=64), "nvfp4", 4096)
    with pytest.raises(ValueError, match="does not divide K"):
        check_prefetch_all("odd", GluonConfig(stages=4, block_k=512, split_k=2, **base), "nvfp4", 1280)
    with pytest.raises(ValueError, match="block_k must be"):                   # mxfp4's step is 512 columns
        check_prefetch_all("mx256", GluonConfig(stages=8, block_k=256, split_k=2, **base), "mxfp4", 4096)


def test_k_partitions_against_the_shipped_o_proj_configs():
    cand = {n: c for n, (c, _) in PREFETCH_ALL_CANDIDATES.items()}
    nv, mx = config_for(1, "nvfp4", 4096, 4096), config_for(1, "mxfp4", 4096, 4096)    # k256_split3 / split3
    assert nv == SMALL_GRID_CANDIDATES["k256_split3"][0] and mx == SMALL_GRID_CANDIDATES["split3"][0]
    assert same_partition(cand["pf_k256_split3"], nv, "nvfp4", 4096)
    assert same_partition(cand["pf_k512_split3"], nv, "nvfp4", 4096)
    assert same_partition(cand["pf_k512_split3"], mx, "mxfp4", 4096)
    assert not same_partition(cand["pf_k256_split2"], nv, "nvfp4", 4096)
    assert same_partition(cand["pf_k256_split2"], cand["pf_k512_split2"], "nvfp4", 4096)
    assert same_partition(cand["split4"], SMALL_M, "mxfp4", 4096, split_b=4)   # mxfp4 M 9..16: auto split 4
    assert not same_partition(cand["split4"], SMALL_M, "mxfp4", 4096, split_b=3)


def test_committed_table_holds_gated_candidates():
    assert set(pf.W4A4_PDL_GRID) == {"nvfp4", "mxfp4"}
    for fmt, shapes in pf.W4A4_PDL_GRID.items():
        for (_n, k), tiles in shapes.items():
            assert set(tiles) <= {8, 16}
            for c in tiles.values():
                name = next(nm for nm, (cc, f) in PREFETCH_ALL_CANDIDATES.items() if cc == c and fmt in f)
                check_prefetch_all(name, c, fmt, k)


def test_table_applies_only_where_it_names_a_config(monkeypatch):
    c2, c3 = PREFETCH_ALL_CANDIDATES["pf_k256_split2"][0], PREFETCH_ALL_CANDIDATES["pf_k512_split3"][0]
    monkeypatch.setattr(pf, "W4A4_PDL_GRID", {"nvfp4": {(4096, 4096): {8: c2, 16: c3}}, "mxfp4": {}})
    assert w4a4_pdl_config(1, "nvfp4", 4096, 4096) == w4a4_pdl_config(8, "nvfp4", 4096, 4096) == c2
    assert w4a4_pdl_config(9, "nvfp4", 4096, 4096) == w4a4_pdl_config(16, "nvfp4", 4096, 4096) == c3
    assert w4a4_pdl_config(17, "nvfp4", 4096, 4096) is None                  # past the small-M path
    assert w4a4_pdl_config(1, "nvfp4", 4096, 12288) is None                  # shape not listed
    assert w4a4_pdl_config(1, "mxfp4", 4096, 4096) is None                   # format not listed
    assert pf.shipped_w4a4_config(1, "mxfp4", 4096, 4096) == config_for(1, "mxfp4", 4096, 4096)
    monkeypatch.setattr(pf, "W4A4_PDL_GRID", {"nvfp4": {(4096, 1280): {8: c3}}, "mxfp4": {}})
    assert w4a4_pdl_config(1, "nvfp4", 4096, 1280) is None                   # 512-column step does not divide K


def _packed(N, K, fmt):
    from trace_rl.backends import get_backend

    return get_backend("fp4").prepare_weight(torch.randn(N, K) / K ** 0.5, fmt)


def test_w4a4_pdl_gemm_config_only_on_the_pdl_path(monkeypatch):
    p = _packed(128, 512, "nvfp4")
    c = PREFETCH_ALL_CANDIDATES["pf_k256_split2"][0]
    monkeypatch.setattr(pf, "W4A4_PDL_GRID", {"nvfp4": {padded_shape(128, 512): {8: c}}, "mxfp4": {}})
    assert linear.w4a4_pdl_gemm_config(2, p, "gluon") is None                 # not capturing: no PDL quantize
    monkeypatch.setattr(linear, "w4a4_quantize_pdl", lambda path: path == "gluon")
    assert linear.w4a4_pdl_gemm_config(2, p, "gluon") == c
    assert linear.w4a4_pdl_gemm_config(2, p, "triton") is None
    assert linear.w4a4_pdl_gemm_config(17, p, "gluon") is None


@pytest.mark.parametrize("act", ["nvfp4", "bf16"])
def test_fp4_linear_passes_the_table_config_to_w4a4_only(act, monkeypatch):
    """fp4_linear hands the table's config to the GEMM for W4A4 with its own PDL quantize, never for W4A16."""
    p = _packed(128, 512, "nvfp4")
    c = PREFETCH_ALL_CANDIDATES["pf_k256_split2"][0]
    monkeypatch.setattr(pf, "W4A4_PDL_GRID", {"nvfp4": {padded_shape(128, 512): {8: c}}, "mxfp4": {}})
    monkeypatch.setattr(linear, "w4a4_quantize_pdl", lambda path: path == "gluon")
    monkeypatch.setattr(linear, "small_m_gemm", lambda *a, **k: "gluon")
    monkeypatch.setattr(linear, "w4a4_quantize_launch", lambda path: {})   # the CPU quantize takes no PDL keywords
    seen = []

    def spy(x2, packed, row_scale, bias, out_dtype, config, path=None, launch_config=None):
        seen.append(launch_config)
        return torch.zeros(x2.shape[0], packed.out_features, dtype=out_dtype)

    monkeypatch.setattr(linear, "_dense_matmul", spy)
    linear.fp4_linear(torch.randn(2, 512), p, act)
    assert seen == [c if act == "nvfp4" else None]


def test_attention_signals_launch_dependents_by_default():
    from trace_rl.kernels import paged_attention
    from trace_rl.kernels.paged_attention_gluon import DEFAULT, LEAN, LEAN_CHECKED, LEAN_WIDE, GluonAttentionConfig

    assert paged_attention.LAUNCH_DEPENDENTS
    for c in (DEFAULT, LEAN, LEAN_CHECKED, LEAN_WIDE, GluonAttentionConfig(persistent=True)):
        assert c.launch_dependents
        replace(c, launch_dependents=False).check()
