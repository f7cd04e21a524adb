"""The shipped small-M Gluon GEMM (fp4_gemm_gluon.SMALL_M: 64-row tiles, 512-column steps, the fast split-K epilogue
of fp4_gemm_gluon_epilogue.py, programmatic dependent launch) and `fp4_linear`'s dispatch to it (gemm_dispatch.py),
on an sm_90 GPU with Triton 3.6 (CPU: skipped; its compile gate is fp4_gemm_gluon_gate.py, its data path
test_fp4_gemm_gluon.py's emulation at SMALL_M's tiles):
- against the float64 reference at M 1 / 5 / 16, N not a multiple of 64, K padding to an odd number of K steps, nvfp4
  and mxfp4; bit-equal to the previous launch (`_fp4_gemm_ws_kernel`, `_finish`) at the same split, with and without
  PDL; the issue's shapes at their auto splits;
- W4A16 and W4A4 (the quantize kernel's launch_dependents + the GEMM's PDL) through `fp4_linear` and
  `fp4_linear_prequantized`, with bias, against the emulated linear and the Triton path (GLUON_SMALL_M off);
- a NaN block scale's row stays NaN; the backend records fp4.gluon and the switch sends it back to fp4.triton;
- a chain of dependent linears captured in a CUDA graph (PDL edges) replays the bits of the same chain run with a
  synchronisation between launches."""

from dataclasses import replace

import pytest
import torch
import triton

from tests.kernels._compare import rel_err
from tests.kernels.test_fp4_dequant import _q
from trace_rl.backends import get_backend
from trace_rl.backends.fp4 import emulated_linear
from trace_rl.formats import per_token
from trace_rl.kernels import gemm_dispatch
from trace_rl.kernels.hopper_fp4 import to_hopper

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"), pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and
                                      triton.__version__.startswith("3.6")),
                                 reason="needs an sm_90 GPU and Triton 3.6 (Gluon)")]


def _weight(N, K, fmt, gen):
    w = torch.randn(N, K, generator=gen) * torch.exp(torch.randn(N, 1, generator=gen))
    return get_backend("fp4").prepare_weight(w.cuda(), fmt)


def _ref(x, packed, row_scale=None, bias=None):
    y = x.double() @ packed.q.dequantize().double().T
    if row_scale is not None:
        y = y * row_scale.double()[:, None]
    return y if bias is None else y + bias.double()


def _auto_split(M, h, c):
    from trace_rl.kernels.fp4_gemm_gluon import auto_split

    bm = c.tile_m(M)
    kb = h.padded[1] // c.bk(h.fmt)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    return auto_split(triton.cdiv(h.padded[0], c.block_n) * triton.cdiv(M, bm), kb, sms * c.ctas_per_sm(bm, h.fmt))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("M", [1, 5, 16])
@pytest.mark.parametrize("N,K", [(200, 1504), (72, 992)])
def test_small_m_matches_reference_and_previous_launch(fmt, M, N, K, gen):
    """N = 200 / 72: partial 64-row tiles (TMA zero fill, masked store); K = 1504 pads to 3 K steps of 512 (992: 2;
    both multiples of mxfp4's 32-wide blocks);
    the auto split and forced splits 1 / 2 / 3, each bit-equal to `_fp4_gemm_ws_kernel` (`fin=False`) at that split,
    with and without PDL."""
    from trace_rl.kernels.fp4_gemm_gluon import SMALL_M, fp4_matmul_gluon

    packed = _weight(N, K, fmt, gen)
    h = to_hopper(packed.q)
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_gluon(x, h)
    assert y.shape == (M, N) and rel_err(y, _ref(x, packed)) < 1e-2
    for split in sorted({_auto_split(M, h, SMALL_M), 1, 2, 3}):
        prev = fp4_matmul_gluon(x, h, replace(SMALL_M, fin=False, split_k=split))
        for pdl in (False, True):
            got = fp4_matmul_gluon(x, h, replace(SMALL_M, split_k=split), pdl=pdl)
            assert torch.equal(got, prev), (split, pdl)
    assert torch.equal(y, fp4_matmul_gluon(x, h, replace(SMALL_M, fin=False, split_k=_auto_split(M, h, SMALL_M))))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("N,K", [(12288, 4096), (4096, 12288), (1024, 4096)])
