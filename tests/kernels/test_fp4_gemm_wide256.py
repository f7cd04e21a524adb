"""The opt-in 256-token Gluon FP4 GEMM (fp4_gemm_wide256.py): config and launcher checks and the CPU emulation of its
128-column-step data path (test_fp4_gemm_gluon._emulate at bk = 128, BM = 256: the words box [1, BN/16, 256], the
scale words of the step at word 2 kb (nvfp4) / kb (mxfp4)); on an sm_90 GPU with Triton 3.6, against the float64
reference at odd N / K and M from 17 to 600 (token tiles 64 / 128 / 256, a partial last one, a grid over 256-token
tiles), both formats, every benchmarked variant, forced splits (deterministic), and against the shipped wide Gluon
kernel (fp4_matmul_gluon's config_for) on the same inputs; the stream-K schedule (fp4_gemm_wide256_sk.py) likewise,
at one CTA per SM and at a few CTAs (ranges over several tiles, tiles split over two or three CTAs)."""

from dataclasses import replace

import pytest
import torch

from tests.gpu_marks import gpu36
from tests.kernels._compare import rel_err, rel_err_dequant
from trace_rl.backends import get_backend
from trace_rl.kernels.fp4_gemm_wide256 import (
    SMEM_LIMIT,
    VARIANTS,
    WIDE256,
    Wide256Config,
    fp4_matmul_wide256,
)
from trace_rl.kernels.hopper_fp4 import to_hopper

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _weight(N, K, fmt, gen, device="cpu"):
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    return get_backend("fp4").prepare_weight(w.to(device), fmt)


def test_config_checks_and_shared_memory():
    from trace_rl.kernels.fp4_gemm_wide256 import WIDE64_2CTA

    assert WIDE64_2CTA.ctas_per_sm(64) == 2 and WIDE256.ctas_per_sm(256) == 1
    assert [WIDE256.tile_m(M) for M in (1, 17, 64, 65, 128, 129, 256, 600)] == [64, 64, 64, 128, 128, 256, 256, 256]
    for c in VARIANTS.values():
        c.check()
        assert c.smem_bytes(256) <= SMEM_LIMIT, c
    assert Wide256Config(stages=4).smem_bytes(256) > SMEM_LIMIT
    assert [WIDE256.slots(t) for t in (256, 128, 64)] == [3, 5, 8]
    assert all(WIDE256.smem_bytes(t) <= SMEM_LIMIT for t in (256, 128, 64))
    with pytest.raises(ValueError, match="block_n"):
        Wide256Config(block_n=256).check()
    with pytest.raises(ValueError, match="block_m"):
        Wide256Config(block_m=32).check()


@pytest.mark.parametrize("launcher", ["fp4_matmul_wide256", "fp4_matmul_wide256_sk"])
def test_launcher_checks(gen, launcher):
    """Both launchers refuse bad inputs through the shared `checked_inputs`, each error naming its launcher."""
    from trace_rl.kernels import fp4_gemm_wide256, fp4_gemm_wide256_sk

    run = getattr(fp4_gemm_wide256_sk if launcher.endswith("_sk") else fp4_gemm_wide256, launcher)
    h = to_hopper(_weight(48, 512, "nvfp4", gen).q)
    with pytest.raises(ValueError, match=f"{launcher}: .*bf16"):
        run(torch.zeros(4, 512), h)
    with pytest.raises(ValueError, match="columns"):
        run(torch.zeros(4, 256, dtype=torch.bfloat16), h)
    with pytest.raises(ValueError, match="shared memory"):
        run(torch.zeros(256, 512, dtype=torch.bfloat16), h, Wide256Config(stages=4))
    with pytest.raises(ValueError, match="CUDA"):
        run(torch.zeros(4, 512, dtype=torch.bfloat16), h)


