#!/usr/bin/env bash
# benchmarks/attention_gluon_h200.sh (issue 15, FP4-KV decode attention >= 0.75 of the read ceiling, nvfp4 and mxfp4):
# the opt-in Gluon warp-specialised kernel (trace_rl/kernels/paged_attention_gluon.py). Usage:
# benchmarks/attention_gluon_h200.sh OUT_DIR (from the repo root; python3, torch, Triton 3.6, one H200, device wheels on
# PYTHONPATH). < 120 s.
# 1. pytest tests/kernels/test_paged_attention_gluon.py -m gpu, the mxfp4 cases (the exact bias multiply, the
#    default: group 4 / 4 stages, group 1 / 3 stages, group 16 / 2 stages; the bias folded into the scale pairs,
#    opt-in mx_fold=True: group 4 / 4 stages; the first run of the mxfp4 kernel) and nvfp4 group 4 / 4 stages (the nvfp4 path
#    after the format switch; its other two cases passed before it, results/*_1202b): ragged lengths with tails of
#    1-88 tokens, an empty sequence, stale NaN V scales, garbage block-table entries; vs the float64 reference and the
#    shipped kernel, per sequence; a second run bit-identical -> OUT/pytest.{log,xml}. It also compiles kernels the
#    benchmark uses (Triton's cache).
# 2. benchmarks/attention_gluon.py -> OUT/attention_gluon.json (+ .log): Qwen3-8B heads, B = 32 / 256 x 8k and
#    32 x 32k, per shape mxfp4 then nvfp4: the shipped Triton kernel over that cache vs the Gluon kernel (2 and 4
#    stages, default config: mxfp4 with the exact bias multiply, + 4 stages folded for mxfp4; 3 stages, the slowest on 2026-12-02, dropped for time) vs SDPA over a contiguous bf16 cache (cuDNN and the other
#    backends; once per shape), CUDA-graph medians, fraction of the measured read ceiling on that format's cache bytes,
#    speedups vs SDPA, the Gluon output's difference from the shipped kernel's and from the reference.
# 3. OUT/summary.json: rcs, pytest tail, per row (format, B, context) the us / fractions / speedups / errors.
. "$(dirname "$0")/h200_check.sh"
run_pytest 45 -x -m gpu tests/kernels/test_paged_attention_gluon.py -k "mxfp4 or nvfp4-4-4"   # the CPU tests need TRITON_INTERPRET
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/attention_gluon.py --out "$OUT/attention_gluon.json" \
    --budget-s $(( left > 40 ? left - 25 : 10 )) > "$OUT/attention_gluon.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$test_rc" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, test_rc, bench_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"pytest_rc": test_rc, "bench_rc": bench_rc, "pytest_tail": tail(out, "pytest.log", 14)}
try:
    r = json.load(open(os.path.join(out, "attention_gluon.json")))
    s["read_TBps"] = r["ceilings"]["read_TBps"]
    s["elapsed_s"] = r.get("elapsed_s")
    s["rows"] = [{k: v for k, v in row.items() if k != "sdpa"} for row in r["rows"]]
    s["skipped"] = r.get("skipped", [])
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "attention_gluon.log", 20)
write(out, s, 6000)
PY