def test_small_m_issue_shapes(fmt, N, K, gen):
    """The issue's shapes at M = 16 and 1 (SMALL_M's auto splits 2 / 6 / 4 on 132 SMs; 4096x1024 takes SMALL_GRID's
    config where one is set), PDL, against the reference and the previous launch at the same split."""
    from trace_rl.kernels.fp4_gemm_gluon import config_for, fp4_matmul_gluon

    packed = _weight(N, K, fmt, gen)
    h = to_hopper(packed.q)
    for M in (16, 1):
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
        y = fp4_matmul_gluon(x, h, pdl=True)
        assert rel_err(y, _ref(x, packed)) < 1e-2
        c = config_for(M, fmt, h.padded[1], h.padded[0])
        assert torch.equal(y, fp4_matmul_gluon(x, h, replace(c, fin=False, split_k=c.split_k or
                                                               _auto_split(M, h, c))))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("act", ["bf16", "fp4"])
@pytest.mark.parametrize("M", [1, 16])
def test_fp4_linear_takes_gluon(fmt, act, M, monkeypatch, gen):
    """W4A16 and W4A4 (quantize kernel with launch_dependents, then the PDL GEMM) with bias through `fp4_linear`
    and `fp4_linear_prequantized`: the backend records fp4.gluon; against the emulated linear and the Triton path
    (the switch off: fp4.triton)."""
    from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    N, K = 200, 4096                        # 4 row tiles x 8 K steps: split 4 (partials with row scale and bias)
    act_fmt = "bf16" if act == "bf16" else fmt
    packed = _weight(N, K, fmt, gen)
    x = (torch.randn(M, K, generator=gen) * 3).to(torch.bfloat16).cuda()
    bias = torch.randn(N, generator=gen).cuda()
    backend = get_backend("fp4")
    y = backend.linear(x, packed, act_fmt, bias)
    assert backend.paths.last == "fp4.gluon"
    ref = emulated_linear(x, packed, act_fmt, bias)
    assert rel_err(y, ref) < 1e-2
    assert torch.equal(y, fp4_linear(x, packed, act_fmt, bias))
    if act_fmt != "bf16":
        xq, rs = quantize_dequant_bf16(x, per_token(fmt))
        assert torch.equal(fp4_linear_prequantized(xq, rs, packed, bias, torch.bfloat16), y)
    monkeypatch.setattr(gemm_dispatch, "GLUON_SMALL_M", False)
    y_triton = backend.linear(x, packed, act_fmt, bias)
    assert backend.paths.last == "fp4.triton"
    assert rel_err(y, y_triton) < 1e-2


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_nan_scale_row_stays_nan(fmt, gen):
    """A weight row with a NaN block scale (nvfp4 E4M3 0x7F, mxfp4 E8M0 255; zero and subnormal scales beside it)
    gives NaN in that output column for every token, and NaN exactly where the Triton kernel has it."""
    from trace_rl.kernels.fp4_gemm import fp4_matmul
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon

    N, K = 72, 992
    q = _q(N, K, fmt, gen).to("cuda")
    h = to_hopper(q)
    x = torch.randn(16, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_gluon(x, h, pdl=True)
    assert y[:, 0].isnan().all()
    assert torch.equal(y.isnan(), fp4_matmul(x, h).isnan())


def test_pdl_chain_replays_in_a_cuda_graph(capture, gen):
    """Dependent small-M linears back to back (W4A4 quantize -> GEMM -> W4A16 GEMM -> W4A4 ...: each PDL launch
    reads what the launch before it wrote), eagerly and captured in a CUDA graph (programmatic edges): both give
    the bits of the same chain with a synchronisation after every launch (no overlap possible); the graph replays
    after the input changed in place. K = N = 2048 at M = 8: split 2 (partials and tickets under PDL)."""
    from trace_rl.kernels.linear import fp4_linear

    K = 2048
    specs = (("nvfp4", "nvfp4"), ("nvfp4", "bf16"), ("nvfp4", "bf16"), ("mxfp4", "mxfp4"), ("mxfp4", "bf16"),
             ("nvfp4", "nvfp4"))
    layers = [(get_backend("fp4").prepare_weight((torch.randn(K, K, generator=gen) / 45).cuda(), fmt), act)
              for fmt, act in specs]        # ~ / sqrt(K): activations stay O(1) along the chain
    x = torch.randn(8, K, generator=gen).to(torch.bfloat16).cuda()

    def chain(sync=False):
        h = x
        for p, act in layers:
            h = fp4_linear(h, p, act)       # W4A16 after W4A16: GEMM -> GEMM, both PDL
            if sync:
                torch.cuda.synchronize()
        return h

    ref = chain(sync=True)
    assert torch.isfinite(ref).all()
    assert torch.equal(chain(), ref)
    g, out = capture(chain)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref)
    x.copy_(torch.randn(8, K, generator=gen).to(torch.bfloat16))
    ref2 = chain(sync=True)
    for _ in range(3):
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, ref2)
