"""The mid-M Gluon path (issue 15's M = 64 target): `fp4_linear` at 16 < M <= a weight's gemm_dispatch.GLUON_MID_M
entry launches the Gluon GEMM at `fp4_gemm_gluon_config.mid_m_config` (WIDE's token tile or M64_GRID's per-shape pick
on the `fin` kernel: W4A4 row scale, bias, PDL), on an sm_90 GPU with Triton 3.6 (CPU: skipped; the rule's CPU
tests are test_gemm_dispatch.py, the configs' compile gate fp4_gemm_gluon_gate.mid_m_gate_cases):
- the kernel at mid_m_config against the float64 reference at M = 17 .. 64 on a ragged weight (N not a multiple of
  the tile, K padding to an odd number of steps), bit-equal to `_fp4_gemm_ws_kernel` (fin=False) at the same split
  with and without PDL, W4A4 row scale and bias included; M64_GRID's shapes at M = 64;
- `fp4_linear` / `fp4_linear_prequantized` W4A16 and W4A4 with bias, the table listing the weight: the backend
  records fp4.gluon up to the entry's M and fp4.triton past it and with the table empty; against the emulated
  linear and the Triton path;
- a chain of dependent mid-M linears captured in a CUDA graph (PDL edges) replays the synchronised chain's bits;
- an engine decode step at B = 33 (2 Qwen3-8B-shaped W4A4 layers) with every weight listed goes through the Gluon
  GEMM, its logits close to the Triton path's (the table empty)."""

from dataclasses import replace

import pytest
import torch
import triton

from tests.kernels._compare import rel_err
from tests.kernels.test_fp4_gemm_gluon_small import _ref, _weight
from trace_rl.backends import get_backend
from trace_rl.backends.fp4 import emulated_linear
from trace_rl.formats import per_token
from trace_rl.kernels import gemm_dispatch
from trace_rl.kernels.hopper_fp4 import padded_shape, to_hopper

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0) and
                                      triton.__version__.startswith("3.6")),
                                 reason="needs an sm_90 GPU and Triton 3.6 (Gluon)")]


def _split(M, h, c):
    """The split fp4_matmul_gluon launches `c` at (its own, else the auto split)."""
    from trace_rl.kernels.fp4_gemm_gluon import _sm_count, launch_grid

    bm = c.tile_m(M)
    return launch_grid(M, h.padded, c, bm, c.bk(h.fmt), lambda: _sm_count(0) * c.ctas_per_sm(bm, h.fmt))[3]


def _listed(monkeypatch, packed, max_m):
    """GLUON_MID_M listing `packed`'s padded shape up to `max_m` (and nothing else)."""
    table = {"nvfp4": {}, "mxfp4": {}}
    table[packed.fmt][padded_shape(packed.out_features, packed.in_features)] = max_m
    monkeypatch.setattr(gemm_dispatch, "GLUON_MID_M", table)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("M", [17, 24, 33, 48, 64])
def test_mid_m_config_matches_reference_and_previous_launch(fmt, M, gen):
    """N = 200: a partial 128-row tile; K = 1504 pads to 1536 (6 nvfp4 / 3 mxfp4 steps). mid_m_config at its auto
    split (without PDL) and at split 1 / 3 and the auto split with PDL, each bit-equal to the fin=False launch at that
    split; W4A4 row scale and bias against the reference."""
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon
    from trace_rl.kernels.fp4_gemm_gluon_config import mid_m_config

    N, K = 200, 1504
    packed = _weight(N, K, fmt, gen)
    h = to_hopper(packed.q)
    c = mid_m_config(M, fmt, *h.padded)
    assert c.fin
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_gluon(x, h, c)
    assert y.shape == (M, N) and torch.isfinite(y).all() and rel_err(y, _ref(x, packed)) < 1e-2
    auto = _split(M, h, c)
    for split in sorted({auto, 1, 3}):
        prev = fp4_matmul_gluon(x, h, replace(c, fin=False, split_k=split))
        assert torch.equal(fp4_matmul_gluon(x, h, replace(c, split_k=split), pdl=True), prev), split
        if split == auto:
            assert torch.equal(y, prev)
    rs = torch.rand(M, generator=gen).cuda() + 0.5
    bias = torch.randn(N, generator=gen).cuda()
    y4 = fp4_matmul_gluon(x, h, c, row_scale=rs, bias=bias, pdl=True)
    assert rel_err(y4, _ref(x, packed, rs, bias)) < 1e-2


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("N,K", [(12288, 4096), (4096, 12288)])
def test_mid_m_issue_shapes(fmt, N, K, gen):
    """M64_GRID's shapes at M = 64 (its per-shape pick on the fin kernel) and 40, PDL: reference, and the bits of the
    fin=False launch at the same split."""
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon
    from trace_rl.kernels.fp4_gemm_gluon_config import mid_m_config

    packed = _weight(N, K, fmt, gen)
    h = to_hopper(packed.q)
    for M in (64, 40):
        c = mid_m_config(M, fmt, *h.padded)
        x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
        y = fp4_matmul_gluon(x, h, c, pdl=True)
        assert rel_err(y, _ref(x, packed)) < 1e-2
        assert torch.equal(y, fp4_matmul_gluon(x, h, replace(c, fin=False, split_k=_split(M, h, c))))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("act", ["bf16", "fp4"])
