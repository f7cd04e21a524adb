"""The opt-in Gluon grouped FP4 GEMM (fp4_grouped_gluon.py): launcher checks and the token-tile rule on CPU; on an
sm_90 GPU with Triton 3.6, against the torch reference (`grouped_linear_reference`) and the shipped Triton grouped
kernel at odd row counts (experts with 0, 1, 17, 46 and 70 rows: one and two token tiles), ragged N (an N tile
past the expert's rows), padded K, every token tile, nvfp4 and mxfp4, with a bias, W4A4 prequantized (row scales),
the zero tail, a persistent grid of 3 programs (the ring's phases across items) bit-identical to the default grid,
and run-to-run bit identity."""

import pytest
import torch
import triton

from trace_rl.backends.fp4 import grouped_linear_reference, prepare_expert_weights
from trace_rl.kernels.fp4_grouped_gluon import GROUPED_GLUON, fp4_grouped_matmul_gluon, token_tile
from trace_rl.kernels.hopper_fp4 import HopperFP4

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]

_SM90_36 = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and \
    triton.__version__.startswith("3.6")


def gpu(fn):
    """The GPU tests' marks (as test_fp4_gemm_gluon.py's gpu36)."""
    return pytest.mark.gpu(pytest.mark.skipif(not _SM90_36, reason="needs an sm_90 GPU and Triton 3.6 (Gluon)")(fn))

COUNTS = [17, 0, 1, 46, 0, 70, 3]            # empty experts, one row, over 16 / 32 / 64 rows (two 64-row tiles)


def _rel_err(y, ref):
    return ((y.double() - ref.double()).norm() / ref.double().norm()).item()


def test_token_tile_by_mean_rows_per_expert():
    assert [token_tile(8 * b, 128) for b in (64, 128, 192, 256, 320, 409, 512)] == [16, 16, 16, 32, 32, 64, 64]
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


@pytest.mark.parametrize("fmt,N,K", [("nvfp4", 200, 700), ("mxfp4", 136, 1000)])
@pytest.mark.parametrize("block_m", [16, 32, 64])
@pytest.mark.parametrize("bias", [False, True])
@gpu
def test_matches_reference_and_triton_kernel(fmt, N, K, block_m, bias, gen):
    from trace_rl.kernels.fp4_grouped import fp4_grouped_matmul

    experts, hw, offsets, x = _case(fmt, N, K, COUNTS, gen)
    E, R = len(COUNTS), x.shape[0]
    b = torch.randn(E, N, generator=gen).cuda() if bias else None
    ref = grouped_linear_reference(x.cuda(), offsets.cuda(), experts, "bf16", b)
    c = GROUPED_GLUON[fmt][block_m]
    out = torch.full((R, N), float("nan"), device="cuda", dtype=torch.bfloat16)
    y = fp4_grouped_matmul_gluon(x.cuda(), offsets.cuda(), hw, bias=b, config=c, out=out, zero_tail=True)
    torch.cuda.synchronize()
    used = int(offsets[-1])
    assert _rel_err(y[:used], ref[:used]) < 1e-2
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
    from trace_rl.kernels.fp4_grouped import fp4_grouped_matmul
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16
    from trace_rl.formats import per_token

    experts, hw, offsets, x = _case(fmt, 128, 1024, COUNTS, gen, tail=0)
    xb, rs = quantize_dequant_bf16(x.cuda(), per_token(fmt))
    ref = grouped_linear_reference(x.cuda(), offsets.cuda(), experts, fmt)
    y = fp4_grouped_matmul_gluon(xb, offsets.cuda(), hw, row_scale=rs, config=GROUPED_GLUON[fmt][32])
    assert _rel_err(y, ref) < 1e-2
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
    assert _rel_err(y, ref) < 1e-2
