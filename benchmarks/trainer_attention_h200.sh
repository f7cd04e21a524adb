#!/usr/bin/env bash
# benchmarks/trainer_attention_h200.sh: the trainer's float32 GQA attention on one H200, before/after
# causal_attention's plan (trace_rl/kv/causal.py). Usage: benchmarks/trainer_attention_h200.sh OUT_DIR (from the repo
# root of a checkout; python3, torch, one CUDA GPU, device wheels on PYTHONPATH). < 60 s.
# 1. benchmarks/trainer_attention.py -> OUT/trainer_attention.json (+ .log): at B=64, T=1274, 6/2 heads x 64, float32,
#    8 layers: peak memory (max_memory_allocated above the inputs), memory kept for backward, forward/backward ms of
#    SDPA's enable_gqa call (before: math kernel) and causal_attention (after: K/V expanded, efficient kernel);
#    layer 0's output and q/k/v gradients after vs before and both vs float64, bitwise repeatability of the
#    efficient backward, which SDPA node ran, torch's can_use_* checks with their reasons.
# 2. pytest tests/kv/test_causal.py (CPU tests + the GPU one: plan, efficient node, vs math) -> OUT/pytest.log
# 3. OUT/summary.json: rcs, the benchmark's summary and checks, pytest tail.
. "$(dirname "$0")/h200_check.sh"
timeout 38 $PY benchmarks/trainer_attention.py --out "$OUT/trainer_attention.json" > "$OUT/trainer_attention.log" 2>&1
bench_rc=$?
run_pytest 55 tests/kv/test_causal.py
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "pytest_rc": test_rc, "pytest_tail": tail(out, "pytest.log", 6)}
try:
    r = json.load(open(os.path.join(out, "trainer_attention.json")))
    keep = ("torch", "plan", "efficient_takes_gqa", "summary", "after_vs_before", "before_vs_float64",
            "after_vs_float64", "after_bitwise_repeatable", "before", "after")
    s.update({k: r.get(k) for k in keep})
    s["dispatch_ok"] = {k: v["ok"] for k, v in r.get("dispatch", {}).items()}
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "trainer_attention.log", 15)
write(out, s, 6000)
PY
