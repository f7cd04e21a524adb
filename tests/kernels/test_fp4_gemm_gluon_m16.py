"""The M = 16 candidates of the Gluon FP4 GEMM (fp4_gemm_gluon_config.M16_CANDIDATES: q_split2/3/6/8 and qn_split8 at
4 CTAs per SM, p5_split3/8 at 5; issue 15's nvfp4 2.2x cuBLAS at M = 16 on 4096x12288 / 12288x4096; check `m16`):
- CPU: their occupancy (shared memory and registers for 4 / 5 CTAs per SM at 8 and 16 tokens, where SMALL_M and the
  k256 candidates fit 3), their K partitions (q_split2 at 4096x12288 and q_split6 at 12288x4096 are SMALL_M's auto
  split on 132 SMs, the others split3's / split8's), their compile-gate cases (16 tokens besides 8);
- sm_90 GPU + Triton 3.6: each bit-equal to SMALL_M (the shipped config) at the same K partition, W4A16 and W4A4
  (row scale + bias), at K = 4096 and 12288 and M = 1 / 12 / 16; against the float64 reference at ragged shapes
  (a partial row tile, K not a multiple of the split's steps, M = 5 / 13 / 16); at the issue's two shapes, equal to
  the shipped launch (`config=None`) wherever their K partition is the shipped one.
(The candidates' generic tests, reference at 4096x1024 and bits vs fin=False / without PDL, are
test_fp4_gemm_gluon_small_grid.py's, parametrized over every candidate.)"""

from dataclasses import replace

import pytest
import torch

from tests.gpu_marks import gpu36
from tests.kernels._compare import rel_err
from trace_rl.backends import get_backend
from trace_rl.kernels.fp4_gemm_gluon_config import (
    M16_CANDIDATES,
    SMALL_GRID_CANDIDATES,
    SMALL_M,
    SMEM_LIMIT,
    auto_split,
)
from trace_rl.kernels.hopper_fp4 import padded_shape, to_hopper

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]

CAND = {n: SMALL_GRID_CANDIDATES[n][0] for n in M16_CANDIDATES}
SMS = 132                                     # the H200's SMs: the shipped auto split below is for these


