"""FP8 operand cache for mxfp4 (kernels/operand_cache_fp8.py): the E4M3 weight is the bf16 cache's operand x 2**5
bit for bit (NaN blocks NaN, never 448) with an exactness count, a weight that does not fit keeps the bf16 cache and
one that stops fitting at a weight sync raises; the quantize kernels' E4M3 stores (plain, SiLU x mul, RMSNorm fused)
equal `rows_e4m3_reference` of their bf16 operand, and E4M3 x 2**(top - 133) is that operand exactly for blocks within
14 binades of the row's largest (rounded below, tested at the bound); inf/NaN stay non-finite; the linear on the FP8
cache equals the bf16 cache's up to float32 accumulation order, paths named. GPU: the same at Qwen3-8B shapes and
CUDA-graph replay after an in-place reload."""

import logging

import pytest
import torch

from tests.kernels.test_fp4_dequant import _q
from trace_rl.backends import PackedWeight, QuantLinear, get_backend
from trace_rl.formats import get_format
from trace_rl.kernels import fp4_dequant, operand_cache
from trace_rl.kernels import operand_cache_fp8 as f8
from trace_rl.kernels.hopper_fp4 import operand, to_hopper
from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized, hopper_weight
from trace_rl.kernels.rmsnorm_quantize import add_rms_norm_quantize
from trace_rl.kernels.row_quantize import quantize_dequant_bf16, quantize_dequant_e4m3

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _same_e4m3(a, b):
    nan = a.float().isnan()
    assert torch.equal(nan, b.float().isnan())
    assert torch.equal(a.view(torch.uint8)[~nan], b.view(torch.uint8)[~nan])


def _weight(N, K, gen):
    """An mxfp4 weight whose rows span a few binades (fits E4M3)."""
    return get_format("mxfp4").quantize(torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen)))


def _shift(row_scale):
    """2**(top - 133) from the row scale 2**(top - 138)."""
    return row_scale.double()[:, None] * 2.0 ** f8.WEIGHT_SHIFT


# ---- weight side ----

@pytest.mark.parametrize("N,K", [(37, 96), (16, 288)])
def test_weight_kernel_matches_reference(N, K, device, gen):
    """Odd shapes, with `_q`'s NaN block, a row spanning 134 binades (inexact) and a zero-exponent block: the kernel's
    bytes and inexact count equal the torch spec; NaN blocks are E4M3 NaN (the bf16 operand is +-Inf there)."""
    q = _q(N, K, "mxfp4", gen)
    h = to_hopper(q)
    ref, bad = f8.weight_e4m3_reference(h)
    op = operand(h).float()
    assert bad > 0 and ref.float()[~torch.isfinite(op)].isnan().all()
    out = torch.empty(N, K, dtype=torch.float8_e4m3fn, device=device)
    count = torch.zeros(1, dtype=torch.int32, device=device)
    f8.write_weight_e4m3(q.to(device), to_hopper(q.to(device)), out, count)
    _same_e4m3(out.cpu(), ref)
    assert int(count) == bad
    fits = _weight(N, K, gen)
    e4, bad = f8.weight_e4m3_reference(to_hopper(fits))
    assert bad == 0 and torch.equal(e4.float(), operand(to_hopper(fits)).float() * 32)    # bit-identical values


