#!/usr/bin/env bash
# The stacked operand cache on the fixed 8k workload's FP4 step (issue 16): q/k/v and gate/up of the nvfp4 rollout
# model as ONE cuBLAS GEMM + epilogue each (per-row factors carry each projection's own global scale) vs one GEMM per
# projection on the same stacked buffer (the path before). Usage: benchmarks/engine_opstack_h200.sh OUT_DIR (from the
# repo root; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH). < 120 s. Registered in
# benchmarks/h200_session_checks.sh as `opstack`.
# 1. benchmarks/engine_opstack.py -> OUT/opstack.json (+ .log): Qwen3-8B shape, random weights, the first 8 of 36 layers
#    (LAYERS=...), w4a4-kv4 (page pool, Gluon attention, operand cache stacked), B = 313, contexts 257 and 8447 (KV
#    random): CUDA-graph step median (10 replays) with models.linear.STACK_ROLLOUT_OPERANDS on and off (graphs
#    re-captured), the two eager forwards' logits compared; the engine's operand-cache bytes vs separate caches, and
#    the full Qwen3-8B's GB before/after from its shapes. No new measurement starts after 62 s.
# 2. if >= 20 s are left: pytest -m gpu tests/kernels/test_operand_stack.py (Qwen3-8B q/k/v, gate/up at M = 313:
#    stacked vs per-part GEMMs within one bf16 step, vs a float64 reference) and tests/engine/test_operand_stack_gpu.py
#    (2 layers of Qwen3-8B, B = 313: stacked vs per-part logits, cached bytes not grown beyond the row factors)
#    -> OUT/pytest.{log,xml}
# 3. OUT/summary.json: rcs, pytest tail, per context step ms per-part/stacked, saved ms per layer and x 36, logits
#    comparison, cache bytes.
# DRY=1: the CPU dry path (tiny preset, no operand cache: checks the plumbing and this summary; no pytest).
. "$(dirname "$0")/h200_check.sh"
timeout 82 $PY benchmarks/engine_opstack.py "$OUT/opstack.json" --layers "${LAYERS:-8}" --budget-s 62 \
    ${DRY:+--dry} > "$OUT/opstack.log" 2>&1
bench_rc=$?
# then, with what is left (>= 20 s; Triton's cache is warm), the GPU tests
test_rc=-1
if [ -z "${DRY:-}" ] && [ $(( $(date +%s) - start )) -le 95 ]; then
    run_pytest 116 -x -m gpu tests/kernels/test_operand_stack.py tests/engine/test_operand_stack_gpu.py
fi
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "timed_out": bench_rc in (124, 137), "pytest_rc": test_rc,
     "pytest_tail": tail(out, "pytest.log", 6)}
try:
    r = json.load(open(os.path.join(out, "opstack.json")))
    s.update({k: r.get(k) for k in ("device", "layers_run", "batch", "cache", "full_model_cache", "error", "seconds")})
    s["steps"] = [x for x in r["rows"] if "graph_step_ms" in x]
    s["ab"] = [x for x in r["rows"] if "logits_stacked_vs_per_part" in x]
except Exception as e:   # noqa: BLE001 - a cut or failed run: say why, keep the log's tail
    s["summary_error"] = repr(e)
s["log_tail"] = [x for x in tail(out, "opstack.log", 20) if "USDT" not in x and "Warning" not in x][-10:]
write(out, s, 9000)
PY
echo "total $(( $(date +%s) - start )) s"
