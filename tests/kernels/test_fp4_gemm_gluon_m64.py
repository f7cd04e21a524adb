"""The M = 64 candidates of the Gluon FP4 GEMM (fp4_gemm_gluon_config.M64_CANDIDATES, issue 15's W4A16 M = 64 target;
benchmarks/m64_sweep.py measures them, check `m64`) and the rule that would select one (`M64_GRID`, empty by default):
- CPU: every candidate is a valid config for its formats that fits shared memory, with the residency its comment
  claims; with M64_GRID empty `config_for` is WIDE's tile at every M; filled, it takes the named config only at
  32 < M <= 64, per shape (padded N, K) or for every shape (None key); the sweep's rule proposal picks only a
  candidate that passed its checks and won every round, and writes the Python to paste;
- sm_90 GPU + Triton 3.6: each candidate against the float64 reference at ragged shapes (N = 200: a partial row
  tile; M = 64 and 50: a partial token tile), deterministic, and bit-equal to WIDE's 64-token tile launched at the
  candidate's own split (the bits depend on the K partition only)."""

from dataclasses import replace

import pytest
import torch

from tests.gpu_marks import gpu36
from tests.kernels._compare import rel_err
from trace_rl.backends import get_backend
from trace_rl.kernels import fp4_gemm_gluon_config as gc
from trace_rl.kernels.fp4_gemm_gluon_config import M64_CANDIDATES, SMEM_LIMIT, WIDE, config_for

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]

CASES = [(name, fmt) for name, (_, fmts) in M64_CANDIDATES.items() for fmt in fmts]


@pytest.mark.parametrize("name,fmt", CASES)
def test_candidates_are_valid_configs(name, fmt):
    c, _ = M64_CANDIDATES[name]
    c.check(fmt)
    bm = c.tile_m(64)
    assert bm == c.block_m and c.smem_bytes(bm, fmt) <= SMEM_LIMIT
    if name.startswith("n64_w4") and fmt == "nvfp4":
        assert c.ctas_per_sm(bm, fmt) == 2, "two independent pipelines per SM is the point of n64_w4 (nvfp4)"


def test_committed_m64_rule_is_the_measured_selection():
    """M64_GRID as the `m64` run measured it (benchmarks/results/m64_h200_1202f_summary.json); other shapes WIDE."""
    c = {n: cfg for n, (cfg, _) in M64_CANDIDATES.items()}
    for M in (33, 50, 64):
        assert config_for(M, "nvfp4", 4096, 12288) == c["wide_overlap"]
        assert config_for(M, "mxfp4", 4096, 12288) == c["wide_overlap_s2"]
        for fmt in ("nvfp4", "mxfp4"):
            assert config_for(M, fmt, 12288, 4096) == c["n64_w4"]
            for k, n in ((4096, 4096), (None, None)):
                assert config_for(M, fmt, k, n) == WIDE[fmt][64]


def test_rule_takes_the_named_config_only_where_it_applies(monkeypatch):
    a, b = M64_CANDIDATES["n64_w4"][0], M64_CANDIDATES["wide_split4"][0]
    monkeypatch.setattr(gc, "M64_GRID", {"nvfp4": {(12288, 4096): a}, "mxfp4": {None: b}})
    assert config_for(64, "nvfp4", 4096, 12288) == config_for(33, "nvfp4", 4096, 12288) == a
    assert config_for(64, "nvfp4", 12288, 4096) == WIDE["nvfp4"][64]          # another shape
    assert config_for(32, "nvfp4", 4096, 12288) == WIDE["nvfp4"][32]          # M <= 32: the 32-token tile
    assert config_for(65, "nvfp4", 4096, 12288) == WIDE["nvfp4"][128]         # past 64 tokens
    assert config_for(64, "mxfp4", 12288, 4096) == config_for(40, "mxfp4") == b
    assert config_for(16, "mxfp4", 4096, 12288) != b                          # small M untouched
    monkeypatch.setattr(gc, "M64_GRID", {"nvfp4": {None: replace(a, block_k=512)}, "mxfp4": {}})
    assert config_for(64, "nvfp4", 1280, 256) == WIDE["nvfp4"][64]            # its K step does not divide K


