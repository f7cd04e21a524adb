#!/usr/bin/env bash
# wsync (issue 15, weight sync < 15 ms): GPU tests of the fast weight quantize (`quantize(..., fast=True)`: block-tile
# kernel, reciprocal + exact FMA divisions; `quantize_relayout`: nvfp4 with the re-layout fused in) and the 8B
# weight-sync timing, default path vs fast vs fused.
# Usage: benchmarks/weight_sync_h200.sh OUT_DIR (from the repo root, device wheels on PYTHONPATH). < 120 s.
# Writes OUT_DIR/pytest.log, OUT_DIR/pytest.xml, OUT_DIR/kernels_quant.json (+ .log) and OUT_DIR/summary.json:
#   pytest_rc / pytest_tail; from kernels_quant.json["quant"]: requant_8b_{nvfp4,mxfp4,{nvfp4,mxfp4}_fast}_graph_ms
#   (quantize + re-layout, 252 linears, one CUDA graph), quantize_8b_*_graph_ms, relayout_8b_*_graph_ms,
#   quantize_8b_{nvfp4,mxfp4}_fast_bit_exact_vs_default (codes/scales of all 252 weights equal the default path's);
#   requant_8b_nvfp4_fused_graph_ms (quantize_relayout: the re-layout fused into the quantize store) and
#   requant_8b_nvfp4_fused_bit_exact_vs_default (QTensor + layout of 8 weights = quantize then relayout).
. "$(dirname "$0")/h200_check.sh"
# the timing first (it also checks the fast path's codes/scales against the default path on all 252 weights)
timeout 68 $PY benchmarks/kernels.py --sections quant --fast-quantize \
    --out "$OUT/kernels_quant.json" > "$OUT/kernels_quant.log" 2>&1
bench_rc=$?
run_pytest 114 tests/kernels/test_quantize_fast_div.py tests/kernels/test_quantize_relayout.py \
    tests/kernels/test_quantize.py
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "pytest_rc": test_rc,
     "pytest_tail": open(os.path.join(out, "pytest.log")).read().strip().splitlines()[-3:]}
try:
    q = json.load(open(os.path.join(out, "kernels_quant.json"))).get("quant", {})
    s["sync"] = {k: v for k, v in q.items() if "8b" in k}
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
if "sync" not in s or len(s["sync"]) < 4:   # timed out / failed: what the log has
    s["bench_log_tail"] = open(os.path.join(out, "kernels_quant.log")).read().strip().splitlines()[-15:]
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(s, indent=1))
PY
