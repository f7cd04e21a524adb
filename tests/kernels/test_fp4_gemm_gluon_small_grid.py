"""The small-weight candidates of the Gluon FP4 GEMM at M <= 16 (fp4_gemm_gluon_config.SMALL_GRID_CANDIDATES, issue
15's 4096x1024 at M = 1 against gemlite; benchmarks/smallm_sweep.py measures them) and the rule that would select
one (`SMALL_GRID`: {format: {weight class (min rows, max rows, K): {M bucket 8 / 16: config}}}):
- CPU: every candidate is a valid config for its formats that fits shared memory; the committed rule selects the
  4096x1024 configs measured in the `smallm` check (nvfp4 k256_split16 at M <= 16, mxfp4 split8 at M <= 8) and SMALL_M
  elsewhere; a rule takes a config only at M <= 16, in its M bucket, on a weight inside one of its classes, where
  its step divides K; the torch emulation of the kernel's data path (test_fp4_gemm_gluon._emulate) at each
  candidate's tile (64 x 256, 128 x 512) reproduces the reference;
- sm_90 GPU + Triton 3.6: each candidate against the float64 reference at 4096x1024 (M = 1 / 16), at a ragged
  shape (N = 200, K = 1536: a partial row tile; M = 5) and at K = 12288 (the down projection's K, where split 3 / 6
  are even; N = 256, M = 3), bit-equal to `_fp4_gemm_ws_kernel` (fin=False) at its own split
  and to itself without PDL; W4A4 (row scale + bias); candidates with the same K partition give the same bits
  (split8 = k256_split8 = w8_split8; k256_split4 = SMALL_M at 4096x1024, whose auto split is 4)."""

from dataclasses import replace

import pytest
import torch

from tests.gpu_marks import gpu36
from tests.kernels._compare import rel_err
from trace_rl.backends import get_backend
from trace_rl.kernels import fp4_gemm_gluon_config as gc
from trace_rl.kernels.fp4_gemm_gluon_config import SMALL_GRID_CANDIDATES, SMALL_M, SMEM_LIMIT, WIDE, config_for
from trace_rl.kernels.hopper_fp4 import to_hopper

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]

CASES = [(name, fmt) for name, (_, fmts) in SMALL_GRID_CANDIDATES.items() for fmt in fmts]


def _weight(N, K, fmt, gen, device="cpu"):
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    return get_backend("fp4").prepare_weight(w.to(device), fmt)


