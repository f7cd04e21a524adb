"""GPU (sm_90, Triton 3.6; check `oprojpf`): the prefetch-all configs of the Gluon FP4 GEMM for o_proj's W4A4 PDL path
(fp4_gemm_gluon_prefetch.py) and the attention's griddepcontrol.launch_dependents:
- each candidate against the float64 reference at o_proj's 4096x4096 (M = 1 / 16, W4A4 under PDL) and a ragged
  shape (N = 200, K = 1536, M = 5, W4A16); bit-equal to the shipped config where its K partition is the shipped one
  (pf_k256_split3 / pf_k512_split3 nvfp4, pf_k512_split3 mxfp4 at M <= 8, split4 mxfp4 at M = 9..16);
- fp4_linear's W4A4 path with the table naming a candidate, captured in a CUDA graph after a kernel that writes its
  input (its quantize a PDL launch): the capture launched the candidate, and the replay = the same config run
  eagerly on the eagerly quantized operand;
- the Gluon decode attention (one-program-per-item and persistent; nvfp4 / mxfp4 caches, mxfp4's checked default
  with its REDO launch) and the Triton one (one split / split + merge) give the same bits with launch_dependents on
  and off, and attention -> o_proj W4A4 in a graph (the quantize a PDL dependent of the signalling attention) =
  eager."""

from dataclasses import replace

import pytest
import torch

from tests.gpu_marks import gpu36
from tests.kernels._compare import rel_err as _rel
from tests.kernels.test_fp4_gemm_gluon_mid_m import _split
from tests.kernels.test_fp4_gemm_gluon_small_grid import _ref, _weight
from trace_rl.kernels import fp4_gemm_gluon_prefetch as pf
from trace_rl.kernels import linear
from trace_rl.kernels.fp4_gemm_gluon_prefetch import PREFETCH_ALL_CANDIDATES, same_partition, shipped_w4a4_config
from trace_rl.kernels.hopper_fp4 import to_hopper

