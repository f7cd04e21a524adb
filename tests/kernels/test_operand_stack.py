"""Stacked operand cache (kernels/operand_cache.py `attach_stacked`, `FP4Backend.linear_stacked`): layers sharing an
input (q/k/v-like parts of different N, one K) keep their caches as row blocks of one buffer (the same bytes as
separate caches, which it replaces), with each part's own row factors beside them (nvfp4: per-tensor global scales
differing per part); weight sync refreshes both in place. The stacked GEMM equals a torch reference of the same math
(one float32 matmul over the stack, x per-row factor x per-token scale) bit for bit at float32 output, and the
per-part path (`linear_quantized` on each part's view) within float32 accumulation order at odd shapes. GPU: Qwen3-8B
q/k/v and gate/up shapes at M = 313."""

import pytest
import torch

from tests.kernels.test_fp4_dequant import _q, _same_bits
from trace_rl.backends import PackedWeight, QuantLinear
from trace_rl.backends import fp4 as fp4_backend
from trace_rl.backends.fp4 import FP4Backend
from trace_rl.formats import get_format
from trace_rl.kernels import fp4_dequant, operand_cache
from trace_rl.kernels.hopper_fp4 import operand, to_hopper

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]


def _parts(fmt, shapes, K, gen, device, special=False):
    """Packed weights of different N (and, nvfp4, different global scales: each part's own tensor amax); on the GPU
    quantized by the quantize kernel (bit-exact with the reference; the Qwen3-8B shapes would take long on the CPU)."""
    if device == "cuda" and not special:
        backend = FP4Backend()
        return [backend.prepare_weight(torch.randn(n, K, generator=gen).cuda() * (i + 1), fmt)
                for i, n in enumerate(shapes)]
    return [PackedWeight(fmt, n, K, q=_q(n, K, fmt, gen, special=special).to(device)) for n in shapes]


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_stack_holds_each_parts_operand_in_one_buffer(fmt, device, gen):
    K, shapes = 96, (37, 8, 40)
    parts = _parts(fmt, shapes, K, gen, device, special=True)
    separate = [operand_cache.attach(p) for p in parts[:2]]          # caches attached before: replaced, not kept
    st = operand_cache.attach_stacked(parts)
    assert operand_cache.attach_stacked(parts) is st and operand_cache.stacked(parts) is st
    assert operand_cache.stacked(parts[:2]) is None and operand_cache.stacked(parts[::-1]) is None
    assert tuple(st.buf.shape) == (sum(shapes), K) and st.sizes == shapes and st.nbytes == 4 * sum(shapes)
    lo = 0
    for p, n, old in zip(parts, shapes, separate + [None]):
        oc = operand_cache.cached(p)
        assert oc is not old and oc.stack is st and oc.lo == lo
        assert oc.buf.data_ptr() == st.buf[lo].data_ptr() and oc.nbytes == 2 * n * K   # a view: no second copy
        h = to_hopper(p.q.to("cpu"))
        _same_bits(st.buf[lo:lo + n].cpu(), operand(h))
        assert torch.equal(st.row_factor[lo:lo + n].cpu().view(torch.int32), h.row_factor[:n].view(torch.int32))
        assert list(p.layout) == ["hopper_fp4", operand_cache.KEY]
        lo += n
    if fmt == "nvfp4":
        assert len({float(p.q.global_scale) for p in parts}) == 3     # each part keeps its own global scale
    with pytest.raises(ValueError, match="one format and K"):
        operand_cache.attach_stacked(parts[:1])
    for again in (parts[:2], parts[::-1]):      # a part of this stack into another: refused, the stack left whole
        with pytest.raises(ValueError, match="already sit in another stack"):
            operand_cache.attach_stacked(again)
        assert operand_cache.stacked(parts) is st


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("fused", [False, True])
def test_weight_sync_refreshes_the_stack_in_place(fmt, fused, device, gen, monkeypatch):
    """`load_weight` on one part rewrites its rows and its row factors (a new global scale) in the same buffers, on
    the requantize path and on the fused one (`quantize_into` writes the Hopper layout, the cache is refreshed
    after it; on CPU the fused kernel runs in the interpreter)."""
    monkeypatch.setattr(FP4Backend, "fused_sync_runs", lambda self, w: fused)
    K, shapes = 64, (24, 8)
    layers = [QuantLinear(torch.randn(n, K, generator=gen), fmt).to(device) for n in shapes]
    st = operand_cache.attach_stacked([m.packed for m in layers])
    ptrs = (st.buf.data_ptr(), st.row_factor.data_ptr())
    top = st.buf[:24].clone()
    w = torch.randn(8, K, generator=gen) * 5
    layers[1].load_weight(w.to(device))
    assert layers[1].backend.paths.last == ("fp4.sync.fused" if fused else "fp4.sync.requantize")
    assert (st.buf.data_ptr(), st.row_factor.data_ptr()) == ptrs and operand_cache.stacked([m.packed for m in layers])
    h = to_hopper(get_format(fmt).quantize(w))
    _same_bits(st.buf[24:].cpu(), operand(h))
    assert torch.equal(st.row_factor[24:].cpu().view(torch.int32), h.row_factor[:8].view(torch.int32))
    assert torch.equal(st.buf[:24], top)


