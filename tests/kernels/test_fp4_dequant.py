"""Large-M dense FP4 linear (dequantize to bf16 + cuBLAS, fp4_dequant.py): the dequantization kernel against
the Hopper layout's operand bit for bit (odd shapes, NaN / zero / negative / subnormal scales, mxfp4 blocks far
below their row's largest), the whole path against `fp4_matmul` and a float64 reference (W4A16, W4A4, bias,
NaN rows), the dispatch by M; on the GPU the Qwen/MoE shapes at M = 128, 471, 512 and CUDA-graph capture."""

import pytest
import torch

from tests.kernels._compare import rel_err
from trace_rl.backends import PackedWeight, get_backend
from trace_rl.formats import get_format, per_token
from trace_rl.kernels import fp4_dequant
from trace_rl.kernels.fp4_dequant import dequant_matmul, dequantize_to
from trace_rl.kernels.fp4_gemm import fp4_matmul
from trace_rl.kernels.hopper_fp4 import operand, to_hopper
from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized, hopper_weight
from trace_rl.kernels.row_quantize import quantize_dequant_bf16

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]


def _q(N, K, fmt, gen, special=True):
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    q = get_format(fmt).quantize(w)
    if special:
        s = q.scales.view(torch.uint8).reshape(N, -1)
        if fmt == "nvfp4":
            s[0, 0] = 0x7F                 # NaN scale
            s[1, 1] = 0x00                 # zero scale
            s[2, 0] = 0x03                 # E4M3 subnormals
            s[2, 1] = 0x81
            s[3, 0] = s[3, 0] | 0x80       # negative scale (never produced by the quantizer: folded signs)
        else:
            s[0, 1] = 255                  # NaN block: its row is NaN
            s[1, :] = 200                  # row top 200: b = e + 54
            s[1, 0] = 72                   # b = 126: products 2**-128..: bf16 subnormals
            s[1, 1] = 66                   # b = 120: rounds to the smallest subnormals or zero
            s[2, 0] = 0                    # e = 0 (2**-127)
    return q


def _same_bits(a, b):
    nan = a.isnan()
    assert torch.equal(nan, b.isnan())
    assert torch.equal(a[~nan].view(torch.int16), b[~nan].view(torch.int16))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("N,K", [(37, 96), (16, 288)])
def test_dequant_kernel_matches_layout_operand(fmt, N, K, device, gen):
    q = _q(N, K, fmt, gen)
    h = to_hopper(q)
    ref = operand(h)
    qd, hd = q.to(device), to_hopper(q.to(device))
    out = torch.full((N, K), 7.0, dtype=torch.bfloat16, device=device)
    _same_bits(dequantize_to(qd, hd, out).cpu(), ref)
    if fmt == "nvfp4":
        assert ref[0, :16].isnan().all() and not ref[0, 16:].isnan().any()
    else:
        assert (ref[1, :64] != 0).any() and (ref[1, :32].float().abs() < 2.0 ** -126).any()


