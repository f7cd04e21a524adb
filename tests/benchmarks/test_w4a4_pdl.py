"""benchmarks/w4a4_pdl.py on CPU: its rows' variants (every one computes at a tiny shape through Triton's interpreter,
the apart ones timed under both switch values), the engine's before / after variants, the ratios and the summary, and
the check's registration (the timing runs on the H200: benchmarks/w4a4_pdl_h200.sh, check `w4a4pdl`)."""

import os

import pytest
import torch
import w4a4_pdl as bench
import w4a4_producer_pairs as wp

from trace_rl.backends import get_backend
from trace_rl.kernels import linear

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("fmt", bench.FMTS)
@pytest.mark.parametrize("pair", list(bench.PAIRS))
def test_row_variants_compute(pair, fmt):
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter test; the GPU checks the bits inside the bench")
    K, N = 64, 40
    gen = torch.Generator().manual_seed(5)
    w = torch.randn(N, K, generator=gen) * 0.05
    p = get_backend("fp4").prepare_weight(w, fmt)
    inp = wp.make_inputs(bench.PAIRS[pair][2], 3, K, "cpu", torch.bfloat16, gen)
    timed = bench.timed_variants(pair, fmt)
    names = [n for n, _, _ in timed]
    assert {"w4a16", "w4a4_apart_old", "w4a4_apart_pdl"} <= set(names)
    assert ("w4a4_fused" in names) == (pair in ("qkv", "gate_up"))
    assert ("w4a4_torch_silu_apart_pdl" in names) == (pair == "mlp_down" and fmt == "nvfp4")
    assert all((pdl is not None) == n.endswith(("_old", "_pdl")) for n, _, pdl in timed)
    outs = {n: bench.with_switch(pdl, lambda fn=fn: fn(inp, p, w.to(torch.bfloat16))) for n, fn, pdl in timed}
    assert torch.equal(outs["w4a4_apart_old"], outs["w4a4_apart_pdl"])      # off the GPU the switch changes nothing
    assert all(o.shape == (3, N) and torch.isfinite(o).all() for o in outs.values())
    before, after, w16, _ = bench.engine_variants(pair, fmt, 1)
    assert {before, after, w16} <= set(names)


def test_with_switch_restores():
    was = linear.QUANTIZE_PDL
    assert bench.with_switch(not was, lambda: linear.QUANTIZE_PDL) is (not was)
    assert linear.QUANTIZE_PDL is was
    with pytest.raises(ZeroDivisionError):
        bench.with_switch(not was, lambda: 1 / 0)
    assert linear.QUANTIZE_PDL is was


def test_engine_variants_order_ratios_summary():
    assert bench.engine_variants("o_proj", "nvfp4", 4)[:3] == ("w4a4_apart_old", "w4a4_apart_pdl", "w4a16")
    assert bench.engine_variants("mlp_down", "nvfp4", 4)[:3] == ("w4a4_torch_silu_apart_old",
                                                                  "w4a4_torch_silu_apart_pdl", "w4a16_torch_silu")
    assert bench.engine_variants("qkv", "mxfp4", 1)[:2] == ("w4a4_fused", "w4a4_fused")
    jobs = bench.order(["gate_up", "o_proj", "mlp_down"], ["nvfp4"], [64, 1, 16])
    assert jobs[:3] == [("o_proj", "nvfp4", 1), ("o_proj", "nvfp4", 16), ("mlp_down", "nvfp4", 1)]
    assert jobs[-1] == ("gate_up", "nvfp4", 64)
    row = {"pair": "o_proj", "fmt": "nvfp4", "M": 1, "gemm_path": "gluon", "engine_before": "w4a4_apart_old",
           "engine_after": "w4a4_apart_pdl", "engine_w4a16": "w4a16",
           "us": {"w4a16": 10.0, "w4a4_apart_old": 13.0, "w4a4_apart_pdl": 11.0},
           "bits": {"graph_old_eq_eager": True, "graph_pdl_eq_eager": True, "finite": True}}
    bench.ratios(row)
    assert row["pdl_over_old"] == 0.846 and row["engine_before_over_w4a16"] == 1.3
    assert row["engine_after_over_w4a16"] == 1.1 and row["meets_target_after"]
    row2 = dict(row, M=4, us={"w4a16": 10.0, "w4a4_apart_old": 13.0, "w4a4_apart_pdl": 12.0})
    bench.ratios(row2)
    s = bench.summarize({"rows": [row, row2], "skipped": [{}], "errors": []})
    assert s["bits_ok"] and s["over_target_after"] == ["o_proj nvfp4 M=4: 1.2"]
    assert s["apart_over_target_after"] == ["o_proj nvfp4 M=4: 1.2"]
    assert s["worst_engine_over_w4a16"]["before"]["o_proj nvfp4"] == {"ratio": 1.3, "M": 1}
    assert s["worst_engine_over_w4a16"]["after"]["o_proj nvfp4"] == {"ratio": 1.2, "M": 4}
    assert s["pdl_over_old_gluon"] == {"min": 0.846, "max": 0.923, "n": 2} and s["skipped"] == 1
    assert not bench.summarize({"rows": [dict(row, bits={})]})["bits_ok"]


def test_check_is_registered():
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "w4a4pdl) bash benchmarks/w4a4_pdl_h200.sh" in checks and "#   w4a4pdl " in checks
    script = open(os.path.join(ROOT, "benchmarks", "w4a4_pdl_h200.sh")).read()
    assert "h200_check.sh" in script and "--precompile-only" in script and "test_w4a4_pdl_gpu.py" in script