def _shared(fmt, shapes, K, M, gen, device, monkeypatch):
    if device == "cpu":
        monkeypatch.setattr(fp4_backend, "_on_kernels", lambda x: True)   # the interpreter runs the kernels
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", min(M, 128))
    parts = _parts(fmt, shapes, K, gen, device)
    st = operand_cache.attach_stacked(parts)
    x = (torch.randn(M, 1, K, generator=gen) * 3).to(torch.bfloat16).to(device)
    x[1, 0, :32] = 0                                  # all-zero blocks
    backend = FP4Backend()
    return parts, st, backend, backend.quantize_input(x, parts[0], fmt)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_stacked_gemm_equals_torch_reference(fmt, monkeypatch, device, gen):
    """float32 output (no bf16 cast, which the interpreter rounds wrongly): the stacked GEMM is exactly
    (x @ stack^T) x row_factor[n] x row_scale[m] in float32, the matmul being the same call on the same operands."""
    parts, st, backend, xq = _shared(fmt, (37, 8, 40), 96, 5, gen, device, monkeypatch)
    xq32 = xq._replace(dtype=torch.float32)
    y = backend.linear_stacked(xq32, parts, [None] * 3)
    assert y.shape == (5, 1, 85) and y.dtype == torch.float32 and backend.paths.last == "fp4.operand_stack_cublas"
    x2 = xq.x.reshape(5, 96)
    acc = torch.mm(x2, st.buf.t(), out_dtype=torch.float32) if x2.is_cuda else x2.float() @ st.buf.float().t()
    ref = acc * st.row_factor[None, :]
    if xq.row_scale is not None:
        ref = ref * xq.row_scale.float()[:, None]
    assert torch.equal(y.reshape(5, 85).view(torch.int32), ref.view(torch.int32))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("shapes,K,M", [((37, 8, 40), 96, 5), ((48, 48), 160, 7)])
def test_stacked_gemm_equals_per_part_path(fmt, shapes, K, M, monkeypatch, device, gen):
    """bf16 output at odd shapes: the stacked columns equal each part's `linear_quantized` (cuBLAS on its own rows)
    up to float32 accumulation order: float32 accumulators within 1e-5 relative, bf16 outputs within one bf16 step
    (on CPU the same matmul per column gives equal bits; cuBLAS may pick another kernel for the stacked N)."""
    parts, st, backend, xq = _shared(fmt, shapes, K, M, gen, device, monkeypatch)
    y = backend.linear_stacked(xq, parts, [None] * len(parts))
    cols = list(y.split(list(shapes), dim=-1))
    for p, c in zip(parts, cols):
        sep = backend.linear_quantized(xq, p)
        assert c.shape == sep.shape and c.dtype == sep.dtype == torch.bfloat16
        a, b = c.float().cpu(), sep.float().cpu()
        assert torch.equal(a.isnan(), b.isnan())
        a, b = a.nan_to_num(), b.nan_to_num()
        assert ((a - b).abs() <= b.abs() * 2 ** -7 + 1e-30).all()
        if device == "cpu":
            _same_bits(c.cpu(), sep.cpu())
    for kw in (dict(biases=[None] * (len(parts) - 1) + [torch.zeros(shapes[-1], device=device)]),):
        assert backend.linear_stacked(xq, parts, **kw) is None       # a bias: not stacked (the caller runs each)
    assert backend.linear_stacked(xq, parts[::-1], None) is None      # not the stack's order
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", M + 1)
    assert backend.linear_stacked(xq, parts, None) is None            # below the threshold: the FP4 GEMM per part


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("shapes,K", [((4096, 1024, 1024), 4096), ((12288, 12288), 4096)])
def test_stacked_gemm_qwen3_8b_shapes_gpu(shapes, K, gen):
    """Qwen3-8B q/k/v and gate/up at M = 313 (the fixed workload's batch), nvfp4 W4A4: the stacked GEMM against the
    per-part GEMMs on the same stack (accumulation order only) and against a float64 reference."""
    monkey = pytest.MonkeyPatch()
    try:
        parts, st, backend, xq = _shared("nvfp4", shapes, K, 313, gen, "cuda", monkey)
        y = backend.linear_stacked(xq, parts, [None] * len(parts))
        sep = torch.cat([backend.linear_quantized(xq, p) for p in parts], dim=-1)
        ref = (xq.x.double() @ st.buf.double().t()) * st.row_factor.double() * xq.row_scale.double()[:, None]
        ref = ref.reshape(y.shape)
        for got in (y, sep):
            rel = float((got.double() - ref).norm() / ref.norm())
            assert rel < 4e-3                                   # one bf16 rounding
        diff = (y.float() - sep.float()).abs()      # one bf16 step, or the float32 order's noise near a cancellation
        assert (diff <= sep.float().abs() * 2 ** -7 + 1e-4 * sep.float().abs().mean()).all()
        print(f"stacked vs per-part: {float((y != sep).float().mean()):.3g} of outputs differ (accumulation order)")
    finally:
        monkey.undo()
