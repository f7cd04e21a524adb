"""The stream-K 256-token Gluon FP4 GEMM with the register-side two-segment fix-up (fp4_gemm_wide256_sk2.py): on CPU
the grid choice (segments per tile) and the finishing protocol (peek / ticket) over every interleaving of two
segments; on an sm_90 GPU with Triton 3.6, against the float64 reference at odd N / K, M from 17 to 600, one CTA per
SM and a few CTAs (tiles over 2 and 3 segments), both formats, both consumer variants and the 128-token tile, equal
to fp4_gemm_wide256_sk at the same grid (the same partials, two of them added in either order: the same bits) and
with the peek disabled (the path of two segments finishing together); deterministic."""

import itertools

import pytest
import torch

from tests.gpu_marks import gpu36
from tests.kernels._compare import rel_err_dequant
from tests.kernels.test_fp4_gemm_wide256 import _weight
from trace_rl.kernels.fp4_gemm_wide256 import VARIANTS, Wide256Config
from trace_rl.kernels.fp4_gemm_wide256_sk2 import default_grid, segments_per_tile
from trace_rl.kernels.hopper_fp4 import to_hopper

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


@pytest.mark.parametrize("tiles,kb,g", [(96, 32, 132), (32, 96, 132), (192, 32, 132), (3, 16, 7), (4, 2, 3)])
def test_segments_per_tile_matches_the_ranges(tiles, kb, g):
    total = tiles * kb
    owner = [next(c for c in range(g) if c * total // g <= i < (c + 1) * total // g) for i in range(total)]
    assert segments_per_tile(total, g, kb) == [len(set(owner[t * kb:(t + 1) * kb])) for t in range(tiles)]


def test_default_grid():
    """4096 x 12288 at M = 256 (96 tiles x 32 steps): 128 CTAs of exactly 24 steps, every tile in two segments (132
    would split some in three); M = 512 (192 tiles): all 132 (ranges of 46-47 > 32 steps); 12288 x 4096 at M = 256
    (32 x 96): no grid within 5% keeps two segments, so all 132; a tiny problem: ranges of >= 2 steps."""
    assert default_grid(96 * 32, 32, 132) == 128 and max(segments_per_tile(96 * 32, 132, 32)) == 3
    assert max(segments_per_tile(96 * 32, 128, 32)) == 2
    assert default_grid(192 * 32, 32, 132) == 132
    assert default_grid(32 * 96, 96, 132) == 132
    assert default_grid(64 * 96, 96, 132) == 128
    assert default_grid(3 * 4, 4, 132) == 6


def _finish_two(order):
    """A pure-Python MODEL of fp4_gemm_wide256_sk2._finish_segment2's two-segment finish (the protocol, not the kernel:
    the GPU tests check the kernel), as atomic steps run in `order` (a sequence
    of segment ids, each id once per step of that segment: 4 steps each at most). Returns (tile outputs written,
    the counter afterwards)."""
    mem = {"count": 0, "part": {}, "out": []}
    acc = {0: 1.5, 1: 2.25}

    def segment(s):
        peer = mem["count"]                                  # the acquire peek
        yield
        if peer == 1:
            mem["out"].append(acc[s] + mem["part"][1 - s])
            mem["count"] = 0
            return
        mem["part"][s] = acc[s]                              # partial stored, then released by the ticket
        yield
        ticket = mem["count"]
        mem["count"] += 1
        yield
        if ticket == 1:
            mem["out"].append(mem["part"][0] + mem["part"][1])
            mem["count"] = 0
    runs = {0: segment(0), 1: segment(1)}
    for s in order:
        next(runs[s], None)
    for r in runs.values():                                  # run both to completion
        for _ in r:
            pass
    return mem["out"], mem["count"]


def test_two_segment_protocol_every_interleaving():
    """Whatever the interleaving of the two segments' peek / store / ticket steps: the tile is written exactly once,
    with p0 + p1, and the counter is back at 0 for the next launch."""
    for n in range(0, 9):
        for order in itertools.product((0, 1), repeat=n):
            out, count = _finish_two(order)
            assert out == [3.75] and count == 0, order


@pytest.mark.parametrize("fmt,K", [("nvfp4", 1520), ("mxfp4", 1504)])
@pytest.mark.parametrize("M,grid", [(17, 0), (100, 5), (256, 0), (256, 3), (300, 7), (600, 5)])
def test_sk2_matches_reference_and_sk_gpu(fmt, M, K, grid, gen):
    """Odd N / K, token tiles 64 .. 256 (M = 300 / 600: several), one CTA per SM or a few (K = 1536's 12 steps:
    M = 256 at 3 CTAs and 600 at 5 split tiles in two segments (the register fix-up), 100 at 5 and 300 at 7 in two
    and three, the default grids in up to six): against the float64 reference, equal to fp4_gemm_wide256_sk at the
    same grid, the same with the peek off, deterministic."""
    from trace_rl.kernels.fp4_gemm_wide256_sk import fp4_matmul_wide256_sk
    from trace_rl.kernels.fp4_gemm_wide256_sk2 import fp4_matmul_wide256_sk2

    N = 199
    packed = _weight(N, K, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_wide256_sk2(x, h, grid=grid)
    assert y.shape == (M, N)
    assert rel_err_dequant(y, packed, x) < 1e-2
    g = grid or torch.cuda.get_device_properties(0).multi_processor_count
    assert torch.equal(fp4_matmul_wide256_sk2(x, h, grid=g), fp4_matmul_wide256_sk(x, h, grid=g))
    assert torch.equal(y, fp4_matmul_wide256_sk2(x, h, grid=grid, peek=False))
    assert torch.equal(y, fp4_matmul_wide256_sk2(x, h, grid=grid))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_sk2_issue_shape_gpu(fmt, gen):
    """4096 x 12288 (K x N) at M = 256: the default grid (128 CTAs of 24 steps, two segments per tile) with and
    without overlap and the 128-token tile, against the reference and the stream-K kernel at the same grid."""
    from trace_rl.kernels.fp4_gemm_wide256_sk import fp4_matmul_wide256_sk
    from trace_rl.kernels.fp4_gemm_wide256_sk2 import fp4_matmul_wide256_sk2

    packed = _weight(12288, 4096, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(256, 4096, generator=gen).to(torch.bfloat16).cuda()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cfg in (VARIANTS["w256"], VARIANTS["w256_nooverlap"], Wide256Config(block_m=128)):
        tiles = 96 * (256 // cfg.block_m)
        y = fp4_matmul_wide256_sk2(x, h, cfg)
        assert rel_err_dequant(y, packed, x) < 1e-2
        assert torch.equal(y, fp4_matmul_wide256_sk(x, h, cfg, grid=default_grid(tiles * 32, 32, sms)))


for _m in gpu36:
    test_sk2_matches_reference_and_sk_gpu = _m(test_sk2_matches_reference_and_sk_gpu)
    test_sk2_issue_shape_gpu = _m(test_sk2_issue_shape_gpu)
