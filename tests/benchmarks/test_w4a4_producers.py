"""benchmarks/w4a4_producers.py on CPU: its pairs at a tiny shape through Triton's interpreter (the fused producer's
operand = the unfused producer + the separate quantize, and the W4A4 pair's output = W4A4 apart's, bit for bit; every
variant of every pair computes), its row bookkeeping and the check script's registration (the timing runs on the
H200: benchmarks/w4a4_producers_h200.sh, check `w4a4prod`)."""

import os

import pytest
import torch
import w4a4_producer_pairs as wp
import w4a4_producers as bench

from trace_rl.backends import get_backend

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = {"layer_input": (64, 48), "mlp_down": (64, 32), "o_proj": (64, 40)}    # K x N: whole mxfp4 blocks, odd N tiles

pytestmark = [pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("fmt", wp.FMTS)
@pytest.mark.parametrize("pair", list(wp.PAIRS))
def test_pairs_compute_the_same_operand_and_output(pair, fmt):
    if torch.cuda.is_available():
        pytest.skip("the CPU interpreter test; the GPU runs these checks inside the bench")
    K, N = TINY[pair]
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(N, K, generator=gen) * 0.05
    p = get_backend("fp4").prepare_weight(w, fmt)
    inp = wp.make_inputs(pair, 3, K, "cpu", torch.bfloat16, gen)
    res = wp.check_pair(pair, fmt, inp, p, w.to(torch.bfloat16))
    assert res["output_bits"] and res["finite"], res
    assert res.get("operand_bits", True), res
    assert res["rel_w4a4_vs_w4a16"] < 0.3 and res["rel_w4a16_vs_bf16"] < 0.3, res    # FP4 noise, not garbage
    prequant = wp.produce_quantized(pair, inp, fmt)
    names = set(wp.variants(pair, fmt, prequant))
    assert {"bf16", "w4a16", "w4a4", "w4a4_apart"} <= names
    assert ("quantize_alone" in names) == (pair == "o_proj") and ("producer_w4a4" in names) == (pair != "o_proj")
    for fn in wp.variants(pair, fmt, prequant).values():       # every timed call runs on these inputs
        fn(inp, p, w.to(torch.bfloat16))


def test_rows_and_ratios():
    assert bench.pair_ms("o_proj", [1, 512]) == [1, 313, 512] and bench.pair_ms("mlp_down", [4, 1]) == [4, 1]
    assert bench.parse_list("1,16", (), int) == [1, 16] and bench.parse_list(None, wp.PAIRS) == list(wp.PAIRS)
    with pytest.raises(SystemExit, match="not among"):
        bench.parse_list("qkv", wp.PAIRS)
    row = {"bf16_us": 30.0, "w4a16_us": 15.0, "w4a4_us": 16.0, "w4a4_apart_us": 20.0, "producer_w4a16_us": 2.0,
           "producer_w4a4_us": 2.5}
    bench._ratios(row)
    assert row["w4a4_over_w4a16"] == 1.067 and row["apart_over_w4a16"] == 1.333 and row["meets_target"]
    assert row["speedup_vs_bf16"] == {"w4a16": 2.0, "w4a4": 1.875, "w4a4_apart": 1.5}
    assert row["producer_w4a4_minus_w4a16_us"] == 0.5
    row = {"w4a16_us": 10.0, "w4a4_us": 12.0, "w4a4_apart_us": 14.0, "quantize_alone_us": 3.5,
           "engine_today": bench.engine_today("o_proj", "nvfp4", 313)[0], "engine_today_w4a16": "w4a16"}
    bench._ratios(row)
    assert not row["meets_target"] and row["quantize_share_of_apart"] == 0.25
    assert row["engine_today"] == "w4a4_apart" and row["engine_today_over_w4a16"] == 1.4
    assert bench.engine_today("layer_input", "mxfp4", 1)[:2] == ("w4a4", "w4a16")
    today = bench.engine_today("mlp_down", "nvfp4", 16)
    assert set(today[:2]) <= set(wp.variants("mlp_down", "nvfp4"))
    packed = get_backend("fp4").prepare_weight(torch.randn(40, 64), "nvfp4")
    assert bench.gemm_path(1, packed) == "triton"          # CPU: no sm_90, the dispatch's Triton answer


def test_check_is_registered():
    checks = open(os.path.join(ROOT, "benchmarks", "h200_session_checks.sh")).read()
    assert "w4a4prod) bash benchmarks/w4a4_producers_h200.sh" in checks
    script = open(os.path.join(ROOT, "benchmarks", "w4a4_producers_h200.sh")).read()
    assert "h200_check.sh" in script and "--precompile-only" in script and "summary" in script
