"""The fused residual add + RMSNorm + W4A4 activation quantization (`rmsnorm_quantize.add_rms_norm_quantize`):
bit-identical to `add_rms_norm` then `quantize_dequant_bf16` (the two kernels it replaces), and against the torch
reference (the composition of theirs). Odd row counts (several programs, a partial last one), feature counts that
are not powers of two (padded tiles), NaN / Inf / all-zero rows, E2M1 ties, tiny and huge rows. On CPU in Triton's
interpreter (float32 I/O: its bf16 casts are not faithful); on the GPU also Qwen3-8B's decode shape (B = 313 x
4096, bf16) and a CUDA-graph replay."""

import pytest
import torch

from trace_rl.kernels.rmsnorm import add_rms_norm
from trace_rl.kernels.rmsnorm_quantize import (
    add_rms_norm_quantize,
    add_rms_norm_quantize_reference,
    quantize_dequant_reference,
)
from trace_rl.kernels.row_quantize import quantize_dequant_bf16

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]

FORMATS = ["nvfp4:row", "mxfp4"]


def _dtype(device):
    return torch.bfloat16 if str(device).startswith("cuda") else torch.float32


def _inputs(rows: int, n: int, gen: torch.Generator, dtype: torch.dtype, residual: bool = True):
    """x, residual, weight: rows of spread magnitudes, plus an all-zero row (x + residual = 0), a row with one
    NaN, one with +Inf, one with -Inf in the residual, a tiny row (fast_div off for nvfp4) and a huge one."""
    x = torch.randn(rows, n, generator=gen) * torch.exp(torch.randn(rows, 1, generator=gen) * 2)
    r = torch.randn(rows, n, generator=gen) * 2 if residual else None
    specials = {0: "zero", 2: "nan", 4: "inf", 5: "tiny", 7: "huge", 9: "rinf"}
    for row, kind in specials.items():
        if row >= rows:
            continue
        if kind == "zero":
            x[row] = 0.0
            if r is not None:
                r[row] = 0.0
        elif kind == "nan":
            x[row, n // 3] = float("nan")
        elif kind == "inf":
            x[row, n - 1] = float("inf")
        elif kind == "tiny":
            x[row] *= 1e-30
            if r is not None:
                r[row] *= 1e-30
        elif kind == "huge":
            x[row] *= 1e30
            if r is not None:
                r[row] *= 1e30
        elif kind == "rinf" and r is not None:
            r[row, 1] = float("-inf")
    w = (torch.rand(n, generator=gen) + 0.5)
    w[3] = 0.0                                     # a zero weight: h has exact zeros inside a block
    return x.to(dtype), None if r is None else r.to(dtype), w.to(dtype)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """Integer view (NaN payloads compared too: the same ops must give the same NaN)."""
    return t.contiguous().view({2: torch.int16, 4: torch.int32}[t.element_size()])


def _same(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, what
    assert torch.equal(a.isnan(), b.isnan()), f"{what}: NaN positions differ"
    ok = ~a.isnan()
    assert torch.equal(_bits(a)[ok], _bits(b)[ok]), f"{what}: bits differ"


def _separate(x, r, w, eps, fmt):
    h, r_out = add_rms_norm(x, r, w, eps)
    xq, rs = quantize_dequant_bf16(h.reshape(-1, x.shape[-1]), fmt)
    return h, r_out, xq, rs


def _check_same_as_separate(x, r, w, fmt, eps=1e-6):
    h, r_out, xq, rs = add_rms_norm_quantize(x, r, w, eps, fmt)
    h_s, r_s, xq_s, rs_s = _separate(x, r, w, eps, fmt)
    _same(h, h_s, "h")
    _same(r_out, r_s, "new residual")
    _same(xq, xq_s, "quantized h")
    assert (rs is None) == (fmt == "mxfp4") and (rs_s is None) == (rs is None)
    if rs is not None:
        _same(rs, rs_s, "row scale")
    h2, r2, xq2, rs2 = add_rms_norm_quantize(x, r, w, eps, fmt, store_h=False)
    assert h2 is None
    _same(xq2, xq, "quantized h (store_h=False)")
    _same(r2, r_out, "new residual (store_h=False)")
    return h, r_out, xq, rs


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows,residual", [(96, True), (160, True), (13, False)])
def test_fused_equals_the_two_kernels(fmt, rows, residual, device, gen):
    """48 features (nvfp4:row: 3 blocks in a 64-wide tile) / 96 (mxfp4: 3 blocks in 128): padded tiles, 16 rows
    a program, so 96 / 160 rows are 6 / 10 programs and 13 one partial one."""
    n = 48 if fmt == "nvfp4:row" else 96
    x, r, w = _inputs(rows, n, gen, _dtype(device), residual)
    h, r_out, xq, rs = _check_same_as_separate(x.to(device), None if r is None else r.to(device), w.to(device), fmt)
    assert xq[2].isnan().any() and not xq[1].isnan().any()          # the NaN row propagates, its neighbour not
    assert not xq[0].any() and not h[0].any()                         # the zero row stays zero
    if rs is not None:
        assert rs[0] == 1.0 and rs[1] > 0


@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_equals_the_two_kernels_wider_rows(fmt, device, gen):
    """160 (nvfp4:row) / 192 (mxfp4) features: 10 / 6 blocks in a 256-wide tile, 16 rows a program."""
    n = 160 if fmt == "nvfp4:row" else 192
    x, r, w = _inputs(5, n, gen, _dtype(device))
    _check_same_as_separate(x.to(device), r.to(device), w.to(device), fmt)


@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_matches_reference(fmt, device, gen):
    """Against the torch spec: the residual exact, h within the norm's tolerance (test_fused_ops), and the
    operand the reference quantizer's of the kernel's own h, bit for bit on every block without NaN/Inf (NaN on
    the others), with the reference's row scale."""
    rows, n = 37, 64 if fmt == "nvfp4:row" else 96
    dt = _dtype(device)
    x, r, w = _inputs(rows, n, gen, dt)
    h, r_out, xq, rs = add_rms_norm_quantize(x.to(device), r.to(device), w.to(device), 1e-6, fmt)
    h_ref, r_ref, _, _ = add_rms_norm_quantize_reference(x, r, w, 1e-6, fmt)
    h, r_out, xq = h.cpu(), r_out.cpu(), xq.cpu()
    _same(r_out, r_ref, "new residual")
    finite = h_ref.isfinite().all(-1) & h.isfinite().all(-1)
    tol = dict(atol=1e-2, rtol=1e-2) if dt == torch.bfloat16 else dict(atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h[finite], h_ref[finite], **tol)
    assert torch.equal(h.isnan(), h_ref.isnan())
    ref_q, ref_rs = quantize_dequant_reference(h, fmt)
    block = 32 if fmt == "mxfp4" else 16
    ok = h.isfinite().reshape(rows, -1, block).all(-1).repeat_interleave(block, -1)
    assert torch.equal(_bits(xq)[ok], _bits(ref_q)[ok])
    assert xq[~ok].isnan().all()
    assert (rs is None and ref_rs is None) or torch.equal(rs.cpu(), ref_rs)


def test_fused_rejects_bad_input(device):
    x = torch.zeros(2, 48, device=device)
    w = torch.ones(48, device=device)
    with pytest.raises(ValueError, match="not 'nvfp4'"):
        add_rms_norm_quantize(x, None, w, 1e-6, "nvfp4")
    with pytest.raises(ValueError, match="whole mxfp4 blocks of 32"):
        add_rms_norm_quantize(x, None, w, 1e-6, "mxfp4")
    with pytest.raises(ValueError, match="weight"):
        add_rms_norm_quantize(x, None, w[:32], 1e-6, "nvfp4:row")
    with pytest.raises(ValueError, match="residual"):
        add_rms_norm_quantize(x, x[:1], w, 1e-6, "nvfp4:row")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("rows", [1, 313, 512])
def test_fused_equals_the_two_kernels_qwen3_8b_gpu(fmt, rows, gen):
    """Qwen3-8B's decode norm (hidden 4096, bf16, one row a program), NaN / Inf / zero / tiny / huge rows among
    313: bit-identical to the separate kernels (the sum of squares reduces in the same order)."""
    x, r, w = _inputs(rows, 4096, gen, torch.bfloat16)
    _check_same_as_separate(x.cuda(), r.cuda(), w.cuda(), fmt)
    _check_same_as_separate(x.cuda(), None, w.cuda(), fmt)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("fmt", FORMATS)
def test_fused_other_hidden_sizes_gpu(fmt, gen):
    """Other models' hidden sizes (Qwen3-1.7B 2048, -4B 2560 padded to 4096, -14B 5120 padded to 8192 with 8 warps)."""
    for n in (2048, 2560, 5120):
        x, r, w = _inputs(37, n, gen, torch.bfloat16)
        _check_same_as_separate(x.cuda(), r.cuda(), w.cuda(), fmt)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_replays_in_a_cuda_graph(capture, gen):
    x, r, w = (t.cuda() for t in _inputs(313, 4096, gen, torch.bfloat16))
    g, out = capture(lambda: add_rms_norm_quantize(x, r, w, 1e-6, "nvfp4:row", store_h=False))
    x2, r2, _ = (t.cuda() for t in _inputs(313, 4096, gen, torch.bfloat16))
    x.copy_(x2)
    r.copy_(r2)
    g.replay()
    torch.cuda.synchronize()
    _, r_s, xq_s, rs_s = _separate(x, r, w, 1e-6, "nvfp4:row")
    _same(out[1], r_s, "graph residual")
    _same(out[2], xq_s, "graph operand")
    _same(out[3], rs_s, "graph row scale")