def _row(fmt, us_wide, us_cand, ok=True, bits=True, shape=(12288, 4096)):
    K, N = shape
    return {"fmt": fmt, "K": K, "N": N, "M": 64, "padded": [N, K],
            "variants": {"wide": {"ok": True, "deterministic": True, "bit_identical_vs_wide_same_split": True},
                         "n64_w4": {"ok": ok, "deterministic": True, "bit_identical_vs_wide_same_split": bits}},
            "us": {"wide": sum(us_wide) / 2, "n64_w4": sum(us_cand) / 2},
            "rounds_us": {"wide": us_wide, "n64_w4": us_cand}, "vs_cublas_bf16": {"n64_w4": 1.5}}


def test_sweep_rule_proposal():
    from benchmarks.m64_sweep import rule_proposal

    rows = [_row("nvfp4", [24, 24], [20, 21]), _row("nvfp4", [22, 22], [21.9, 23], shape=(4096, 12288)),
            _row("mxfp4", [24, 24], [20, 20], bits=False)]
    p = rule_proposal(rows)
    assert p["nvfp4"]["per_shape"]["12288x4096"]["choice"] == "n64_w4"       # K x N; its key: padded (N, K)
    assert p["nvfp4"]["per_shape"]["4096x12288"]["choice"] == "keep"         # lost a round
    assert p["mxfp4"]["per_shape"]["12288x4096"]["choice"] == "keep"         # other bits at its split
    assert p["nvfp4"]["common"] == "keep"
    assert p["M64_GRID"] == 'M64_GRID = {"nvfp4": {(4096, 12288): M64_CANDIDATES["n64_w4"][0]}, "mxfp4": {}}'
    assert p["M64_GRID_common"] == 'M64_GRID = {"nvfp4": {}, "mxfp4": {}}'
    ns = {"M64_CANDIDATES": M64_CANDIDATES}
    exec(p["M64_GRID"], ns)                                                    # the line pastes as Python
    assert ns["M64_GRID"]["nvfp4"][(4096, 12288)] == M64_CANDIDATES["n64_w4"][0]


def _weight(N, K, fmt, gen, device="cpu"):
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    return get_backend("fp4").prepare_weight(w.to(device), fmt)


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("name,fmt", CASES)
def test_candidate_matches_reference_and_wide_bits_gpu(name, fmt, gen):
    from trace_rl.kernels.fp4_gemm_gluon import _sm_count, fp4_matmul_gluon, launch_grid
    from trace_rl.kernels.hopper_fp4 import to_hopper

    c, _ = M64_CANDIDATES[name]
    K = 1536                                  # 6 nvfp4 / 3 mxfp4 K steps: splits 2 / 3 / 4 are uneven or capped
    packed = _weight(200, K, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    for M in (64, 50):
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
        y = fp4_matmul_gluon(x, h, c)
        ref = x.double() @ packed.q.to(x.device).dequantize().double().T
        assert y.shape == (M, 200) and torch.isfinite(y).all() and rel_err(y, ref) < 1e-2, (M, rel_err(y, ref))
        assert torch.equal(y, fp4_matmul_gluon(x, h, c)), f"{name}: not deterministic at M = {M}"
        bm, bk = c.tile_m(M), c.bk(fmt)
        split = launch_grid(M, h.padded, c, bm, bk, lambda bm=bm: _sm_count(0) * c.ctas_per_sm(bm, fmt))[3]
        w = WIDE[fmt][64]
        kb, kb_w = h.padded[1] // bk, h.padded[1] // w.bk(fmt)
        assert bk * -(-kb // split) == w.bk(fmt) * -(-kb_w // split), "K = 1536: WIDE cuts the same K partition"
        wide = fp4_matmul_gluon(x, h, replace(w, split_k=split))
        assert torch.equal(y, wide), f"{name} at split {split}: other bits than WIDE's tile at that split (M = {M})"
