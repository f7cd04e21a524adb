"""Persistent operand cache (kernels/operand_cache.py): the cached bf16 operand equals the Hopper layout's `operand(h)`
bit for bit (nvfp4 / mxfp4, NaN / zero / negative / subnormal scales); every weight sync refreshes it in place (the
fused and the requantize `load_weight`, `refresh_layouts` after an in-place copy); the linear on the cache equals the
dequant path bit for bit from the threshold on (odd shapes, W4A16 / W4A4, bias, any weight size) and is not used
below it. GPU: the 4096x12288 weight at M = 128 / 359 / 512 and CUDA-graph replay after an in-place reload."""

import pytest
import torch

from tests.kernels.test_fp4_dequant import _q, _same_bits
from trace_rl.backends import PackedWeight, QuantLinear, get_backend
from trace_rl.backends.fp4 import FP4Backend
from trace_rl.formats import get_format, per_token
from trace_rl.kernels import fp4_dequant, gemm_dispatch, operand_cache
from trace_rl.kernels.hopper_fp4 import operand, to_hopper
from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized, hopper_weight
from trace_rl.kernels.row_quantize import quantize_dequant_bf16

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_cache_holds_the_layout_operand(fmt, device, gen):
    N, K = 37, 96
    q = _q(N, K, fmt, gen)              # NaN, zero, negative, subnormal scales; mxfp4 products in bf16 subnormals
    packed = PackedWeight(fmt, N, K, q=q.to(device))
    oc = operand_cache.attach(packed)
    assert operand_cache.attach(packed) is oc and operand_cache.cached(packed) is oc
    assert oc.buf.dtype == torch.bfloat16 and tuple(oc.buf.shape) == (N, K) and oc.nbytes == 2 * N * K
    _same_bits(oc.buf.cpu(), operand(to_hopper(q)))
    assert list(packed.layout) == ["hopper_fp4", operand_cache.KEY]     # the layout is refreshed first


def test_attach_refuses_other_weights():
    with pytest.raises(ValueError, match="dense nvfp4/mxfp4"):
        operand_cache.attach(PackedWeight("bf16", 4, 32, weight=torch.zeros(4, 32)))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("fused_sync", [False, True])
def test_reload_refreshes_in_place(fmt, fused_sync, monkeypatch, device, gen):
    """QuantLinear.load_weight (fused: quantize + relayout in the interpreter; else requantize + copy) and an in-place
    copy into the buffers + refresh_layouts (distributed.weight_sync.load_packed): same buffer, the new operand."""
    monkeypatch.setattr(FP4Backend, "fused_sync_runs", lambda self, w: fused_sync)
    N, K = 19, 160
    w0 = torch.randn(N, K, generator=gen)
    layer = QuantLinear(w0, fmt).to(device)
    oc = operand_cache.attach(layer.packed)
    ptr = oc.buf.data_ptr()
    before = oc.buf.clone()
    w1 = torch.randn(N, K, generator=gen) * 3
    layer.load_weight(w1.to(device))
    assert get_backend("fp4").paths.last == ("fp4.sync.fused" if fused_sync else "fp4.sync.requantize")
    assert oc.buf.data_ptr() == ptr and operand_cache.cached(layer.packed) is oc
    ref = operand(to_hopper(get_format(fmt).quantize(w1)))
    _same_bits(oc.buf.cpu(), ref)
    assert not torch.equal(oc.buf.cpu(), before.cpu())
    q2 = get_format(fmt).quantize(-w0)           # load_packed: the buffers copied in place, then refresh_layouts
    layer.w_codes.copy_(q2.codes)
    layer.w_scales.copy_(q2.scales)
    if layer.w_global_scale is not None:
        layer.w_global_scale.copy_(q2.global_scale)
    layer.packed.refresh_layouts()
    assert oc.buf.data_ptr() == ptr
    _same_bits(oc.buf.cpu(), operand(to_hopper(q2)))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("N,K", [(37, 96), (40, 288)])
def test_linear_on_cache_equals_dequant_path(fmt, N, K, monkeypatch, device, gen):
    """From the threshold (lowered to keep the interpreter fast) on: the same bits as dequantize + cuBLAS, for W4A16,
    W4A4 and the prequantized entry, with bias; also for a weight above DEQUANT_CUBLAS_MAX_WEIGHT (the dequant path
    would not run: compared with it forced); below the threshold the FP4 GEMM runs, cache or not."""
    q = _q(N, K, fmt, gen).to(device)
    plain, cached = PackedWeight(fmt, N, K, q=q), PackedWeight(fmt, N, K, q=q)
    operand_cache.attach(cached)
    bias = torch.randn(N, generator=gen).to(device)
    x = torch.randn(5, K, generator=gen).to(torch.bfloat16).to(device)
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 5)
    calls = []
    real = fp4_dequant.operand_matmul
    monkeypatch.setattr(fp4_dequant, "operand_matmul", lambda *a: calls.append(a[1].data_ptr()) or real(*a))
    for act in ("bf16", fmt):
        y_dq, y_oc = fp4_linear(x, plain, act, bias), fp4_linear(x, cached, act, bias)
        _same_bits(y_oc.cpu(), y_dq.cpu())
    xq, rs = quantize_dequant_bf16(x, per_token(fmt))
    _same_bits(fp4_linear_prequantized(xq, rs, cached, bias).cpu(), fp4_linear_prequantized(xq, rs, plain, bias).cpu())
    buf = operand_cache.cached(cached).buf.data_ptr()
    assert calls.count(buf) == 3 and len(calls) == 6      # the cache read, never dequantized into it per call
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MAX_WEIGHT", 0)   # a "large" weight: only the cache path
    y_big = fp4_linear(x, cached, "bf16", bias)
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MAX_WEIGHT", 1 << 40)
    _same_bits(y_big.cpu(), fp4_linear(x, plain, "bf16", bias).cpu())
    calls.clear()
    y_small = fp4_linear(x[:4], cached, "bf16", bias)      # below the threshold: the FP4 GEMM
    assert not calls and not operand_cache.use_operand_cache(4, cached)
    assert operand_cache.use_operand_cache(5, cached) and not operand_cache.use_operand_cache(5, plain)
    err = ((y_small.double() - y_big[:4].double()).nan_to_num().norm() / y_big.double().nan_to_num().norm()).item()
    assert err < 1e-2


