#!/usr/bin/env bash
# benchmarks/attention_gluon_h200.sh (issue 15, nvfp4-KV decode attention >= 0.6 of the read ceiling): the opt-in Gluon
# warp-specialised kernel (trace_rl/kernels/paged_attention_gluon.py). Usage: benchmarks/attention_gluon_h200.sh
# OUT_DIR (from the repo root; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH). < 120 s.
# 1. pytest tests/kernels/test_paged_attention_gluon.py (GPU: ragged lengths with tails of 1-88 tokens, an empty
#    sequence, stale NaN V scales, garbage block-table entries; vs the float64 reference and the shipped kernel, per
#    sequence; group 4 / 4 stages, group 1 / 2 stages, group 16 / 3 stages; a second run bit-identical)
#    -> OUT/pytest.{log,xml}. First: it also compiles the kernels the benchmark uses (Triton's cache).
# 2. benchmarks/attention_gluon.py -> OUT/attention_gluon.json (+ .log): Qwen3-8B heads, B = 32 / 256 x 8k and
#    32 x 32k: the shipped nvfp4 kernel vs the Gluon kernel (2, 3, 4 stages) vs SDPA over a contiguous bf16 cache
#    (cuDNN and the other backends), CUDA-graph medians, fraction of the measured read ceiling, the Gluon output's
#    difference from the shipped kernel's and from the reference.
# 3. OUT/summary.json: rcs, pytest tail, per row the us / fractions / speedups / errors.
. "$(dirname "$0")/h200_check.sh"
run_pytest 40 -x -m gpu tests/kernels/test_paged_attention_gluon.py   # the CPU tests need TRITON_INTERPRET (2026-12-02: -x stopped at one)
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/attention_gluon.py --out "$OUT/attention_gluon.json" \
    --budget-s $(( left > 40 ? left - 30 : 10 )) > "$OUT/attention_gluon.log" 2>&1
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
    s["rows"] = []
    for row in r["rows"]:
        keep = {k: v for k, v in row.items() if k != "sdpa"}
        if "sdpa" in row:
            keep["sdpa_best"], keep["sdpa_best_us"] = row["sdpa"]["best"], row["sdpa"]["best_us"]
            keep["sdpa_bw_frac"] = row["sdpa"].get("bw_frac")
        s["rows"].append(keep)
    s["skipped"] = r.get("skipped", [])
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "attention_gluon.log", 20)
write(out, s, 6000)
PY
