"""Grouped (mixture-of-experts) FP4 GEMM against its torch reference: uneven and empty experts, rows past the
last offset, W4A16 and W4A4, a stacked re-layout equal to the per-expert one."""

import pytest
import torch

from trace_rl.backends.fp4 import grouped_linear_reference, prepare_expert_weights
from trace_rl.kernels.linear import fp4_grouped_linear

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _rel_err(y, ref):
    return ((y.double().cpu() - ref.double().cpu()).norm() / ref.double().cpu().norm()).item()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("act", ["bf16", "fp4"])
def test_grouped_matches_reference(fmt, act, device, gen):
    E, N, K = 5, 40, 160 if fmt == "nvfp4" else 192
    act_fmt = fmt if act == "fp4" else "bf16"
    w = torch.randn(E, N, K, generator=gen) * torch.exp(torch.randn(E, 1, 1, generator=gen))
    experts = prepare_expert_weights(w, fmt)
    counts = torch.tensor([3, 0, 17, 1, 9])                  # an empty expert, a count over the M tile
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32)
    R = int(counts.sum()) + 4                                # 4 spare rows past offsets[E] (capacity padding)
    x = torch.randn(R, K, generator=gen).to(torch.bfloat16)
    bias = torch.randn(E, N, generator=gen) if act == "bf16" else None
    ref = grouped_linear_reference(x, offsets, experts, act_fmt, bias)
    dev = experts.__class__(fmt, N, K, q=experts.q.to(device))
    y = fp4_grouped_linear(x.to(device), offsets.to(device), dev, act_fmt,
                           None if bias is None else bias.to(device))
    assert y.shape == (R, N) and y.dtype == x.dtype
    assert _rel_err(y[: R - 4], ref[: R - 4]) < 1e-2
    assert not y[R - 4:].any()


def test_grouped_rejects_bad_offsets(device, gen):
    experts = prepare_expert_weights(torch.randn(3, 64, 128, generator=gen), "nvfp4")
    experts = experts.__class__("nvfp4", 64, 128, q=experts.q.to(device))
    x = torch.zeros(4, 128, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="offsets must be int32"):
        fp4_grouped_linear(x, torch.zeros(3, dtype=torch.int32, device=device), experts)
    with pytest.raises(ValueError, match=r"\[E, N, K\]"):
        from trace_rl.backends import get_backend

        fp4_grouped_linear(x, torch.zeros(4, dtype=torch.int32, device=device),
                           get_backend("fp4").prepare_weight(torch.randn(64, 128, generator=gen).to(device), "nvfp4"))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_stacked_relayout_equals_per_expert(fmt, device, gen):
    from trace_rl.kernels.fp4_relayout import relayout
    from trace_rl.kernels.hopper_fp4 import expert_q, to_hopper

    experts = prepare_expert_weights(torch.randn(3, 40, 256, generator=gen), fmt)
    st = relayout(experts.q.to(device))
    for e in range(3):
        ref = to_hopper(expert_q(experts.q, e))
        assert torch.equal(st.values[e].cpu(), ref.values)
        assert torch.equal(st.scales[e].cpu(), ref.scales)
        assert torch.equal(st.row_factor[e].cpu().view(torch.int32), ref.row_factor.view(torch.int32))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_in_kernel_act_quant_matches_separate_quantizer(fmt, device, gen):
    """W4A4 with the activations quantized in the grouped kernel's K loop gives the same output, bit for bit,
    as the row quantize kernel + the grouped kernel: the operand (codes x block scales, row global) is the
    same. Odd K (not a multiple of the K tile), an all-zero row, a NaN row, a wide dynamic range."""
    E, N, K = 3, 48, 160 if fmt == "nvfp4" else 224
    experts = prepare_expert_weights(torch.randn(E, N, K, generator=gen), fmt)
    experts = experts.__class__(fmt, N, K, q=experts.q.to(device))
    counts = torch.tensor([5, 0, 19])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32).to(device)
    x = torch.randn(24, K, generator=gen) * torch.exp(3 * torch.randn(24, 1, generator=gen))
    x[2] = 0.0
    x[7, 5] = float("nan")
    x = x.to(torch.bfloat16).to(device)
    fused = fp4_grouped_linear(x, offsets, experts, fmt, fuse_act_quant=True)
    separate = fp4_grouped_linear(x, offsets, experts, fmt, fuse_act_quant=False)
    assert torch.equal(fused.isnan(), separate.isnan()) and fused[7].isnan().any()
    assert torch.equal(fused.nan_to_num(0.0), separate.nan_to_num(0.0))
    assert not fused[2].any()


