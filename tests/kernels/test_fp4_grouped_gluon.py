"""The Gluon grouped FP4 GEMM (fp4_grouped_gluon.py; which calls take it: grouped_dispatch.py): launcher checks and
the token-tile rule on CPU; on an sm_90 GPU with Triton 3.6, against the torch reference (`grouped_linear_reference`)
and the shipped Triton grouped kernel at odd row counts (experts with 0, 1, 17, 46 and 70 rows: one and two token
tiles), ragged N (an N tile past the expert's rows), padded K, every token tile and benchmark variant (overlap
included), nvfp4 and mxfp4, with a bias, W4A4 prequantized (row scales), the zero tail, a persistent grid of 3
programs (the ring's phases across items) bit-identical to the default grid, and run-to-run bit identity."""

import pytest
import torch

from tests.gpu_marks import gpu36
from tests.kernels._compare import rel_err
from trace_rl.backends.fp4 import grouped_linear_reference, prepare_expert_weights
from trace_rl.kernels.fp4_grouped_gluon import GLUON_VARIANTS, GROUPED_GLUON, fp4_grouped_matmul_gluon, token_tile
from trace_rl.kernels.hopper_fp4 import HopperFP4

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def gpu(fn):
    """The GPU tests' marks (tests/gpu_marks.gpu36)."""
    return gpu36[0](gpu36[1](fn))


COUNTS = [17, 0, 1, 46, 0, 70, 3]            # empty experts, one row, over 16 / 32 / 64 rows (two 64-row tiles)


def test_token_tile_by_mean_rows_per_expert():
    """TILE_RULE (the H200 measurements; the dispatch's cases: tests/kernels/test_grouped_dispatch.py)."""
    batches = (64, 128, 192, 256, 320, 409, 512)
    assert [token_tile(8 * b, 128) for b in batches] == [16, 16, 16, 32, 32, "32d", "32d"]
    assert [token_tile(8 * b, 128, "mxfp4") for b in batches] == [16, 16, 16, "32x64ob", "32x64ob", "32x64ob", 64]
    assert token_tile(0, 128) == 16