def _ref64(x2, q, h, row_scale, bias):
    """float64 accumulation of the same operands and epilogue."""
    y = x2.double() @ operand(h).double().T * h.row_factor[: h.n].double()
    if row_scale is not None:
        y = y * row_scale.double()[:, None]
    return y if bias is None else y + bias.double()


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("act", ["bf16", "fp4"])
def test_dequant_matmul_matches_fp4_matmul(fmt, act, device, gen):
    M, N, K = 5, 40, 160
    q = _q(N, K, fmt, gen, special=False)
    qd = q.to(device)
    h = to_hopper(qd)
    x = torch.randn(M, K, generator=gen).to(device)
    bias = torch.randn(N, generator=gen).to(device)
    if act == "bf16":
        xb, rs = x.to(torch.bfloat16), None
    else:
        xb, rs = quantize_dequant_bf16(x, per_token(fmt))
    for out_dtype in (torch.float32, torch.bfloat16):
        y = dequant_matmul(xb, qd, h, rs, bias, out_dtype)
        y_gemm = fp4_matmul(xb, h, rs, bias, out_dtype=out_dtype)
        ref = _ref64(xb.cpu(), q, to_hopper(q), None if rs is None else rs.cpu(), bias.cpu())
        assert y.dtype == out_dtype and y.shape == (M, N)
        scale = (xb.double().abs().cpu() @ operand(to_hopper(q)).double().abs().T
                 * to_hopper(q).row_factor[:N].double()) * (1 if rs is None else rs.double().cpu()[:, None])
        if out_dtype == torch.float32:   # K float32 roundings at most
            assert ((y.double().cpu() - ref).abs() <= K * 2.0 ** -23 * (scale + bias.abs().double().cpu())).all()
            assert ((y.double() - y_gemm.double()).abs().cpu() <= K * 2.0 ** -22 * (scale + 1)).all()
        else:   # within one bf16 ulp of the float64 result (the interpreter's float32 -> bf16 cast truncates)
            tol = 2.0 ** -7 * ref.abs() + K * 2.0 ** -23 * scale
            assert ((y.double().cpu() - ref).abs() <= tol).all()
            assert ((y.double() - y_gemm.double()).abs().cpu() <= 2 * tol).all()


def test_dequant_matmul_nan_rows(device, gen):
    N, K = 24, 64
    for fmt, row in (("nvfp4", 0), ("mxfp4", 0)):
        q = _q(N, K, fmt, gen)
        qd = q.to(device)
        h = to_hopper(qd)
        x = torch.randn(3, K, generator=gen).to(torch.bfloat16).to(device)
        y = dequant_matmul(x, qd, h).cpu()
        assert y[:, row].isnan().all() and not y[:, row + 3:].isnan().any()


def test_torch_reference_path_equals_kernels(monkeypatch, device, gen):
    """Off CUDA and without the interpreter, dequant_matmul runs in torch: the same bits as the kernels."""
    if device != "cpu":
        pytest.skip("compares the interpreter with the torch path")
    q = _q(40, 96, "nvfp4", gen)
    h = to_hopper(q)
    x = torch.randn(6, 96, generator=gen).to(torch.bfloat16)
    rs = torch.rand(6, generator=gen) + 0.5
    bias = torch.randn(40, generator=gen)
    y_kernel = dequant_matmul(x, q, h, rs, bias, torch.float32)
    monkeypatch.delenv("TRITON_INTERPRET")
    y_torch = dequant_matmul(x, q, h, rs, bias, torch.float32)
    assert torch.equal(y_kernel.isnan(), y_torch.isnan())
    assert torch.equal(y_kernel.nan_to_num(), y_torch.nan_to_num())


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_linear_dispatch_by_rows(fmt, monkeypatch, device, gen):
    """fp4_linear and fp4_linear_prequantized take the dequant path from the threshold on (lowered here to
    keep the interpreter fast), the FP4 GEMM below it and when disabled; both agree."""
    N, K = 40, 96
    q = _q(N, K, fmt, gen, special=False).to(device)
    packed = PackedWeight(fmt, N, K, q=q)
    x = torch.randn(4, K, generator=gen).to(torch.bfloat16).to(device)
    calls = []
    real = fp4_dequant.dequant_matmul
    monkeypatch.setattr("trace_rl.kernels.linear.dequant_matmul", lambda *a: calls.append(1) or real(*a))
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 4)
    y_big = fp4_linear(x, packed, fmt)
    xq, rs = quantize_dequant_bf16(x, per_token(fmt))
    y_pre = fp4_linear_prequantized(xq, rs, packed)
    assert len(calls) == 2
    y_small = fp4_linear(x[:3], packed, fmt)
    monkeypatch.setattr(fp4_dequant, "ENABLED", False)
    y_off = fp4_linear(x, packed, fmt)
    assert len(calls) == 2
    assert torch.equal(y_big, y_pre) and torch.equal(y_big[:3].isnan(), y_small.isnan())
    err = rel_err(y_big, y_off)
    assert err < 1e-2
    assert fp4_dequant.use_dequant_cublas(4, N, K) is False
    monkeypatch.setattr(fp4_dequant, "ENABLED", True)
    # a weight whose bf16 scratch would not fit comfortably in L2 stays on the FP4 GEMM at any M
    assert fp4_dequant.use_dequant_cublas(512, 4096, 4096) is False
    assert fp4_dequant.use_dequant_cublas(512, 5120, 2048) is True