@pytest.mark.parametrize("fmt,kp", [("nvfp4", 1536), ("mxfp4", 1536), ("nvfp4", 256), ("mxfp4", 512)])
def test_scale_box_is_16_byte_aligned_and_holds_the_step(fmt, kp):
    """The scale box TMA loads per 128-column step (scale_box: what both kernels' producers and
    `_step_scale_words` compute) starts at a 16-byte aligned word (an unaligned innermost TMA coordinate is an
    illegal instruction on the H200), lies inside the scale row at every K the launcher accepts, and its words at the
    step's position are the step's scale words."""
    from trace_rl.kernels.fp4_gemm_wide256 import BK, SCALE_BOX_WORDS, scale_box, scale_words_per_step

    sw = scale_words_per_step(fmt)
    row_words = kp // BK * sw
    scales = torch.arange(3 * row_words, dtype=torch.int32).view(3, row_words)
    for kb in range(kp // BK):
        start, sub = scale_box(kb, fmt)
        assert start * 4 % 16 == 0 and start + SCALE_BOX_WORDS <= row_words
        box = scales[:, start:start + SCALE_BOX_WORDS]
        assert torch.equal(box[:, sub * sw:(sub + 1) * sw], scales[:, kb * sw:(kb + 1) * sw])


@pytest.mark.parametrize("fmt,M,N,K", [("nvfp4", 5, 72, 1008), ("mxfp4", 3, 72, 1504)])
def test_emulated_128_column_steps_match_reference(fmt, M, N, K, gen):
    """The kernel's indexing at 128-column steps (one chunk, the step's scale words first in the box) and BM = 256,
    through the shared torch emulation of the Gluon data path."""
    from test_fp4_gemm_gluon import _emulate

    from trace_rl.kernels.hopper_fp4 import operand

    packed = _weight(N, K, fmt, gen)
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16)
    y = _emulate(x, h, 128, 256, 128)
    ref = x.double() @ (operand(h).double() * h.row_factor[:N, None].double()).T
    assert torch.allclose(y, ref, rtol=1e-9, atol=1e-9 * ref.abs().max().item())


