"""The W4A4 activation quantize launched with PDL (kernels.linear.QUANTIZE_PDL, row_quantize's `pdl_wait`), on CPU:
when it applies (`w4a4_quantize_pdl`: the switch, the Gluon GEMM, a CUDA-graph capture), that `fp4_linear` and the
fp4 backend's shared-input quantize pass it, and that it changes no bit (PDL_WAIT is compiled out in the
interpreter, as launch_dependents is). Its SASS (the wait before the first global access): the compile gate's
`pdl_wait` cases (row_quantize_gate.py); bits and time on the GPU: test_w4a4_pdl_gpu.py, check `w4a4pdl`."""

import pytest
import torch

from trace_rl.kernels import linear, row_quantize
from trace_rl.kernels.row_quantize import quantize_dequant_bf16

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),   # NaN blocks, interpreter
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]


def _capturing(monkeypatch, on: bool) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: on)


@pytest.mark.parametrize("switch,path,capturing,want", [
    (True, "gluon", True, True),
    (False, "gluon", True, False),      # the switch off
    (True, "triton", True, False),      # the Triton GEMM does not launch with PDL
    (True, "gluon", False, False),      # eager: neither does the Gluon GEMM
])
def test_quantize_pdl_only_where_the_gemm_launches_with_pdl(switch, path, capturing, want, monkeypatch):
    monkeypatch.setattr(linear, "QUANTIZE_PDL", switch)
    _capturing(monkeypatch, capturing)
    assert linear.w4a4_quantize_pdl(path) is want


def test_quantize_pdl_off_without_cuda(monkeypatch):
    """No CUDA (CPU torch: is_current_stream_capturing raises there): never PDL, and no error."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert linear.w4a4_quantize_pdl("gluon") is False


@pytest.mark.parametrize("fmt", ["nvfp4:row", "mxfp4"])
@pytest.mark.parametrize("block_tiles", [True, False])
@pytest.mark.parametrize("silu", [False, True])
def test_pdl_wait_same_bits(fmt, block_tiles, silu, device, gen, monkeypatch):
    """`pdl_wait=True` (launch_dependents, then griddepcontrol.wait; compiled out in the interpreter) changes no bit,
    in the block-tile kernel and the general one (`USE_BLOCK_TILES` off), with and without the SiLU x mul, at an
    odd row count."""
    monkeypatch.setattr(row_quantize, "USE_BLOCK_TILES", block_tiles)
    x = (torch.randn(5, 192 if silu else 96, generator=gen) * 3).to(torch.bfloat16).to(device)
    x[2, 7] = float("nan")
    got, got_rs = quantize_dequant_bf16(x, fmt, silu_mul=silu, launch_dependents=True, pdl_wait=True)
    ref, ref_rs = quantize_dequant_bf16(x, fmt, silu_mul=silu)
    assert torch.equal(got.isnan(), ref.isnan()) and torch.equal(got.nan_to_num(), ref.nan_to_num())
    assert (got_rs is None and ref_rs is None) or torch.equal(got_rs, ref_rs)


def test_pdl_wait_e4m3_same_bits(device, gen):
    from trace_rl.kernels.row_quantize import quantize_dequant_e4m3

    x = (torch.randn(3, 64, generator=gen) * 3).to(torch.bfloat16).to(device)
    got, got_rs = quantize_dequant_e4m3(x, pdl_wait=True)
    ref, ref_rs = quantize_dequant_e4m3(x)
    assert torch.equal(got.view(torch.uint8), ref.view(torch.uint8)) and torch.equal(got_rs, ref_rs)


class _Spy:
    """Stands in for quantize_dequant_bf16: records its keyword arguments, returns the real operand."""

    def __init__(self):
        self.calls = []

    def __call__(self, x2, fmt, silu_mul=False, **kw):
        self.calls.append(kw)
        return quantize_dequant_bf16(x2, fmt, silu_mul)


@pytest.mark.parametrize("path,capturing", [("gluon", True), ("gluon", False), ("triton", True)])
def test_fp4_linear_passes_pdl_wait(path, capturing, monkeypatch):
    """fp4_linear's W4A4 quantize gets launch_dependents on the Gluon path and pdl_wait where `w4a4_quantize_pdl`
    says (the GEMM stubbed: its PDL is _dense_matmul's, tested on the GPU)."""
    from trace_rl.backends import get_backend

    packed = get_backend("fp4").prepare_weight(torch.randn(8, 32, dtype=torch.bfloat16), "nvfp4")
    spy = _Spy()
    monkeypatch.setattr(linear, "quantize_dequant_bf16", spy)
    monkeypatch.setattr(linear, "small_m_gemm", lambda *a, **k: path)
    monkeypatch.setattr(linear, "_dense_matmul", lambda xb, p, rs, *a: xb.new_zeros(xb.shape[0], p.out_features))
    _capturing(monkeypatch, capturing)
    linear.fp4_linear(torch.randn(3, 32, dtype=torch.bfloat16), packed, "nvfp4")
    assert spy.calls == [{"launch_dependents": path == "gluon", "pdl_wait": path == "gluon" and capturing}]