@pytest.mark.parametrize("M", [17, 40, 64])
def test_fp4_linear_takes_gluon_at_mid_m(fmt, act, M, monkeypatch, gen):
    """W4A16 and W4A4 (quantize with launch_dependents, the GEMM) with bias through `fp4_linear` and
    `fp4_linear_prequantized`, the weight listed up to M = 64: fp4.gluon, against the emulated linear; M = 65 and the
    table empty: fp4.triton, close to the Gluon result."""
    from trace_rl.kernels.linear import fp4_linear, fp4_linear_prequantized
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    N, K = 200, 4096
    act_fmt = "bf16" if act == "bf16" else fmt
    packed = _weight(N, K, fmt, gen)
    _listed(monkeypatch, packed, 64)
    x = (torch.randn(M + 1, K, generator=gen) * 3).to(torch.bfloat16).cuda()
    bias = torch.randn(N, generator=gen).cuda()
    backend = get_backend("fp4")
    y = backend.linear(x[:M], packed, act_fmt, bias)
    assert backend.paths.last == "fp4.gluon"
    assert rel_err(y, emulated_linear(x[:M], packed, act_fmt, bias)) < 1e-2
    assert torch.equal(y, fp4_linear(x[:M], packed, act_fmt, bias))
    if act_fmt != "bf16":
        xq, rs = quantize_dequant_bf16(x[:M], per_token(fmt))
        assert torch.equal(fp4_linear_prequantized(xq, rs, packed, bias, torch.bfloat16), y)
    if M == 64:
        backend.linear(x, packed, act_fmt, bias)                 # 65 rows: past the entry
        assert backend.paths.last == "fp4.triton"
    monkeypatch.setattr(gemm_dispatch, "GLUON_MID_M", {"nvfp4": {}, "mxfp4": {}})
    y_triton = backend.linear(x[:M], packed, act_fmt, bias)
    assert backend.paths.last == "fp4.triton"
    assert rel_err(y, y_triton) < 1e-2


def test_mid_m_pdl_chain_replays_in_a_cuda_graph(monkeypatch, capture, gen):
    """Dependent mid-M linears (M = 40: W4A4 quantize -> GEMM -> W4A16 GEMM ..., both formats) eagerly and captured
    in a CUDA graph (PDL edges) give the bits of the chain synchronised after every launch; the graph replays after
    the input changed in place. K = N = 2048: split-K partials and tickets under PDL."""
    from trace_rl.kernels.linear import fp4_linear

    K, M = 2048, 40
    monkeypatch.setattr(gemm_dispatch, "GLUON_MID_M", {"nvfp4": {(K, K): 64}, "mxfp4": {(K, K): 64}})
    specs = (("nvfp4", "nvfp4"), ("nvfp4", "bf16"), ("mxfp4", "mxfp4"), ("mxfp4", "bf16"), ("nvfp4", "nvfp4"))
    layers = [(get_backend("fp4").prepare_weight((torch.randn(K, K, generator=gen) / 45).cuda(), fmt), act)
              for fmt, act in specs]
    x = torch.randn(M, K, generator=gen).to(torch.bfloat16).cuda()
    backend = get_backend("fp4")
    backend.linear(x, layers[0][0], layers[0][1])
    assert backend.paths.last == "fp4.gluon"

    def chain(sync=False):
        h = x
        for p, act in layers:
            h = fp4_linear(h, p, act)
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
    x.copy_(torch.randn(M, K, generator=gen).to(torch.bfloat16))
    ref2 = chain(sync=True)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, ref2)


class _EveryWeight(dict):
    """A GLUON_MID_M format entry listing every weight up to M = 64 (the engine test: whatever shapes its layers
    stack)."""

    def get(self, key, default=None):
        return 64

    def __contains__(self, key):
        return True

    def __bool__(self):          # gemm_dispatch reads `GLUON_MID_M.get(fmt) or {}`
        return True


def test_engine_decode_b33_takes_the_mid_m_gluon_path(monkeypatch):
    """A decode step of 33 sequences on 2 Qwen3-8B-shaped W4A4 (nvfp4) layers with every weight listed: the dense
    linears take the Gluon GEMM (fp4.gluon recorded, no fp4.triton); logits close to the same step with the table
    empty (the Triton fp4_matmul), same argmax almost everywhere; the captured step (PDL launches) runs it too."""
    from tests.engine.qwen3_decode import decode_logits, qwen3_layers
    from trace_rl.engine.native import NativeEngine

    B, L = 33, 257
    model, plan = qwen3_layers("w4a4-kv4")
    engine = NativeEngine(model, plan, max_batch=B, max_seq_len=L + 1, device="cuda", graph_buckets=[B],
                          attention="kernels")
    paths = get_backend("fp4").paths
    monkeypatch.setattr(gemm_dispatch, "GLUON_MID_M", {"nvfp4": {}, "mxfp4": {}})
    triton_logits = decode_logits(engine, B, L)
    monkeypatch.setattr(gemm_dispatch, "GLUON_MID_M", {"nvfp4": _EveryWeight(), "mxfp4": _EveryWeight()})
    engine.graphs.invalidate()           # a captured step bakes the GEMM it was captured with
    before = dict(paths.counts)
    gluon_logits = decode_logits(engine, B, L)
    took = {k: paths.counts.get(k, 0) - before.get(k, 0) for k in ("fp4.gluon", "fp4.triton")}
    assert took["fp4.gluon"] > 0 and took["fp4.triton"] == 0, took
    assert torch.isfinite(gluon_logits).all()
    assert rel_err(gluon_logits, triton_logits) < 2e-2
    same = (gluon_logits.argmax(-1) == triton_logits.argmax(-1)).float().mean().item()
    assert same >= 0.9, same
    from trace_rl.bench.decode_grid import prime_decode

    prime_decode(engine, B, L)                 # the captured step: the Gluon GEMMs as PDL launches in the graph
    n = paths.counts.get("fp4.gluon", 0)
    engine.decode_step(B, L, (1.0, 0, 1.0))
    torch.cuda.synchronize()
    assert engine.graphs.captured and paths.counts.get("fp4.gluon", 0) > n
