"""GPU (issue 15): the W4A4 linear with its activation quantize launched with PDL (kernels.linear.QUANTIZE_PDL: inside
a CUDA-graph capture, on the small-M Gluon GEMM's path, the quantize waits in griddepcontrol.wait before its first
global access) gives the bits it gives without: eagerly (where it does not apply) and replayed from a CUDA graph, at
o_proj's 4096x4096 and the down projection's 12288 -> 4096 at M = 1 / 16, an odd shape (2560 -> 1536: five K steps,
M = 5), nvfp4 / mxfp4, each followed by a second W4A4 linear to 200 outputs (not a multiple of the 64-row tile). In
every chain the quantize reads what the kernel just before it wrote (a torch multiply, or the previous Gluon GEMM,
which signals launch_dependents early), so a missing wait shows as stale input. Also the fp4 backend's fused SiLU x
mul quantize (`quantize_silu_mul_input`) before the down projection. The time: check `w4a4pdl`
(benchmarks/w4a4_pdl.py)."""

import pytest
import torch
import triton

from trace_rl.backends import get_backend
from trace_rl.kernels import linear

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"), pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and
                                      triton.__version__.startswith("3.6")),
                                 reason="needs an sm_90 GPU and Triton 3.6 (the Gluon GEMM's PDL path)")]


def _weight(N, K, fmt, gen):
    w = torch.randn(N, K, generator=gen) / K ** 0.5
    return get_backend("fp4").prepare_weight(w.cuda(), fmt)


class _Spy:
    """Wraps linear.quantize_dequant_bf16 and records each call's pdl_wait."""

    def __init__(self, fn):
        self.fn, self.pdl = fn, []

    def __call__(self, *a, **kw):
        self.pdl.append(kw.get("pdl_wait", False))
        return self.fn(*a, **kw)


def _graph_and_eager(fn, capture, pdl, monkeypatch):
    """(eager output, graph output after one replay, pdl_wait of the captured quantize launches) with QUANTIZE_PDL
    = `pdl`."""
    monkeypatch.setattr(linear, "QUANTIZE_PDL", pdl)
    spy = _Spy(linear.quantize_dequant_bf16)
    monkeypatch.setattr(linear, "quantize_dequant_bf16", spy)
    eager = fn().clone()
    torch.cuda.synchronize()
    g, out = capture(fn)
    captured = spy.pdl[-(len(spy.pdl) // 3):]       # fn ran eagerly, warmed up, then was captured: the last third
    g.replay()
    torch.cuda.synchronize()
    return eager, out, g, captured


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("K,N,M", [(4096, 4096, 1), (4096, 4096, 16), (12288, 4096, 1), (12288, 4096, 16),
                                   (2560, 1536, 5)])
def test_quantize_pdl_same_bits_eager_and_graph(fmt, K, N, M, capture, gen, monkeypatch):
    p, p2 = _weight(N, K, fmt, gen), _weight(200, N, fmt, gen)    # K of both: the Gluon GEMM's (multiples of 512)
    x = (torch.randn(M, K, generator=gen) * 3).to(torch.bfloat16).cuda()
    s = torch.full((1, K), 1.5, dtype=torch.bfloat16, device="cuda")

    def chain():
        h = x * s                                   # the kernel right before the quantize writes its input
        y = linear.fp4_linear(h, p, fmt)
        return linear.fp4_linear(y, p2, fmt)       # quantize after the Gluon GEMM (launch_dependents early)

    ref = chain().clone()
    torch.cuda.synchronize()
    assert torch.isfinite(ref).all()
    results = {}
    for pdl in (False, True):
        eager, out, g, captured = _graph_and_eager(chain, capture, pdl, monkeypatch)
        assert captured == [pdl, pdl], captured     # the switch reaches both captured quantize launches
        assert torch.equal(eager, ref) and torch.equal(out, ref), f"QUANTIZE_PDL={pdl}"
        results[pdl] = (g, out)
    x.copy_((torch.randn(M, K, generator=gen) * 3).to(torch.bfloat16))
    monkeypatch.setattr(linear, "QUANTIZE_PDL", False)
    ref2 = chain().clone()
    for pdl, (g, out) in results.items():
        for _ in range(3):
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, ref2), f"replay after the input changed, QUANTIZE_PDL={pdl}"


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("M", [1, 16])
def test_silu_mul_quantize_pdl_same_bits(fmt, M, capture, gen, monkeypatch):
    """FP4Backend.quantize_silu_mul_input (SiLU x mul fused into the quantize) then linear_quantized at the down
    projection's 12288 -> 4096: graph with QUANTIZE_PDL on = off = eager."""
    from trace_rl.kernels import swiglu

    if not swiglu.EXACT_SILU:
        pytest.skip("the fused SiLU x mul quantize needs swiglu.EXACT_SILU")
    backend = get_backend("fp4")
    K = 12288
    p = _weight(4096, K, fmt, gen)
    gate_up = (torch.randn(M, 2 * K, generator=gen) * 2).to(torch.bfloat16).cuda()
    s = torch.full((1, 2 * K), 1.25, dtype=torch.bfloat16, device="cuda")

    def down():
        xq = backend.quantize_silu_mul_input(gate_up * s, p, fmt)
        return backend.linear_quantized(xq, p)

    ref = down().clone()
    torch.cuda.synchronize()
    for pdl in (False, True):
        monkeypatch.setattr(linear, "QUANTIZE_PDL", pdl)
        assert torch.equal(down(), ref)
        g, out = capture(down)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref), f"QUANTIZE_PDL={pdl}"
