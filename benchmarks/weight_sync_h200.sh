#!/usr/bin/env bash
# wsync3 (issue 15, weight sync < 15 ms): the 8B weight-sync timing as the engine runs it (`QuantLinear.load_weight` of
# all 252 linears with their Hopper layouts derived: `quantize_relayout` in place, path fp4.sync.fused; one CUDA graph)
# against the default kernels (quantize(fast=False) then relayout), checked bit for bit first; then the GPU tests.
# Usage: benchmarks/weight_sync_h200.sh OUT_DIR (from the repo root, device wheels on PYTHONPATH). < 120 s.
# Writes OUT_DIR/pytest.log, OUT_DIR/pytest.xml, OUT_DIR/kernels_quant.json (+ .log) and OUT_DIR/summary.json:
#   bench_rc / pytest_rc / pytest_tail; from kernels_quant.json["quant"] (keys with "8b"):
#   sync_8b_{nvfp4,mxfp4}_engine_graph_ms (the engine's sync), _engine_fused_linears (how many of the 252 took the
#   fused path: 252), _engine_bit_exact_vs_default (codes / scales / global scale and layout words / scales / row
#   factors of every weight, after filling them with garbage, = quantize(fast=False) then relayout);
#   sync_8b_nvfp4_engine_batched_{graph_ms,bit_exact_vs_default,batches} (as NativeEngine.load_weights batches it:
#   ~1 GiB of weights per `load_linear_weights`, their tensor amaxes in one launch); amax_8b_{flat,batched,one_launch}
#   _graph_ms (nvfp4's tensor amax pass alone: a launch per weight / per batch / one for all 252);
#   requant_8b_{nvfp4,mxfp4}_graph_ms (default quantize + relayout), quantize_8b_*_graph_ms, relayout_8b_*_graph_ms.
#   EXTRA_BENCH_ARGS=--fast-quantize adds the fast quantizer and the raw quantize_relayout calls (longer).
# Tests, most important first (pytest stops at the 114 s mark): the engine's fused sync against the generic path
# (QuantLinear and stacked experts), the fused kernel (ragged / NaN / in-place cases), the re-layout kernel, the fast
# quantize (its 8B-sized GPU cases are left to the bench's all-weights check; the odd 771-row ones stay), the quantize
# kernels.
. "$(dirname "$0")/h200_check.sh"
timeout 72 $PY benchmarks/kernels.py --sections quant ${EXTRA_BENCH_ARGS:-} \
    --out "$OUT/kernels_quant.json" > "$OUT/kernels_quant.log" 2>&1
bench_rc=$?
run_pytest 114 tests/backends/test_quant_linear_sync.py tests/kernels/test_quantize_relayout.py \
    tests/kernels/test_hopper_fp4.py \
    tests/kernels/test_quantize_fast_div.py tests/kernels/test_quantize.py \
    -k "not (large_weight_gpu and (1024 or 4096)) and not (relayout_large_gpu and 1024)"
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "pytest_rc": test_rc, "pytest_tail": tail(out, "pytest.log", 3)}
try:
    log = open(os.path.join(out, "pytest.log")).read().splitlines()
    s["pytest_failed"] = [l for l in log if l.startswith("FAILED") or " FAILED" in l][:12]
except Exception:   # noqa: BLE001
    pass
try:
    q = json.load(open(os.path.join(out, "kernels_quant.json"))).get("quant", {})
    s["sync"] = {k: v for k, v in q.items() if "8b" in k}
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
if "sync" not in s or not any("engine_graph" in k for k in s["sync"]):   # timed out / failed: what the log has
    s["bench_log_tail"] = tail(out, "kernels_quant.log", 15)
write(out, s)
PY