def _cdiv(a, b):
    return -(-a // b)


def partition(c, K: int, split: int | None = None, fmt: str = "nvfp4") -> tuple[int, ...]:
    """Columns per program (in split order) of config `c` at `split` (default its own) over K padded columns, as
    launch_grid evens the split: the K partition, which alone sets the bits."""
    bk = c.bk(fmt)
    kb = K // bk
    s = _cdiv(kb, _cdiv(kb, max(1, min(split or c.split_k, kb))))
    steps = _cdiv(kb, s)
    return tuple(min(steps, kb - i * steps) * bk for i in range(s))


def shipped_split(M: int, K: int, N: int, fmt: str = "nvfp4", sms: int = SMS) -> int:
    """SMALL_M's auto split (fp4_gemm_gluon.launch_grid) for M tokens on a K x N weight."""
    n_pad, k_pad = padded_shape(N, K)
    bm = SMALL_M.tile_m(M)
    return auto_split(_cdiv(n_pad, SMALL_M.block_n) * _cdiv(M, bm), k_pad // SMALL_M.bk(fmt),
                      sms * SMALL_M.ctas_per_sm(bm, fmt))


def small_m_twin(c, K: int):
    """SMALL_M at the split giving `c`'s K partition over K columns, or None (no 512-column split gives it)."""
    want = partition(c, K)
    return next((replace(SMALL_M, split_k=s) for s in range(1, K // 512 + 1)
                 if partition(replace(SMALL_M, split_k=s), K) == want), None)


def test_m16_candidates_fit_more_ctas_per_sm():
    for name, c in CAND.items():
        want = 5 if name.startswith("p5") else 4
        assert SMALL_GRID_CANDIDATES[name][1] == ("nvfp4", ) and c.fin and c.block_k == 256
        for M in (1, 8, 12, 16):
            bm = c.tile_m(M)
            assert bm == (8 if M <= 8 or name == "qn_split8" else 16)
            assert c.ctas_per_sm(bm) == want, (name, M)
            assert c.smem_bytes(bm) <= SMEM_LIMIT and (c.smem_bytes(bm) + 1024) * want <= 228 * 1024
            assert c.maxnreg * (c.num_warps + 4) * 32 * want <= 65536
    for other in (SMALL_M, SMALL_GRID_CANDIDATES["k256_split2"][0]):          # what they improve on: 3 per SM
        assert other.ctas_per_sm(16) == 3


def test_m16_candidates_k_partitions():
    """Which shipped launch each candidate shares its bits with (K x N = 4096 x 12288 and 12288 x 4096)."""
    assert shipped_split(16, 4096, 12288) == 2 and shipped_split(16, 12288, 4096) == 6
    assert partition(CAND["q_split2"], 4096) == partition(replace(SMALL_M, split_k=2), 4096) == (2048, 2048)
    assert partition(CAND["q_split6"], 12288) == partition(replace(SMALL_M, split_k=6), 12288) == (2048, ) * 6
    for K in (4096, 12288):
        for name, c in CAND.items():
            other = SMALL_GRID_CANDIDATES[f"split{c.split_k}"][0] if c.split_k in (2, 3, 4, 8) else None
            if other is not None:
                assert partition(c, K) == partition(other, K), (name, K)
    assert partition(CAND["q_split6"], 4096) == (768, ) * 5 + (256, ) and small_m_twin(CAND["q_split6"], 4096) is None
    assert partition(CAND["q_split3"], 4096) == (1536, 1536, 1024)
    assert all(small_m_twin(c, 12288) is not None for c in CAND.values())


def test_m16_gate_cases():
    pytest.importorskip("triton.experimental.gluon")
    from trace_rl.kernels.fp4_gemm_gluon_gate import small_grid_gate_cases

    names = [case.name for case in small_grid_gate_cases()]
    for name in M16_CANDIDATES:
        assert sum(n.endswith(f"[small grid {name}]") for n in names) == 1
        assert sum(n.endswith(f"[small grid {name} m16]") for n in names) == (name != "qn_split8")  # qn: 8 tokens
    m16 = [case for case in small_grid_gate_cases() if case.name.endswith(" m16]")]
    assert all(case.constexprs["BM"] == 16 and case.max_full_waits <= 2 for case in m16)


def _weight(N, K, gen, device="cuda"):
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    return get_backend("fp4").prepare_weight(w.to(device), "nvfp4")


def _ref(x, packed, row_scale=None, bias=None):
    y = x.double() @ packed.q.to(x.device).dequantize().double().T
    if row_scale is not None:
        y = y * row_scale.double()[:, None]
    return y if bias is None else y + bias.double()


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("name", M16_CANDIDATES)
def test_m16_candidate_same_bits_as_shipped_partition_gpu(name, gen):
    """Bit-equal to SMALL_M at the split of the same K partition (q_split6 at K = 4096 has none: against
    k256_split2's config at split 6, the same 256-column steps), W4A16 and W4A4 with bias, PDL as shipped."""
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

    c = CAND[name]
    for K in (4096, 12288):
        packed = _weight(320, K, gen)
        h = to_hopper(packed.q)
        twin = small_m_twin(c, K) or replace(SMALL_GRID_CANDIDATES["k256_split2"][0], split_k=c.split_k)
        assert partition(twin, K) == partition(c, K)
        for M in (1, 12, 16):
            x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
            y = fp4_matmul_gluon(x, h, c, pdl=True)
            assert torch.equal(y, fp4_matmul_gluon(x, h, twin, pdl=True)), (K, M, twin)
            assert rel_err(y, _ref(x, packed)) < 1e-2
            if M == 16:
                rs = torch.rand(M, generator=gen).cuda() + 0.5
                bias = torch.randn(320, generator=gen).cuda()
                y4 = fp4_matmul_gluon(x, h, c, row_scale=rs, bias=bias, pdl=True)
                assert torch.equal(y4, fp4_matmul_gluon(x, h, twin, row_scale=rs, bias=bias, pdl=True)), K
                assert rel_err(y4, _ref(x, packed, rs, bias)) < 1e-2


@gpu36[0]
@gpu36[1]
@pytest.mark.parametrize("name", M16_CANDIDATES)
def test_m16_candidate_matches_reference_ragged_gpu(name, gen):
    """A partial row tile (N = 200, 4 tiles of 64), K = 2816 (11 steps of 256: the split's last program shorter) and
    K = 1280 (5 steps: split 6 / 8 even out to 5), M = 5 / 13 / 16; W4A4 at M = 13."""
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

    c = CAND[name]
    for N, K in ((200, 2816), (136, 1280)):
        packed = _weight(N, K, gen)
        h = to_hopper(packed.q)
        for M in (5, 13, 16):
            x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
            y = fp4_matmul_gluon(x, h, c, pdl=True)
            assert y.shape == (M, N) and torch.isfinite(y).all() and rel_err(y, _ref(x, packed)) < 1e-2, (N, K, M)
            assert torch.equal(y, fp4_matmul_gluon(x, h, replace(c, fin=False))), (N, K, M)   # the same split
            if M == 13:
                rs = torch.rand(M, generator=gen).cuda() + 0.5
                bias = torch.randn(N, generator=gen).cuda()
                y4 = fp4_matmul_gluon(x, h, c, row_scale=rs, bias=bias, pdl=True)
                assert rel_err(y4, _ref(x, packed, rs, bias)) < 1e-2


@gpu36[0]
@gpu36[1]
def test_m16_candidates_at_the_issue_shapes_gpu(gen):
    """4096x12288 and 12288x4096 (K x N) at M = 12 / 16: every candidate within 1e-2 of the shipped launch
    (`config=None`: config_for's pick, SMALL_GRID's or SMALL_M at its auto split) and bit-equal to it wherever their
    K partitions agree (on 132 SMs: q_split2 at 4096x12288, q_split6 at 12288x4096, while SMALL_M is shipped there)."""
    from trace_rl.kernels.fp4_gemm_gluon import _sm_count, config_for, fp4_matmul_gluon

    same = []
    for K, N in ((4096, 12288), (12288, 4096)):
        h = to_hopper(_weight(N, K, gen).q)
        for M in (12, 16):
            x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
            shipped = fp4_matmul_gluon(x, h, pdl=True)
            used = config_for(M, "nvfp4", h.padded[1], h.padded[0])
            split = used.split_k or shipped_split(M, K, N, sms=_sm_count(x.device.index or 0))
            for name, c in CAND.items():
                y = fp4_matmul_gluon(x, h, c, pdl=True)
                assert rel_err(y, shipped) < 1e-2, (K, N, M, name)
                if partition(c, h.padded[1]) == partition(used, h.padded[1], split):
                    assert torch.equal(y, shipped), (K, N, M, name)
                    same.append((K, N, M, name))
        del h
    if _sm_count(torch.cuda.current_device()) == SMS and config_for(16, "nvfp4", 4096, 12288) == SMALL_M:
        assert (4096, 12288, 16, "q_split2") in same
    if _sm_count(torch.cuda.current_device()) == SMS and config_for(16, "nvfp4", 12288, 4096) == SMALL_M:
        assert (12288, 4096, 16, "q_split6") in same