pytestmark = gpu36 + [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
                      pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning")]

CASES = [(name, fmt) for name, (_, fmts) in PREFETCH_ALL_CANDIDATES.items() for fmt in fmts]


@pytest.mark.parametrize("name,fmt", CASES)
def test_candidate_matches_reference_and_shipped_bits(name, fmt, gen):
    """W4A4 as fp4_linear launches it (the quantized operand, nvfp4's row scale, PDL: the check's compiles), and
    W4A16 at a ragged shape."""
    from trace_rl.formats import per_token
    from trace_rl.kernels.fp4_gemm_gluon import fp4_matmul_gluon
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    c, _ = PREFETCH_ALL_CANDIDATES[name]
    packed = _weight(4096, 4096, fmt, gen, "cuda")
    h = to_hopper(packed.q)
    for M in (1, 16):
        xq, rs = quantize_dequant_bf16(torch.randn(M, 4096, generator=gen).to(torch.bfloat16).cuda(), per_token(fmt))
        y = fp4_matmul_gluon(xq, h, c, row_scale=rs, pdl=True)
        assert y.shape == (M, 4096) and _rel(y, _ref(xq, packed, rs)) < 1e-2, M
        base = shipped_w4a4_config(M, fmt, *h.padded)
        if same_partition(c, base, fmt, 4096, _split(M, h, base)):
            assert torch.equal(y, fp4_matmul_gluon(xq, h, base, row_scale=rs, pdl=True)), M
    packed = _weight(200, 1536, fmt, gen, "cuda")       # a partial row tile; 6 / 3 K steps: the split evened out
    x = torch.randn(5, 1536, generator=gen).to(torch.bfloat16).cuda()
    y = fp4_matmul_gluon(x, to_hopper(packed.q), c, pdl=True)
    assert y.shape == (5, 200) and _rel(y, _ref(x, packed)) < 1e-2


@pytest.mark.parametrize("name,fmt", CASES)
@pytest.mark.parametrize("M", [1, 16])
def test_w4a4_pdl_path_with_candidate_graph_equals_direct_launch(name, fmt, M, capture, gen, monkeypatch):
    from trace_rl.formats import per_token
    from trace_rl.kernels import fp4_gemm_gluon
    from trace_rl.kernels.row_quantize import quantize_dequant_bf16

    c, _ = PREFETCH_ALL_CANDIDATES[name]
    K = N = 4096
    packed = _weight(N, K, fmt, gen, "cuda")
    h = linear.hopper_weight(packed)
    x = (torch.randn(M, K, generator=gen) * 3).to(torch.bfloat16).cuda()
    s = torch.full((1, K), 1.5, dtype=torch.bfloat16, device="cuda")
    monkeypatch.setattr(pf, "W4A4_PDL_GRID", {**pf.W4A4_PDL_GRID, fmt: {h.padded: {pf.m_bucket(M): c}}})
    launched = []
    real = fp4_gemm_gluon.fp4_matmul_gluon

    def spy(x2, w, config=None, **kw):
        launched.append((config, kw.get("pdl")))
        return real(x2, w, config, **kw)

    monkeypatch.setattr(fp4_gemm_gluon, "fp4_matmul_gluon", spy)
    g, out = capture(lambda: linear.fp4_linear(x * s, packed, fmt))   # the multiply writes the quantize's input
    g.replay()
    torch.cuda.synchronize()
    assert launched[-1] == (c, True), launched[-1]                    # the capture took the table's config, PDL
    xq, rs = quantize_dequant_bf16(x * s, per_token(fmt))
    assert torch.equal(out, real(xq, h, c, row_scale=rs, out_dtype=torch.bfloat16, pdl=True))   # the graph's compile
    assert launched[0][0] is None                                       # the eager warm-up: config_for's pick


def _caches(fmt, B, L, gen):
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks", "attention.py")
    spec = importlib.util.spec_from_file_location("_oprojpf_attention_bench", path)
    A = importlib.util.module_from_spec(spec)     # benchmarks/attention.py: valid random caches (a CUDA generator)
    spec.loader.exec_module(A)
    cuda_gen = torch.Generator(device="cuda").manual_seed(int(torch.randint(1 << 30, (1, ), generator=gen)))
    pages = -(-L // 64)
    table = torch.randperm(B * pages, generator=gen).to(torch.int32).reshape(B, pages).cuda()
    lens = torch.randint(L // 2, L + 1, (B, ), generator=gen).to(torch.int32).cuda()
    q = torch.randn(B, A.HQ, A.D, generator=gen).to(torch.bfloat16).cuda()
    return (q, A.random_cache(fmt, "k", B * pages, 64, cuda_gen), A.random_cache(fmt, "v", B * pages, 64, cuda_gen),
            table, lens)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("persistent", [False, True])
def test_attention_launch_dependents_same_bits_and_pdl_o_proj(fmt, persistent, capture, gen):
    from trace_rl.kernels.paged_attention_gluon import decode_attention_gluon, default_config

    q, k, v, table, lens = _caches(fmt, 16, 700, gen)
    base = replace(default_config(4, k.fmt), persistent=persistent)
    outs = {d: decode_attention_gluon(q, k, v, table, lens, 0.088, config=replace(base, launch_dependents=d))
            for d in (True, False)}
    assert torch.equal(outs[True], outs[False])
    p = _weight(4096, 4096, fmt, gen, "cuda")
    linear.hopper_weight(p)

    def step():
        o = decode_attention_gluon(q, k, v, table, lens, 0.088, config=base)
        return linear.fp4_linear(o.reshape(16, 4096), p, fmt)

    eager = step().clone()
    g, out = capture(step)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
@pytest.mark.parametrize("splits", [1, 4])
def test_triton_attention_launch_dependents_same_bits(fmt, splits, gen):
    """The Triton decode attention: its last kernel (the attention at one split, else the merge) signals or not."""
    from trace_rl.kernels.paged_attention import decode_attention

    q, k, v, table, lens = _caches(fmt, 16, 700, gen)
    a, b = (decode_attention(q, k, v, table, lens, 0.088, splits=splits, launch_dependents=d) for d in (True, False))
    assert torch.equal(a, b)