def _ref(x, packed, row_scale=None, bias=None):
    y = x.double() @ packed.q.to(x.device).dequantize().double().T
    if row_scale is not None:
        y = y * row_scale.double()[:, None]
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("name,fmt", CASES)
def test_candidates_are_valid_fin_configs(name, fmt):
    c, _ = SMALL_GRID_CANDIDATES[name]
    c.check(fmt)
    assert c.fin and c.split_k > 0, "a candidate names its split (the sweep's point), and runs the fin kernel"
    for bm in (8, 16):
        assert c.smem_bytes(bm, fmt) <= SMEM_LIMIT
    assert any(k % c.bk(fmt) == 0 and (k // c.bk(fmt)) % c.split_k == 0 for k in (4096, 12288)), \
        "an even K partition at Qwen3-8B's K = 4096 or 12288"


# The committed SMALL_GRID as measured, per (format, K, N) weight: {M bucket (8: M 1..8, 16: M 9..16): candidate}; a
# missing bucket keeps SMALL_M. After a check's run (`smallm`, `smallwide`, `m16`) pastes rule_proposal.SMALL_GRID,
# put each line of its rule_proposal.changes here ("nvfp4 4096x12288 M bucket 16: q_split3 ..." ->
# ("nvfp4", 4096, 12288): {..., 16: "q_split3"}); a shape of SMALL_M_SHAPES that got a class moves here, with an
# empty entry for the other format (e.g. ("nvfp4", 12288, 4096): {16: "q_split6"}, ("mxfp4", 12288, 4096): {}).
MEASURED_RULE = {
    # `smallm` (smallm_h200_1202f_summary.json): weights of up to 1024 rows at K = 4096
    ("nvfp4", 4096, 1024): {8: "k256_split16", 16: "k256_split16"},
    ("nvfp4", 4096, 512): {8: "k256_split16", 16: "k256_split16"},
    ("mxfp4", 4096, 1024): {8: "split8"},
    ("mxfp4", 4096, 512): {8: "split8"},
    # `smallwide` (smallwide_h200_1202f_summary.json): exactly 12288 / 6144 / 4096 rows at K = 4096
    ("nvfp4", 4096, 12288): {8: "k256_split2"},
    ("nvfp4", 4096, 6144): {8: "k256_split2", 16: "k256_split2"},
    ("nvfp4", 4096, 4096): {8: "k256_split3", 16: "k256_split3"},
    ("mxfp4", 4096, 12288): {},
    ("mxfp4", 4096, 6144): {8: "split2", 16: "split2"},
    ("mxfp4", 4096, 4096): {8: "split3"},
}
SMALL_M_SHAPES = ((12288, 4096), (4096, 2048), (8192, 1024), (4096, 8192), (4096, 12800))   # (K, N): no class


def test_committed_rule_is_the_measured_small_weight_selection():
    """SMALL_GRID selects MEASURED_RULE's candidate per weight and M bucket; every other weight keeps SMALL_M."""
    cand = {n: c for n, (c, _) in SMALL_GRID_CANDIDATES.items()}
    for M in range(1, 17):
        for (fmt, k, n), tiles in MEASURED_RULE.items():
            name = tiles.get(gc.m_bucket(M))
            assert config_for(M, fmt, k, n) == (cand[name] if name else SMALL_M), (fmt, k, n, M, name)
        for k, n in SMALL_M_SHAPES:
            assert config_for(M, "nvfp4", k, n) == config_for(M, "mxfp4", k, n) == SMALL_M, (k, n)
        assert config_for(M, "nvfp4", 4096) == SMALL_M                          # rows unknown


def test_config_for_follows_small_grid():
    """Whatever SMALL_GRID holds: its configs are gated candidates of their format, its classes of a format do not
    overlap, its buckets are M_BUCKETS, and `config_for` takes them only inside a class."""
    candidates = [c for c, _ in SMALL_GRID_CANDIDATES.values()]
    assert set(gc.SMALL_GRID) == {"nvfp4", "mxfp4"}
    for fmt, classes in gc.SMALL_GRID.items():
        keys = sorted(classes)
        for (lo, hi, k), nxt in zip(keys, keys[1:] + [None]):
            assert 1 <= lo <= hi and (nxt is None or nxt[2] != k or nxt[0] > hi), ("overlapping classes", keys)
        for (lo, hi, k), tiles in classes.items():
            assert set(tiles) <= set(gc.M_BUCKETS)
            assert all(c in candidates and any(cc == c and fmt in f for cc, f in SMALL_GRID_CANDIDATES.values())
                       for c in tiles.values())
            for M in (1, 4, 8, 9, 16):
                assert config_for(M, fmt, k, hi) == config_for(M, fmt, k, lo) == tiles.get(gc.m_bucket(M), SMALL_M)
            assert config_for(17, fmt, k, hi) in WIDE[fmt].values()


def test_rule_takes_the_named_config_only_where_it_applies(monkeypatch):
    small, sixteen = SMALL_GRID_CANDIDATES["split8"][0], SMALL_GRID_CANDIDATES["k256_split16"][0]
    split3 = SMALL_GRID_CANDIDATES["split3"][0]
    monkeypatch.setattr(gc, "SMALL_GRID", {"nvfp4": {(1, 1024, 4096): {8: small, 16: sixteen},
                                                     (12288, 12288, 4096): {16: split3}},
                                           "mxfp4": {(1, 1024, 4096): {16: small}}})
    assert config_for(1, "nvfp4", 4096, 1024) == config_for(8, "nvfp4", 4096, 1024) == small
    assert config_for(9, "nvfp4", 4096, 1024) == config_for(16, "nvfp4", 4096, 1024) == sixteen
    assert config_for(16, "nvfp4", 4096, 12288) == config_for(9, "nvfp4", 4096, 12288) == split3
    assert config_for(8, "nvfp4", 4096, 12288) == SMALL_M                       # bucket 8 not named
    assert config_for(16, "nvfp4", 4096, 12160) == SMALL_M                      # outside the exact class
    assert config_for(16, "mxfp4", 4096, 512) == small and config_for(4, "mxfp4", 4096, 1024) == SMALL_M
    assert config_for(17, "nvfp4", 4096, 1024) == WIDE["nvfp4"][32]           # past 16 tokens: the wide tiles
    assert config_for(1, "nvfp4", 4096, 2048) == SMALL_M                        # in no class
    assert config_for(1, "nvfp4", 8192, 1024) == SMALL_M                        # a K in no class
    assert config_for(1, "nvfp4", 4096) == SMALL_M                              # rows unknown
    # 1280 = 5 x 256 columns, not a multiple of 512: the class matches, split8's step does not divide K
    monkeypatch.setattr(gc, "SMALL_GRID", {"nvfp4": {(1, 1024, 1280): {16: small}}, "mxfp4": {}})
    assert config_for(1, "nvfp4", 1280, 1024) == gc.DEFAULT
    assert gc.small_grid_class("nvfp4", 1024, 1280) == (1, 1024, 1280) and gc.small_grid_class("mxfp4", 1, 1) is None
    assert [gc.m_bucket(M) for M in (1, 8, 9, 16)] == [8, 8, 16, 16]


@pytest.mark.parametrize("fmt,BN,bk", [("nvfp4", 64, 256), ("nvfp4", 128, 512), ("mxfp4", 128, 512)])
def test_emulated_data_path_at_candidate_tiles(fmt, BN, bk, gen):
    """The candidates' tiles not covered by test_fp4_gemm_gluon's emulation cases (SMALL_M's 64 x 512 is)."""
    from tests.kernels.test_fp4_gemm_gluon import _emulate
    from trace_rl.kernels.hopper_fp4 import operand

    packed = _weight(200, 1536, fmt, gen)
    h = to_hopper(packed.q)
    x = torch.randn(3, 1536, generator=gen).to(torch.bfloat16)
    y = _emulate(x, h, BN, 8, bk)
    ref = x.double() @ (operand(h).double() * h.row_factor[:200, None].double()).T
    assert torch.allclose(y, ref, rtol=1e-9, atol=1e-9 * ref.abs().max().item())
    assert rel_err(y, _ref(x, packed)) < 1e-2


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("name,fmt", CASES)
@pytest.mark.parametrize("N,K,Ms", [(1024, 4096, (1, 16)), (200, 1536, (5, )), (256, 12288, (3, ))])
def test_candidate_matches_reference_and_previous_launch_gpu(name, fmt, N, K, Ms, gen):
    """At the first M also without PDL and W4A4 (row scale + bias): few compiles per case (the check runs these
    beside its sweep's precompile)."""
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

    c, _ = SMALL_GRID_CANDIDATES[name]
    packed = _weight(N, K, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    for M in Ms:
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
        y = fp4_matmul_gluon(x, h, c, pdl=True)
        assert y.shape == (M, N) and rel_err(y, _ref(x, packed)) < 1e-2, (M, rel_err(y, _ref(x, packed)))
        assert torch.equal(y, fp4_matmul_gluon(x, h, replace(c, fin=False))), M     # the same (evened) split
        if M == Ms[0]:
            assert torch.equal(y, fp4_matmul_gluon(x, h, c)), M
            bias = torch.randn(N, generator=gen).cuda()
            rs = torch.rand(M, generator=gen).cuda() + 0.5
            y4 = fp4_matmul_gluon(x, h, c, row_scale=rs, bias=bias, pdl=True)
            assert rel_err(y4, _ref(x, packed, rs, bias)) < 1e-2


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_same_k_partition_same_bits_gpu(fmt, gen):
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

    packed = _weight(1024, 4096, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    for M in (1, 16):
        x = torch.randn(M, 4096, generator=gen).to(torch.bfloat16).cuda()
        ys = {n: fp4_matmul_gluon(x, h, c, pdl=True) for n, (c, f) in SMALL_GRID_CANDIDATES.items() if fmt in f}
        shipped = fp4_matmul_gluon(x, h, replace(SMALL_M, split_k=4), pdl=True)     # SMALL_M's auto split here: 4
        # the launch without a config takes config_for's pick (SMALL_GRID's candidate where the rule names one)
        picked = config_for(M, fmt, h.padded[1], h.padded[0])
        assert torch.equal(fp4_matmul_gluon(x, h, pdl=True), fp4_matmul_gluon(x, h, picked, pdl=True)), (M, picked)
        for n in ("k256_split8", "w8_split8"):
            if n in ys:
                assert torch.equal(ys[n], ys["split8"]), (n, M)
        if "k256_split4" in ys:
            assert torch.equal(ys["k256_split4"], shipped), M