# ---- GPU ----

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("N,K", [(2048, 4096), (4096, 2048)])
def test_dequant_cublas_gpu(fmt, N, K, gen):
    small = _q(37, 96, fmt, gen)      # NaN, zero, negative, subnormal scales; mxfp4 products in bf16 subnormals
    out = torch.empty(37, 96, dtype=torch.bfloat16, device="cuda")
    _same_bits(dequantize_to(small.to("cuda"), to_hopper(small.to("cuda")), out).cpu(), operand(to_hopper(small)))
    w = torch.randn(N, K, generator=gen).cuda() * torch.exp(torch.randn(N, 1, generator=gen)).cuda()
    packed = get_backend("fp4").prepare_weight(w, fmt)
    h = hopper_weight(packed)
    _same_bits(dequantize_to(packed.q, h, torch.empty(N, K, dtype=torch.bfloat16, device="cuda")), operand(h))
    bias = torch.randn(N, generator=gen).cuda()
    for M in (128, 471, 512):
        x = torch.randn(M, K, generator=gen).cuda().to(torch.bfloat16)
        for act_fmt in ("bf16", fmt):
            xb, rs = (x, None) if act_fmt == "bf16" else quantize_dequant_bf16(x, per_token(fmt))
            y = fp4_linear(x, packed, act_fmt, bias)
            y_gemm = fp4_matmul(xb, h, rs, bias, out_dtype=torch.bfloat16)
            assert rel_err(y, y_gemm) < 2e-3, (M, act_fmt)
            y32 = dequant_matmul(xb, packed.q, h, rs, bias, torch.float32)
            assert rel_err(y32, fp4_matmul(xb, h, rs, bias, out_dtype=torch.float32)) < 1e-5, (M, act_fmt)
    # NaN: a NaN scale makes its weight row's output column NaN, nothing else
    s = packed.q.scales.view(torch.uint8)
    s.view(N, -1)[5, 0] = 0x7F if fmt == "nvfp4" else 255
    packed.refresh_layouts()
    y = fp4_linear(torch.randn(128, K, device="cuda", dtype=torch.bfloat16), packed, "bf16")
    assert y[:, 5].isnan().all() and not y[:, 6:].isnan().any() and not y[:, :5].isnan().any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_dequant_cublas_backend_path_and_graph_gpu(gen, capture):
    """The backend reports fp4.dequant_cublas at M >= the threshold; a captured CUDA graph (scratch allocated
    in the warm-up) replays the eager result and follows an in-place weight sync."""
    from trace_rl.backends import QuantLinear

    backend = get_backend("fp4")
    w = torch.randn(512, 1024, generator=gen).to(torch.bfloat16).cuda()
    layer = QuantLinear(w, "nvfp4", act_fmt="nvfp4")
    M = fp4_dequant.DEQUANT_CUBLAS_MIN_M
    x = torch.randn(M, 1024, generator=gen).to(torch.bfloat16).cuda()
    y = layer(x)
    assert backend.paths.last == "fp4.dequant_cublas"
    layer(x[:M - 1])
    assert backend.paths.last == "fp4.triton"
    g, out = capture(lambda: layer(x))
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(out, y) < 1e-3          # cuBLAS may pick another algorithm under capture
    layer.load_weight(w * 2)
    g.replay()
    torch.cuda.synchronize()
    assert rel_err(out, 2 * y) < 1e-2