def test_launcher_refuses_what_tma_cannot_load():
    w = HopperFP4.empty("mxfp4", 64, 768, "cpu", experts=2)        # 24-byte scale rows (the 30B-A3B down, mxfp4)
    x = torch.zeros(4, 768, dtype=torch.bfloat16)
    offs = torch.tensor([0, 2, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="not a multiple of the 512-column K step|16 \\(TMA\\)"):
        fp4_grouped_matmul_gluon(x, offs, w)
    w = HopperFP4.empty("nvfp4", 64, 256, "cpu")                    # not stacked
    with pytest.raises(ValueError, match="stacked"):
        fp4_grouped_matmul_gluon(torch.zeros(4, 256, dtype=torch.bfloat16), offs, w)
    w = HopperFP4.empty("nvfp4", 64, 256, "cpu", experts=2)
    with pytest.raises(ValueError, match="offsets must be int32"):
        fp4_grouped_matmul_gluon(torch.zeros(4, 256, dtype=torch.bfloat16), offs.long(), w)


def _case(fmt, N, K, counts, gen, tail=3, device="cuda"):
    from trace_rl.kernels.linear import hopper_weight

    E = len(counts)
    w = torch.randn(E, N, K, generator=gen) * torch.exp(torch.randn(E, 1, 1, generator=gen))
    experts = prepare_expert_weights(w.to(device), fmt)
    offsets = torch.tensor([0] + torch.tensor(counts).cumsum(0).tolist(), dtype=torch.int32)
    x = torch.randn(int(sum(counts)) + tail, K, generator=gen).to(torch.bfloat16)
    return experts, hopper_weight(experts), offsets, x


_TILES = [(f, N, K, t) for f, N, K in (("nvfp4", 200, 720), ("mxfp4", 136, 992)) for t in ("16", "32", "64")] + \
    [("nvfp4", 200, 720, "v" + v) for v in GLUON_VARIANTS]


@pytest.mark.parametrize("fmt,N,K,tile", _TILES, ids=[f"{f}-{t}" for f, _, _, t in _TILES])
@gpu
def test_matches_reference_and_triton_kernel(fmt, N, K, tile, gen):
    """Every token tile (the 32-token one with a bias) and, for nvfp4, every benchmark variant ("v..." ids)."""
    from trace_rl.kernels.fp4_grouped import fp4_grouped_matmul

    c = GLUON_VARIANTS[tile[1:]] if tile.startswith("v") else GROUPED_GLUON[fmt][int(tile)]
    experts, hw, offsets, x = _case(fmt, N, K, COUNTS, gen)
    E, R = len(COUNTS), x.shape[0]
    b = torch.randn(E, N, generator=gen).cuda() if tile == "32" else None
    ref = grouped_linear_reference(x.cuda(), offsets.cuda(), experts, "bf16", b)
    out = torch.full((R, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = fp4_grouped_matmul_gluon(x.cuda(), offsets.cuda(), hw, bias=b, config=c, out=out, zero_tail=True)
    torch.cuda.synchronize()
    used = int(offsets[-1])
    assert rel_err(y[:used], ref[:used]) < 1e-2
    assert not y[used:].any(), "the rows past offsets[E] must come back as zeros (zero_tail)"
    tri = fp4_grouped_matmul(x.cuda(), offsets.cuda(), hw, bias=b)
    torch.testing.assert_close(y[:used].float(), tri[:used].float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item())
    again = fp4_grouped_matmul_gluon(x.cuda(), offsets.cuda(), hw, bias=b, config=c, programs=3, zero_tail=True)
    assert torch.equal(again, y), "the persistent grid's size must not change a bit (no split-K, fixed order)"
    assert torch.equal(fp4_grouped_matmul_gluon(x.cuda(), offsets.cuda(), hw, bias=b, config=c, zero_tail=True), y)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@gpu
def test_w4a4_prequantized_matches_triton_kernel(fmt, gen):
    """W4A4 with the activations quantized first (`row_quantize.quantize_dequant_bf16`, the shipped separate launch):
    the same operand and row scales into both kernels; against the torch reference's fake-quantized activations."""
    from trace_rl.formats import per_token
    from trace_rl.kernels.fp4_grouped import fp4_grouped_matmul
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    experts, hw, offsets, x = _case(fmt, 128, 1024, COUNTS, gen, tail=0)
    xb, rs = quantize_dequant_bf16(x.cuda(), per_token(fmt))
    ref = grouped_linear_reference(x.cuda(), offsets.cuda(), experts, fmt)
    y = fp4_grouped_matmul_gluon(xb, offsets.cuda(), hw, row_scale=rs, config=GROUPED_GLUON[fmt][32])
    assert rel_err(y, ref) < 1e-2
    tri = fp4_grouped_matmul(xb, offsets.cuda(), hw, row_scale=rs)
    torch.testing.assert_close(y.float(), tri.float(), rtol=2e-2, atol=2e-2 * ref.abs().max().item())


@gpu
def test_moe_shape_all_experts_one_tile(gen):
    """The Qwen3-30B-A3B gate+up shape at 409 tokens' routing (top-8 of 128, seed fixed), default tile."""
    torch.manual_seed(0)
    E, N, K, B = 128, 1536, 2048, 409
    ids = torch.randn(B, E).topk(8, dim=1).indices.reshape(-1)
    counts = torch.bincount(ids, minlength=E).tolist()
    experts, hw, offsets, x = _case("nvfp4", N, K, counts, gen, tail=0)
    ref = grouped_linear_reference(x.cuda(), offsets.cuda(), experts, "bf16")
    y = fp4_grouped_matmul_gluon(x.cuda(), offsets.cuda(), hw)
    assert rel_err(y, ref) < 1e-2


def _box(t: torch.Tensor, start: list, size: list) -> torch.Tensor:
    """A TMA box: t[start : start + size] per dim, zero past t's end."""
    out = torch.zeros(size, dtype=t.dtype)
    src = t[tuple(slice(s, min(s + n, d)) for s, n, d in zip(start, size, t.shape))]
    out[tuple(slice(0, n) for n in src.shape)] = src
    return out


def _view(desc) -> torch.Tensor:
    return torch.as_strided(desc.base, desc.shape, desc.strides)


@pytest.mark.parametrize("fmt,N,K", [("nvfp4", 200, 720), ("mxfp4", 136, 992), ("nvfp4", 1536, 2048)])
@pytest.mark.parametrize("block_m", [16, 64])
def test_descriptor_boxes_and_schedule(fmt, N, K, block_m, gen):
    """CPU check of what the compile gate cannot see: (1) the persistent partition (`schedule`, which both partitions
    follow) covers every expert's rows exactly once per N tile at any grid size; (2) the boxes the producer loads
    through the stacked TMA views (real descriptors, validated) at the kernel's coordinates are the expert's own
    dense boxes (fp4_gemm_gluon's, whose decode the dense tests prove) wherever the tile's rows are the expert's,
    and the activation box starts at the tile's first row."""
    from trace_rl.backends import get_backend
    from trace_rl.kernels.fp4_grouped_gluon import grouped_descriptors, schedule, tma_rows
    from trace_rl.kernels.hopper_fp4 import to_hopper

    counts = COUNTS[:4]
    E = len(counts)
    per = [to_hopper(get_backend("fp4").prepare_weight(torch.randn(N, K, generator=gen), fmt).q) for _ in range(E)]
    hw = HopperFP4(fmt, N, K, torch.stack([h.values for h in per]), torch.stack([h.scales for h in per]),
                   torch.stack([h.row_factor for h in per]))
    c = GROUPED_GLUON[fmt][block_m]
    np_, kp = hw.padded
    bk, BN = c.bk(fmt), c.block_n
    nt, kc, sw = -(-np_ // BN), bk // 128, bk // (128 if fmt == "mxfp4" else 64)
    offsets = [0] + torch.tensor(counts).cumsum(0).tolist()
    x = torch.randn(offsets[-1] + 2, K, generator=gen).to(torch.bfloat16)
    w_desc, s_desc, x_desc = grouped_descriptors(tma_rows(x), hw, c)
    vw, vs, vx = _view(w_desc), _view(s_desc), _view(x_desc)
    for nprog in (1, 3, 7):
        seen = {}
        for pid in range(nprog):
            for e, n, row0 in schedule(offsets, nt, block_m, pid, nprog):
                for r in range(row0, min(row0 + block_m, offsets[e + 1])):
                    seen[(r, n)] = seen.get((r, n), 0) + 1
                    assert offsets[e] <= r < offsets[e + 1]
        assert seen == {(r, n): 1 for r in range(offsets[-1]) for n in range(nt)}
    dense_v = [h.values.view(np_ // 16, kp // 128, 256).permute(1, 0, 2) for h in per]
    dense_s = [h.scales.view(torch.int32) for h in per]
    for e, n, row0 in schedule(offsets, nt, block_m, 0, 1):
        own = min(BN, np_ - n * BN)           # the tile's rows that are this expert's (the rest: masked at the store)
        for kb in range(kp // bk):
            got_w = _box(vw, [kb * kc, (e * np_ + n * BN) // 16, 0], [kc, BN // 16, 256])
            want_w = _box(dense_v[e], [kb * kc, n * BN // 16, 0], [kc, BN // 16, 256])
            assert torch.equal(got_w[:, : own // 16], want_w[:, : own // 16])
            got_s = _box(vs, [e * np_ + n * BN, kb * sw], [BN, sw])
            assert torch.equal(got_s[:own], _box(dense_s[e], [n * BN, kb * sw], [BN, sw])[:own])
            got_x = _box(vx, [row0, kb * bk], [block_m, bk])
            rows = min(block_m, offsets[e + 1] - row0)
            want_x = _box(x, [row0, kb * bk], [rows, bk])
            assert torch.equal(got_x[:rows], want_x)