def test_weight_exactness_bound():
    """A row with blocks 14 binades below its largest is exact; 15 below, codes 0.5 and 1.5 are not."""
    K = 96
    from trace_rl.formats import QTensor

    codes = torch.full((2, K // 2), 0x11, dtype=torch.uint8)    # code 1 (0.5) in both nibbles
    codes[:, 0] = 0x33                                          # 1.5, 1.5
    scales = torch.tensor([[200, 186, 186], [200, 185, 200]], dtype=torch.uint8)
    q = QTensor(codes, scales.to(_q(1, 32, "mxfp4", torch.Generator(), False).scales.dtype), None, (2, K),
                torch.float32, "mxfp4")
    e4, bad = f8.weight_e4m3_reference(to_hopper(q))
    op = operand(to_hopper(q)).float()
    assert torch.equal(e4.float()[0], op[0] * 32)               # span 14: exact
    assert bad == 32 and not torch.equal(e4.float()[1, 32:64], op[1, 32:64] * 32)
    assert torch.equal(e4.float()[1, :32], op[1, :32] * 32)


def test_attach_checks_and_falls_back_by_name(caplog, device, gen):
    fits = PackedWeight("mxfp4", 48, 96, q=_weight(48, 96, gen).to(device))
    oc = f8.attach_fp8(fits, "layers.0.o_proj")
    assert oc is not None and f8.attach_fp8(fits) is oc and f8.is_fp8(fits) and oc.nbytes == 48 * 96
    assert oc.buf.dtype == torch.float8_e4m3fn
    assert torch.equal(oc.buf.float().cpu(), operand(hopper_weight(fits)).float().cpu() * 32)
    wide = PackedWeight("mxfp4", 48, 96, q=_q(48, 96, "mxfp4", gen).to(device))
    odd = PackedWeight("mxfp4", 37, 96, q=_weight(37, 96, gen).to(device))
    with caplog.at_level(logging.WARNING):
        assert f8.attach_fp8(wide, "layers.1.down_proj") is None
        assert f8.attach_fp8(odd, "layers.2.q_proj") is None
    assert "layers.1.down_proj keeps the bf16 cache: " in caplog.text and operand_cache.KEY not in wide.layout
    assert "layers.2.q_proj keeps the bf16 cache: torch._scaled_mm needs N and K multiples of 16" in caplog.text
    with pytest.raises(ValueError, match="nvfp4 operands need up to 6 significant bits"):
        f8.attach_fp8(PackedWeight("nvfp4", 37, 96, q=_q(37, 96, "nvfp4", gen).to(device)))
    with pytest.raises(ValueError, match="FP8 operand caches"):
        operand_cache.attach_stacked([fits, PackedWeight("mxfp4", 48, 96, q=_weight(48, 96, gen).to(device))])


def test_reload_refreshes_in_place_and_refuses_rounding(device, gen):
    """QuantLinear.load_weight rewrites the E4M3 buffer in place; a new weight E4M3 cannot hold raises, naming it."""
    N, K = 32, 160
    layer = QuantLinear(torch.randn(N, K, generator=gen), "mxfp4").to(device)
    oc = f8.attach_fp8(layer.packed, "layers.3.mlp.down_proj")
    ptr = oc.buf.data_ptr()
    w1 = torch.randn(N, K, generator=gen) * 3
    layer.load_weight(w1.to(device))
    assert oc.buf.data_ptr() == ptr and operand_cache.cached(layer.packed) is oc
    assert torch.equal(oc.buf.float().cpu(), operand(to_hopper(get_format("mxfp4").quantize(w1))).float() * 32)
    w2 = w1.clone()
    w2[0, :32] = torch.linspace(0.1, 6.0, 32) * 2.0 ** -20     # a block ~21 binades below its row's largest
    with pytest.raises(f8.InexactWeight, match="layers.3.mlp.down_proj: .* rollout.operand_cache: bf16"):
        layer.load_weight(w2.to(device))


# ---- activation side ----

@pytest.mark.parametrize("M,K", [(5, 96), (3, 288)])
def test_activation_kernels_match_reference(M, K, device, gen):
    x = (torch.randn(M, K, generator=gen) * torch.exp(2 * torch.randn(M, 1, generator=gen))).to(torch.bfloat16)
    x[0, 40:45] = 0                            # zero blocks / elements
    x = x.to(device)
    a8, rs = quantize_dequant_e4m3(x)
    xb, none = quantize_dequant_bf16(x, "mxfp4")
    r8, rrs = f8.rows_e4m3_reference(xb)
    _same_e4m3(a8.cpu(), r8.cpu())
    assert none is None and torch.equal(rs.cpu(), rrs.cpu())
    assert torch.equal((a8.double() * _shift(rs)).cpu(), xb.double().cpu())     # bit-identical operand values
    gu = torch.randn(M, 2 * K, generator=gen).to(torch.bfloat16).to(device)       # SiLU x mul in the same launch
    s8, srs = quantize_dequant_e4m3(gu, silu_mul=True)
    sb, _ = quantize_dequant_bf16(gu, "mxfp4", silu_mul=True)
    _same_e4m3(s8.cpu(), f8.rows_e4m3_reference(sb)[0].cpu())
    assert torch.equal((s8.double() * _shift(srs)).cpu(), sb.double().cpu())
    res = torch.randn(M, K, generator=gen).to(torch.bfloat16).to(device)
    nw = torch.randn(K, generator=gen).to(torch.bfloat16).to(device)
    _, _, n8, nrs = add_rms_norm_quantize(x, res, nw, 1e-6, "mxfp4", store_h=False, e4m3=True)
    _, _, nb, _ = add_rms_norm_quantize(x, res, nw, 1e-6, "mxfp4", store_h=False)
    _same_e4m3(n8.cpu(), f8.rows_e4m3_reference(nb)[0].cpu())
    assert n8.dtype == torch.float8_e4m3fn and torch.equal((n8.double() * _shift(nrs)).cpu(), nb.double().cpu())
    with pytest.raises(ValueError, match="E4M3 rows are mxfp4's"):
        add_rms_norm_quantize(x, res, nw, 1e-6, "nvfp4:row", e4m3=True)


def test_activation_exactness_bound(device):
    """Blocks 0, 14 and 15 binades below the row's largest: exact down to 14; at 15 the codes 0.5 and 1.5 round
    (ties to even: 0.5 -> 0, 1.5 -> 2 in units of E4M3's smallest subnormal), the others stay exact."""
    K = 128
    vals = torch.tensor([6.0, 0.5, 1.5, 1.0, 3.0, 4.0, 2.0, 0.5] * 4)
    x = torch.cat([vals * 2.0 ** k for k in (0, -14, -15, -20)]).reshape(1, K).to(torch.bfloat16).to(device)
    a8, rs = quantize_dequant_e4m3(x)
    xb, _ = quantize_dequant_bf16(x, "mxfp4")
    back = (a8.double() * _shift(rs)).cpu()[0]
    ref = xb.double().cpu()[0]
    assert torch.equal(back[:64], ref[:64])
    third = back[64:96].reshape(4, 8)[0]
    assert torch.equal(third / third[0] * 6.0, torch.tensor([6.0, 0, 2.0, 1.0, 3.0, 4.0, 2.0, 0], dtype=torch.float64))
    assert (back[96:] != ref[96:]).any()        # 20 binades below: rounded (what the docs say may happen)


def test_nan_and_inf_stay_non_finite(device):
    """inf in a block makes it NaN (never the saturated 448 a CPU cast would give); NaN stays NaN; other blocks and
    rows are unaffected."""
    x = torch.randn(3, 64).to(torch.bfloat16)
    x[0, 3] = float("inf")
    x[1, 40] = float("nan")
    x[2, 0] = -float("inf")
    x = x.to(device)
    a8, rs = quantize_dequant_e4m3(x)
    v = a8.float().cpu()
    assert v[0, :32].isnan().all() and v[1, 32:].isnan().all() and v[2, :32].isnan().all()
    assert torch.isfinite(v[0, 32:]).all() and torch.isfinite(v[1, :32]).all() and torch.isfinite(rs.cpu()).all()
    assert torch.isinf(torch.tensor(float("inf")).to(torch.float8_e4m3fn).float()).logical_not()   # why it matters
    e4, _ = f8.rows_e4m3_reference(torch.tensor([[float("inf"), 1.0] * 16], dtype=torch.bfloat16))
    assert e4.float()[0, 0].isnan() and e4.float()[0, 1] == 256      # 1.0 = code 4 x 2**-2: top 125


# ---- the GEMM and the linear ----

def _pair(N, K, gen, device, bias=False):
    q = _weight(N, K, gen).to(device)
    bf, fp = PackedWeight("mxfp4", N, K, q=q), PackedWeight("mxfp4", N, K, q=q)
    operand_cache.attach(bf)
    assert f8.attach_fp8(fp) is not None
    return bf, fp


@pytest.mark.parametrize("N,K", [(64, 96), (48, 288)])
def test_linear_on_fp8_cache_equals_bf16_cache(N, K, monkeypatch, device, gen):
    """W4A4 mxfp4 from the (lowered) threshold: the float32 accumulators agree up to summation order (the operands
    are the same values), the outputs after the shared epilogue to bf16 rounding; below it the FP4 GEMM runs."""
    bf, fp = _pair(N, K, gen, device)
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 5)
    x = torch.randn(7, K, generator=gen).to(torch.bfloat16).to(device)
    bias = torch.randn(N, generator=gen).to(device)
    xb, _ = quantize_dequant_bf16(x, "mxfp4")
    a8, rs = quantize_dequant_e4m3(x)
    y_bf = fp4_dequant.accumulate(xb, operand_cache.cached(bf).buf).double()
    y_8 = fp4_dequant.accumulate(a8, operand_cache.cached(fp).buf).double() * rs.double()[:, None]
    # exact products, float32 sums in another order: the H200 (use_fast_accum False) measured the FP8 accumulator's
    # error against a float64 sum at 0 at Qwen3-8B shapes (fp8cache_h200_1202f_summary.json); fast accumulation
    # showed ~1e-4 there, which these bounds reject
    tol = 1e-6 if device == "cpu" else 1e-5
    assert torch.allclose(y_8, y_bf, rtol=tol, atol=tol * y_bf.abs().max().item())
    out_bf = fp4_linear(x, bf, "mxfp4", bias)
    out_8 = fp4_linear(x, fp, "mxfp4", bias)
    assert out_8.dtype == torch.bfloat16 and torch.allclose(out_8.float(), out_bf.float(), rtol=1e-2, atol=1e-2)
    pre = fp4_linear_prequantized(a8, rs, fp, bias)
    assert torch.equal(pre.cpu(), out_8.cpu())
    with pytest.raises(ValueError, match="reads its FP8 operand cache"):
        fp4_linear_prequantized(xb, None, fp, bias)
    with pytest.raises(ValueError, match="does not read its FP8 operand cache"):
        fp4_linear_prequantized(a8, rs, bf, bias)
    with pytest.raises(ValueError, match="W4A16 bf16 activations are not E4M3"):
        fp4_linear(x, fp, "bf16")
    small = fp4_linear(x[:4], fp, "mxfp4", bias)              # below the threshold: the FP4 GEMM on the packed weight
    assert torch.allclose(small.float(), out_bf[:4].float(), rtol=2e-2, atol=2e-2)


def test_backend_records_the_fp8_paths(monkeypatch, device, gen):
    """The fp4 backend's W4A4 producers emit E4M3 for a consumer reading its FP8 cache and the linear records
    fp4.operand_cache_fp8; bf16 rows reaching it are converted by the named cast path (the same values)."""
    from trace_rl.backends import fp4 as fp4_backend

    monkeypatch.setattr(fp4_backend, "_on_kernels", lambda x: True)
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 5)
    backend = get_backend("fp4")
    bf, fp = _pair(48, 96, gen, device)
    x = torch.randn(6, 96, generator=gen).to(torch.bfloat16).to(device)
    xq = backend.quantize_input(x, fp, "mxfp4")
    assert xq.x.dtype == torch.float8_e4m3fn and xq.row_scale is not None
    y = backend.linear_quantized(xq, fp)
    assert backend.paths.last == "fp4.operand_cache_fp8"
    xb = backend.quantize_input(x, bf, "mxfp4")
    assert xb.x.dtype == torch.bfloat16
    y_cast = backend.linear_quantized(xb, fp)
    assert backend.paths.counts["fp4.operand_cache_fp8_cast"] >= 1 and torch.equal(y_cast, y)
    assert backend.linear_stacked(xq, [fp, fp]) is None


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("N,K", [(6144, 4096), (4096, 12288)])
def test_fp8_cache_at_qwen3_shapes_gpu(N, K, gen):
    """Qwen3-8B's q/k/v and down shapes at M = 128 / 313 / 512: the weight kernel's bytes = the torch spec and E4M3 =
    the bf16 operand x 32 (every value); the activations' E4M3 stores = their spec and x 2**(top - 133) = the bf16
    operand; the FP8 accumulator (use_fast_accum False) against a float64 sum of the same values, next to the bf16
    GEMM's; the linear's output against the bf16 cache's; the backend names fp4.operand_cache_fp8."""
    w = (torch.randn(N, K, generator=gen) * torch.exp(0.5 * torch.randn(N, 1, generator=gen))).cuda()
    backend = get_backend("fp4")
    q = backend.prepare_weight(w, "mxfp4").q
    bf, fp = PackedWeight("mxfp4", N, K, q=q), PackedWeight("mxfp4", N, K, q=q)
    wb = operand_cache.attach(bf).buf
    oc = f8.attach_fp8(fp, "gpu")
    assert oc is not None
    ref, bad = f8.weight_e4m3_reference(hopper_weight(fp))
    assert bad == 0
    _same_e4m3(oc.buf, ref)
    assert torch.equal(oc.buf.double(), wb.double() * 32)
    for M in (128, 313, 512):
        x = (torch.randn(M, K, generator=gen) * torch.exp(torch.randn(M, 1, generator=gen))).to(torch.bfloat16).cuda()
        xb, _ = quantize_dequant_bf16(x, "mxfp4")
        a8, rs = quantize_dequant_e4m3(x)
        _same_e4m3(a8, f8.rows_e4m3_reference(xb)[0])
        assert torch.equal(a8.double() * _shift(rs), xb.double())
        exact = xb.double() @ wb.double().t()
        scale = exact.abs().max()
        e_bf = ((fp4_dequant.accumulate(xb, wb).double() - exact).abs().max() / scale).item()
        e_8 = ((fp4_dequant.accumulate(a8, oc.buf).double() * rs.double()[:, None] - exact).abs().max() / scale).item()
        print(f"{N}x{K} M={M}: accumulator max error / max |sum|: bf16 {e_bf:.2e}, fp8 {e_8:.2e}")
        assert e_bf < 1e-5 and e_8 < 1e-5       # both measured 0 on the H200 (exact accumulation mode)
        y_bf, y_8 = fp4_linear(x, bf, "mxfp4"), fp4_linear(x, fp, "mxfp4")
        rel = ((y_8.double() - y_bf.double()).norm() / y_bf.double().norm()).item()
        assert rel < 2e-3
    layer = QuantLinear(w.to(torch.bfloat16), "mxfp4", act_fmt="mxfp4")
    assert f8.attach_fp8(layer.packed) is not None
    layer(torch.randn(313, K, device="cuda", dtype=torch.bfloat16))
    assert backend.paths.last == "fp4.operand_cache_fp8"
    layer(torch.randn(127, K, device="cuda", dtype=torch.bfloat16))
    assert backend.paths.last != "fp4.operand_cache_fp8"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fp8_cache_graph_replay_after_reload_gpu(gen, capture):
    """A captured graph reads the E4M3 cache (and the E4M3 activations); load_weight (fused sync) rewrites it in place
    and checks it; replay gives the new weight's result."""
    w = torch.randn(4096, 4096, generator=gen).to(torch.bfloat16).cuda()
    layer = QuantLinear(w, "mxfp4", act_fmt="mxfp4")
    oc = f8.attach_fp8(layer.packed, "o_proj")
    ptr = oc.buf.data_ptr()
    x = torch.randn(313, 4096, generator=gen).to(torch.bfloat16).cuda()
    g, out = capture(lambda: layer(x))
    layer.load_weight(-2 * w)
    assert oc.buf.data_ptr() == ptr
    assert torch.equal(oc.buf.double(), operand(hopper_weight(layer.packed)).double() * 32)
    g.replay()
    torch.cuda.synchronize()
    expect = layer(x)
    rel = ((out.double() - expect.double()).norm() / expect.double().norm()).item()
    assert rel < 1e-3