@pytest.mark.parametrize("act", ["bf16", "nvfp4"])
def test_grouped_linear_with_fused_producers(act, device, gen):
    """`src_rows` (the experts' permute) and `silu_mul` (SwiGLU) as producers of the grouped input give what
    running them first gives (W4A4: the tokens quantized once then gathered, SwiGLU fused into the quantize
    launch; W4A16: run ahead)."""
    from trace_rl.kernels.swiglu import silu_mul

    E, N, K = 3, 40, 96
    experts = prepare_expert_weights(torch.randn(E, N, K, generator=gen), "nvfp4")
    experts = experts.__class__("nvfp4", N, K, q=experts.q.to(device))
    offsets = torch.tensor([0, 4, 4, 9], dtype=torch.int32, device=device)
    tokens = torch.randn(5, K, generator=gen).to(torch.bfloat16).to(device)
    src = torch.tensor([4, 0, 2, 5, 1, 3, 3, 0, 2, 1], device=device)              # 5 = a zero row; row 9 unused
    gathered = torch.cat([tokens, tokens.new_zeros(1, K)])[src]
    want = fp4_grouped_linear(gathered, offsets, experts, act)
    got = fp4_grouped_linear(tokens, offsets, experts, act, src_rows=src)
    assert got.shape == (10, N) and torch.equal(got, want)
    gate_up = (2 * torch.randn(10, 2 * K, generator=gen)).to(torch.bfloat16).to(device)
    assert torch.equal(fp4_grouped_linear(gate_up, offsets, experts, act, silu_mul=True),
                       fp4_grouped_linear(silu_mul(gate_up), offsets, experts, act))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_dual_tiles_match_reference(fmt, device, gen):
    """A dual config (a 64-row tile as two 32-row halves sharing each decoded weight tile; a tile with at most 32
    rows runs one half): experts with 0, 5, 40 (both halves) and 70 rows (a dual tile, then a single one)."""
    from trace_rl.kernels.fp4_gemm import GemmConfig

    E, N, K = 4, 40, 256
    experts = prepare_expert_weights(torch.randn(E, N, K, generator=gen), fmt)
    counts = torch.tensor([5, 0, 40, 70])
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), counts.cumsum(0)]).to(torch.int32)
    x = torch.randn(int(counts.sum()) + 3, K, generator=gen).to(torch.bfloat16)
    bias = torch.randn(E, N, generator=gen)
    ref = grouped_linear_reference(x, offsets, experts, "bf16", bias)
    dev = experts.__class__(fmt, N, K, q=experts.q.to(device))
    cfg = GemmConfig(64, 64, 256, dual=True)
    y = fp4_grouped_linear(x.to(device), offsets.to(device), dev, "bf16", bias.to(device), config=cfg)
    assert _rel_err(y[:-3], ref[:-3]) < 1e-2 and not y[-3:].any()
    single = fp4_grouped_linear(x.to(device), offsets.to(device), dev, "bf16", bias.to(device),
                                config=GemmConfig(32, 64, 256))
    torch.testing.assert_close(y, single, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="dual"):
        fp4_grouped_linear(x.to(device), offsets.to(device), dev, fmt, config=cfg, fuse_act_quant=True)