def test_torch_reference_of_both_paths(monkeypatch, gen):
    """Without the interpreter (the torch references): the cache and the dequant path agree bit for bit."""
    q = _q(24, 64, "mxfp4", gen)
    plain, cached = PackedWeight("mxfp4", 24, 64, q=q), PackedWeight("mxfp4", 24, 64, q=q)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    operand_cache.attach(cached)
    _same_bits(operand_cache.cached(cached).buf, operand(to_hopper(q)))
    x = torch.randn(7, 64, generator=gen).to(torch.bfloat16)
    h = hopper_weight(plain)
    y_dq = fp4_dequant.dequant_matmul(x, q, h, None, None, torch.float32)
    y_oc = operand_cache.operand_cache_matmul(x, cached, None, None, torch.float32)
    assert torch.equal(y_dq.isnan(), y_oc.isnan()) and torch.equal(y_dq.nan_to_num(), y_oc.nan_to_num())


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_operand_cache_equals_dequant_gpu(fmt, gen):
    """4096x12288 (above DEQUANT_CUBLAS_MAX_WEIGHT: the dequant path forced for the comparison) at M = 128/359/512:
    the same bits, W4A16 and W4A4 with bias; the backend reports fp4.operand_cache_cublas, and the dense path below."""
    N, K = 4096, 12288
    w = torch.randn(N, K, generator=gen).cuda() * torch.exp(torch.randn(N, 1, generator=gen)).cuda()
    backend = get_backend("fp4")
    plain = backend.prepare_weight(w, fmt)
    cached = PackedWeight(fmt, N, K, q=plain.q)
    oc = operand_cache.attach(cached)
    _same_bits(oc.buf, operand(hopper_weight(cached)))
    bias = torch.randn(N, generator=gen).cuda()
    for M in (128, 359, 512):
        x = torch.randn(M, K, generator=gen).cuda().to(torch.bfloat16)
        for act in ("bf16", fmt):
            xb, rs = (x, None) if act == "bf16" else quantize_dequant_bf16(x, per_token(fmt))
            y_dq = fp4_dequant.dequant_matmul(xb, plain.q, hopper_weight(plain), rs, bias, torch.bfloat16)
            _same_bits(fp4_linear(x, cached, act, bias), y_dq)
    layer = QuantLinear(w.to(torch.bfloat16), fmt, act_fmt=fmt)
    operand_cache.attach(layer.packed)
    layer(torch.randn(128, K, device="cuda", dtype=torch.bfloat16))
    assert backend.paths.last == "fp4.operand_cache_cublas"
    layer(torch.randn(127, K, device="cuda", dtype=torch.bfloat16))
    # below the cache's rows the dense path: the Gluon GEMM where gemm_dispatch.GLUON_MID_M lists the weight up to 127
    # rows (mxfp4 4096x12288 since check midm), else the Triton fp4_matmul
    mid = "fp4.gluon" if gemm_dispatch.mid_m_max(fmt, N, K) >= 127 else "fp4.triton"
    assert backend.paths.last == mid


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_operand_cache_graph_replay_after_reload_gpu(gen, capture):
    """A captured graph reads the cache; load_weight (fused sync) rewrites it in place; replay gives the new result."""
    w = torch.randn(4096, 12288, generator=gen).to(torch.bfloat16).cuda()
    layer = QuantLinear(w, "nvfp4", act_fmt="nvfp4")
    oc = operand_cache.attach(layer.packed)
    ptr = oc.buf.data_ptr()
    x = torch.randn(359, 12288, generator=gen).to(torch.bfloat16).cuda()
    g, out = capture(lambda: layer(x))
    paths = get_backend("fp4").paths
    fused = paths.counts["fp4.sync.fused"]      # a session count: this reload must add one, not find an earlier one
    layer.load_weight(-2 * w)
    assert oc.buf.data_ptr() == ptr and paths.counts["fp4.sync.fused"] == fused + 1
    _same_bits(oc.buf, operand(hopper_weight(layer.packed)))
    g.replay()
    torch.cuda.synchronize()
    expect = layer(x)
    rel = ((out.double() - expect.double()).norm() / expect.double().norm()).item()
    assert rel < 1e-3           # cuBLAS may pick another algorithm under capture
