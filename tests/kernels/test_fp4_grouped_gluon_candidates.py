"""The Gluon grouped FP4 GEMM's 409-512-token candidates (fp4_grouped_gluon_candidates.py), its `balanced` tile
order (fp4_grouped_gluon_schedule.py) and its dual-accumulator kernel (fp4_grouped_gluon_dual.py). CPU: the balanced
deal covers every (row, N tile) exactly once at any grid size and gives every program floor or ceil(tiles / programs)
tiles; the candidates resolve by name. GPU (sm_90, Triton 3.6): every candidate bit-identical to the shipped tile of
its token count (same K order; only the program that runs a tile changes), against the torch reference, with
experts of 0 / 1 / 17 / 46 / 70 rows (one, two and three 32-token tiles; the dual config's one- and two-accumulator
tiles), a bias, the zero tail, a persistent grid of 3 programs; and at the Qwen3-30B-A3B gate+up shape with
B = 512's routing (most experts over 32 rows)"""

import pytest
import torch

from tests.gpu_marks import gpu36
from trace_rl.kernels.fp4_grouped_gluon_candidates import GROUPED_CANDIDATES
from trace_rl.kernels.fp4_grouped_gluon_schedule import balanced_schedule, expert_schedule, program_tiles

COUNTS = [17, 0, 1, 46, 0, 70, 3]


def gpu(fn):
    return gpu36[0](gpu36[1](fn))


@pytest.mark.parametrize("block_m", [16, 32, 64])
@pytest.mark.parametrize("nprog", [1, 3, 7, 50])
def test_balanced_order_covers_every_tile_once(block_m, nprog):
    offsets = [0] + torch.tensor(COUNTS).cumsum(0).tolist()
    nt = 3
    seen = {}
    for pid in range(nprog):
        for e, n, row0 in balanced_schedule(offsets, nt, block_m, pid, nprog):
            assert offsets[e] <= row0 < offsets[e + 1]
            for r in range(row0, min(row0 + block_m, offsets[e + 1])):
                seen[(r, n)] = seen.get((r, n), 0) + 1
    assert seen == {(r, n): 1 for r in range(offsets[-1]) for n in range(nt)}
    per = program_tiles(offsets, nt, block_m, nprog, balanced=True)
    assert max(per) - min(per) <= 1 and sum(per) == sum(program_tiles(offsets, nt, block_m, nprog, False))
    # the same tiles as the expert order, dealt differently
    flat = lambda f: sorted(t for p in range(nprog) for t in f(offsets, nt, block_m, p, nprog))  # noqa: E731
    assert flat(balanced_schedule) == flat(expert_schedule)


def test_candidates_resolve_by_name():
    from trace_rl.kernels.fp4_grouped_gluon import tile_config

    for fmt, cands in GROUPED_CANDIDATES.items():
        for name, c in cands.items():
            assert tile_config(fmt, name) is c
            c.check(fmt)
    assert GROUPED_CANDIDATES["nvfp4"]["32x64"].ctas_per_sm(32) == 3


def _shipped(fmt, c):
    from trace_rl.kernels.fp4_grouped_gluon import GROUPED_GLUON

    return GROUPED_GLUON[fmt][c.block_m]


_CASES = [(f, name) for f in GROUPED_CANDIDATES for name in GROUPED_CANDIDATES[f]]


@pytest.mark.parametrize("fmt,name", _CASES, ids=[f"{f}-{n}" for f, n in _CASES])
@gpu
def test_candidate_bits_equal_shipped_tile(fmt, name, gen):
    from trace_rl.backends.fp4 import grouped_linear_reference, prepare_expert_weights
    from trace_rl.kernels.fp4_grouped_gluon import fp4_grouped_matmul_gluon
    from trace_rl.kernels.linear import hopper_weight

    N, K = (200, 720) if fmt == "nvfp4" else (136, 992)
    E = len(COUNTS)
    w = torch.randn(E, N, K, generator=gen) * torch.exp(torch.randn(E, 1, 1, generator=gen))
    experts = prepare_expert_weights(w.cuda(), fmt)
    hw = hopper_weight(experts)
    offsets = torch.tensor([0] + torch.tensor(COUNTS).cumsum(0).tolist(), dtype=torch.int32).cuda()
    x = torch.randn(sum(COUNTS) + 3, K, generator=gen).to(torch.bfloat16).cuda()
    b = torch.randn(E, N, generator=gen).cuda()
    c = GROUPED_CANDIDATES[fmt][name]
    out = torch.full((x.shape[0], N), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = fp4_grouped_matmul_gluon(x, offsets, hw, bias=b, config=c, out=out, zero_tail=True)
    ship = fp4_grouped_matmul_gluon(x, offsets, hw, bias=b, config=_shipped(fmt, c), zero_tail=True)
    torch.cuda.synchronize()
    used = sum(COUNTS)
    ref = grouped_linear_reference(x, offsets, experts, "bf16", b)
    assert ((y[:used].double() - ref[:used].double()).norm() / ref[:used].double().norm()).item() < 1e-2
    assert not y[used:].any(), "the rows past offsets[E] must come back as zeros (zero_tail)"
    assert torch.equal(y, ship), f"{name} must give the shipped {c.block_m}-token tile's bits"
    assert torch.equal(fp4_grouped_matmul_gluon(x, offsets, hw, bias=b, config=c, programs=3, zero_tail=True), y)


@pytest.mark.parametrize("name", ["32b", "32x64ob", "32d"])
@gpu
def test_candidate_at_moe_shape_b512(name, gen):
    """Qwen3-30B-A3B gate+up [1536 x 2048], top-8 of 128 at B = 512 (~half the experts over 32 rows)."""
    from trace_rl.backends.fp4 import prepare_expert_weights
    from trace_rl.kernels.fp4_grouped_gluon import GROUPED_GLUON, fp4_grouped_matmul_gluon
    from trace_rl.kernels.linear import hopper_weight

    E, N, K, B = 128, 1536, 2048, 512
    ids = torch.randn(B, E, generator=gen).topk(8, dim=1).indices.reshape(-1)
    counts = torch.bincount(ids, minlength=E)
    offsets = torch.zeros(E + 1, dtype=torch.int32)
    offsets[1:] = counts.cumsum(0)
    cg = torch.Generator(device="cuda").manual_seed(int(torch.randint(2**31, (1, ), generator=gen)))   # fast
    hw = hopper_weight(prepare_expert_weights(torch.randn(E, N, K, generator=cg, device="cuda") * 0.02, "nvfp4"))
    x = torch.randn(8 * B, K, generator=cg, device="cuda").to(torch.bfloat16)
    y = fp4_grouped_matmul_gluon(x, offsets.cuda(), hw, config=GROUPED_CANDIDATES["nvfp4"][name])
    assert torch.equal(y, fp4_grouped_matmul_gluon(x, offsets.cuda(), hw, config=GROUPED_GLUON["nvfp4"][32]))