@pytest.mark.parametrize("fmt,K", [("nvfp4", 1520), ("mxfp4", 1504)])
@pytest.mark.parametrize("M", [17, 64, 100, 256, 300])
def test_wide256_matches_reference_gpu(fmt, M, K, gen):
    """Odd N (a partial 128-row tile), K padding, token tiles 64 / 128 / 256 and a partial one (TMA zero fill, masked
    store), auto split; against the float64 reference and the shipped wide Gluon kernel; deterministic."""
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

    N = 199
    packed = _weight(N, K, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_wide256(x, h)
    assert y.shape == (M, N) and y.dtype == torch.bfloat16
    assert rel_err_dequant(y, packed, x) < 1e-2
    assert rel_err(y, fp4_matmul_gluon(x, h)) < 8e-3
    assert torch.equal(y, fp4_matmul_wide256(x, h))


@pytest.mark.parametrize("name", list(VARIANTS))
@pytest.mark.parametrize("M,split", [(256, 1), (600, 5)])
def test_wide256_variants_and_splits_gpu(name, M, split, gen):
    """Each benchmarked variant at a forced split of K = 1536's 12 steps (1: six overlapped pairs; 5 -> 4 splits of 3
    steps: a pair and the unoverlapped tail of _steps256, partials and tickets per (token tile, row tile); M = 600:
    three 256-token tiles, the last partial): against the reference; bit-identical across runs."""
    packed = _weight(264, 1536, "nvfp4", gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, 1536, generator=gen).to(torch.bfloat16).cuda()
    cfg = replace(VARIANTS[name], split_k=split)
    y = fp4_matmul_wide256(x, h, cfg)
    assert rel_err_dequant(y, packed, x) < 1e-2
    assert torch.equal(y, fp4_matmul_wide256(x, h, cfg))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_wide256_issue_shape_gpu(fmt, gen):
    """The issue's 12288 x 4096 (K x N) at M = 256 (auto split) against the reference."""
    packed = _weight(4096, 12288, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(256, 12288, generator=gen).to(torch.bfloat16).cuda()
    assert rel_err_dequant(fp4_matmul_wide256(x, h), packed, x) < 1e-2


def test_stream_k_segments_bound():
    """The partial slots per tile (max_segments) bound the CTAs any tile's K steps are spread over, for the ranges
    the kernel cuts [c T / G, (c + 1) T / G)."""
    from trace_rl.kernels.fp4_gemm_wide256_sk import max_segments

    for tiles, kb, g in [(96, 32, 132), (32, 96, 132), (192, 32, 132), (3, 16, 7), (2, 12, 5), (1, 12, 6), (4, 2, 3)]:
        total = tiles * kb
        cta = [((i + 1) * g - 1) // total for i in range(total)]           # the kernel's _cta_of
        assert all(c * total // g <= i < (c + 1) * total // g for i, c in enumerate(cta))
        segs = max(cta[t * kb + kb - 1] - cta[t * kb] + 1 for t in range(tiles))
        assert segs <= max_segments(total, g, kb), (tiles, kb, g)


def _simulate_stream_k_cta(lo, hi, kb, stages, overlap):
    """fp4_gemm_wide256_sk's producer and consumer of one CTA as Python, with the kernel's slot / parity / release
    arithmetic (fp4_gemm_wide256._steps256: overlapped steps in pairs, an odd count's last one not overlapped) and
    mbarrier semantics (wait(parity) passes once the barrier's completions have the other parity); the two run
    interleaved, each as far as it can. Returns the segments [(tile, first step, steps)] the consumer
    finished; fails on a deadlock, a slot overwritten before its release, or a step read from the wrong slot."""
    ready, empty = [0] * stages, [0] * stages        # completions
    slot_step, busy = [None] * stages, [False] * stages
    p_it = 0
    segs = []
    t_first = lo // kb
    # the consumer as a generator: yields when it must wait
    def consumer():
        it0 = 0
        for t in range(t_first, (hi - 1) // kb + 1):
            k_lo = max(lo, t * kb)
            n = min(hi, (t + 1) * kb) - k_lo
            n_even = n - n % 2                                     # _steps256: overlapped pairs, then the tail
            for j in range(n):
                it = it0 + j
                slot = it % stages
                while (ready[slot] & 1) == ((it // stages) & 1):     # wait(ready, (it // S) & 1)
                    yield
                assert slot_step[slot] == lo + it, "a step read from the wrong slot"
                if overlap and j < n_even:
                    if j > 0:                                           # wait(1) retired step it - 1
                        rel = (it + stages - 1) % stages
                        busy[rel] = False
                        empty[rel] += 1
                    if j == n_even - 1:                                 # wait(0) after the pairs
                        busy[slot] = False
                        empty[slot] += 1
                else:
                    busy[slot] = False
                    empty[slot] += 1
            it0 += n
            segs.append((t, k_lo - t * kb, n))
    cons = consumer()
    blocked = False                                                 # the consumer's last run ended waiting
    while True:
        progressed = False
        while p_it < hi - lo:                                       # the producer, as far as it can
            slot = p_it % stages
            if (empty[slot] & 1) == (((p_it // stages) & 1) ^ 1):   # wait(empty, ((it // S) & 1) ^ 1)
                break
            assert not busy[slot], "a slot refilled before the consumer released it"
            slot_step[slot], busy[slot] = lo + p_it, True
            ready[slot] += 1
            p_it += 1
            progressed = True
        assert progressed or not blocked, f"deadlock: producer at {p_it} of {hi - lo}"
        try:
            next(cons)                                              # the consumer, until it waits or ends
            blocked = True
        except StopIteration:
            break
    return segs


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("tiles,kb,g,stages", [(96, 32, 132, 3), (3, 16, 7, 3), (4, 2, 3, 5), (2, 12, 5, 8),
                                               (192, 32, 132, 3), (1, 12, 6, 2)])
def test_stream_k_ring_and_segments_emulated(tiles, kb, g, stages, overlap):
    """The stream-K CTA ranges cover every (tile, step) once; each CTA's ring (carried across its tile segments)
    neither deadlocks nor refills a slot early nor reads a stale one, with and without overlap."""
    total = tiles * kb
    covered = []
    for c in range(g):
        lo, hi = c * total // g, (c + 1) * total // g
        for t, k0, n in _simulate_stream_k_cta(lo, hi, kb, stages, overlap):
            covered += [(t, k0 + i) for i in range(n)]
    assert sorted(covered) == [(t, k) for t in range(tiles) for k in range(kb)]


@pytest.mark.parametrize("fmt,K", [("nvfp4", 1520), ("mxfp4", 1504)])
@pytest.mark.parametrize("M,grid", [(17, 0), (100, 5), (256, 0), (300, 7), (600, 3)])
def test_stream_k_matches_reference_gpu(fmt, M, K, grid, gen):
    """The stream-K schedule: one CTA per SM (grid 0) or a few CTAs (5 / 7 / 3: ranges over several whole tiles and
    tiles split over two or three CTAs, the ring carried across tile boundaries), odd N, token tiles 64 .. 256 and
    several of them; against the float64 reference and the split-K grid kernel; deterministic."""
    from trace_rl.kernels.fp4_gemm_wide256_sk import fp4_matmul_wide256_sk

    N = 199
    packed = _weight(N, K, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_wide256_sk(x, h, grid=grid)
    assert y.shape == (M, N)
    assert rel_err_dequant(y, packed, x) < 1e-2
    assert rel_err(y, fp4_matmul_wide256(x, h)) < 8e-3
    assert torch.equal(y, fp4_matmul_wide256_sk(x, h, grid=grid))


@pytest.mark.parametrize("fmt,K", [("nvfp4", 1520), ("mxfp4", 1504)])
@pytest.mark.parametrize("M", [33, 100])
def test_two_ctas_per_sm_matches_reference_gpu(fmt, M, K, gen):
    """WIDE64_2CTA (64-token tiles, 4 slots, maxnreg 80: two CTAs per SM) under both schedules, M = 100 as two token
    tiles; against the float64 reference; deterministic."""
    from trace_rl.kernels.fp4_gemm_wide256 import WIDE64_2CTA
    from trace_rl.kernels.fp4_gemm_wide256_sk import fp4_matmul_wide256_sk

    assert WIDE64_2CTA.ctas_per_sm(64) == 2 and WIDE256.ctas_per_sm(256) == 1
    packed = _weight(199, K, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    for run in (fp4_matmul_wide256, fp4_matmul_wide256_sk):
        y = run(x, h, WIDE64_2CTA)
        assert rel_err_dequant(y, packed, x) < 1e-2
        assert torch.equal(y, run(x, h, WIDE64_2CTA))


def test_stream_k_issue_shape_and_no_overlap_gpu(gen):
    """4096 x 12288 (K x N) at M = 256, one CTA per SM (96 tiles of 32 K steps over 132 ranges), both consumer
    variants, against the reference."""
    from trace_rl.kernels.fp4_gemm_wide256_sk import fp4_matmul_wide256_sk

    packed = _weight(12288, 4096, "nvfp4", gen, "cuda")
    h = to_hopper(packed.q)
    x = torch.randn(256, 4096, generator=gen).to(torch.bfloat16).cuda()
    for cfg in (VARIANTS["w256"], VARIANTS["w256_nooverlap"]):
        assert rel_err_dequant(fp4_matmul_wide256_sk(x, h, cfg), packed, x) < 1e-2


for _m in gpu36:
    test_stream_k_matches_reference_gpu = _m(test_stream_k_matches_reference_gpu)
    test_stream_k_issue_shape_and_no_overlap_gpu = _m(test_stream_k_issue_shape_and_no_overlap_gpu)
    test_two_ctas_per_sm_matches_reference_gpu = _m(test_two_ctas_per_sm_matches_reference_gpu)
    test_wide256_matches_reference_gpu = _m(test_wide256_matches_reference_gpu)
    test_wide256_variants_and_splits_gpu = _m(test_wide256_variants_and_splits_gpu)
    test_wide256_issue_shape_gpu = _m(test_wide256_issue_shape_gpu)
