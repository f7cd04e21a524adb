#!/usr/bin/env bash
# wsync (issue 15, weight sync < 15 ms): the 8B weight-sync timing, default path vs `quantize(..., fast=True)` vs
# `quantize_relayout` (quantize with the Hopper re-layout fused into its store, nvfp4 and mxfp4: 16 x 256 tiles over
# rows and K), each checked bit for bit against the default path on all 252 weights; then the GPU tests.
# Usage: benchmarks/weight_sync_h200.sh OUT_DIR (from the repo root, device wheels on PYTHONPATH). < 120 s.
# Writes OUT_DIR/pytest.log, OUT_DIR/pytest.xml, OUT_DIR/kernels_quant.json (+ .log) and OUT_DIR/summary.json:
#   bench_rc / pytest_rc / pytest_tail; from kernels_quant.json["quant"] (keys with "8b"):
#   requant_8b_{nvfp4,mxfp4}{,_fast}_graph_ms (quantize + relayout, 252 linears, one CUDA graph),
#   quantize_8b_*_graph_ms, relayout_8b_*_graph_ms, quantize_8b_*_fast_bit_exact_vs_default;
#   requant_8b_{nvfp4,mxfp4}_fused_graph_ms and _fused_bit_exact_vs_default (QTensor codes / scales / global
#   scale and layout words / scales / row factors of every weight = quantize(fast=False) then relayout;
#   _fused_mismatch_weights lists the first bad ones); amax_8b_flat_graph_ms (nvfp4's tensor amax pass alone).
# Tests, most important first (pytest stops at the 114 s mark): the fused kernel (ragged / NaN / in-place cases and
# 8B-sized weights, both formats), the re-layout kernel (test_hopper_fp4; its grid now splits K), the fast quantize
# (its 8B-sized GPU cases are left to the bench's all-weights check; the odd 771-row ones stay), the quantize kernels.
. "$(dirname "$0")/h200_check.sh"
timeout 68 $PY benchmarks/kernels.py --sections quant --fast-quantize \
    --out "$OUT/kernels_quant.json" > "$OUT/kernels_quant.log" 2>&1
bench_rc=$?
run_pytest 114 tests/kernels/test_quantize_relayout.py tests/kernels/test_hopper_fp4.py \
    tests/kernels/test_quantize_fast_div.py tests/kernels/test_quantize.py \
    -k "not (large_weight_gpu and (1024 or 4096)) and not (relayout_large_gpu and 1024)"
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "pytest_rc": test_rc,
     "pytest_tail": open(os.path.join(out, "pytest.log")).read().strip().splitlines()[-3:]}
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
if "sync" not in s or len(s["sync"]) < 4:   # timed out / failed: what the log has
    s["bench_log_tail"] = open(os.path.join(out, "kernels_quant.log")).read().strip().splitlines()[-15:]
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(s, indent=1))
PY
