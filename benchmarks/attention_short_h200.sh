#!/usr/bin/env bash
# benchmarks/attention_short_h200.sh (issues 15/16: the Gluon FP4-KV attention's per-program fixed cost at short
# contexts): the persistent variant (GluonAttentionConfig(persistent=True), paged_attention_gluon_persistent.py)
# against the shipped Gluon kernel and the shipped Triton kernel. Usage: benchmarks/attention_short_h200.sh OUT_DIR
# (from the repo root; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH). < 120 s.
# 1. pytest tests/kernels/test_paged_attention_gluon.py -m gpu -k persistent: nvfp4 and mxfp4, ragged lengths (tails
#    of 1-88 tokens, two empty sequences, stale NaN V scales, garbage block-table entries; groups 4 and 16) with the
#    default grid and with 3-7 programs (several items per program: the ring counter across items, the prefetched
#    next item), vs the float64 reference, the shipped Gluon kernel and the shipped Triton kernel per sequence; a
#    second run bit-identical -> OUT/pytest.{log,xml} (5 cases, ~9 compiles).
# 2. benchmarks/attention_short.py -> OUT/attention_short.json (+ .log): Qwen3-8B heads, B = 313 x L = 257 / 1024 /
#    4352 / 8447 and B = 32 x 8192, nvfp4 and mxfp4: Triton kernel vs Gluon vs Gluon persistent, CUDA-graph medians,
#    fraction of the measured read ceiling on the format's live cache bytes, persistent / Gluon speedup, the
#    variants' output differences (persistent vs Gluon bit-identical or not).
# 3. OUT/summary.json: rcs, pytest tail, per row the us / fractions / speedups / differences.
. "$(dirname "$0")/h200_check.sh"
run_pytest 50 -x -m gpu tests/kernels/test_paged_attention_gluon.py -k persistent   # CPU tests: TRITON_INTERPRET
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/attention_short.py --out "$OUT/attention_short.json" \
    --budget-s $(( left > 40 ? left - 20 : 10 )) > "$OUT/attention_short.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$test_rc" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, test_rc, bench_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"pytest_rc": test_rc, "bench_rc": bench_rc, "pytest_tail": tail(out, "pytest.log", 14)}
try:
    r = json.load(open(os.path.join(out, "attention_short.json")))
    s["read_TBps"] = r["ceilings"]["read_TBps"]
    s["elapsed_s"] = r.get("elapsed_s")
    keep = ("format", "batch", "context", "roofline_us", "triton_us", "triton_bw_frac", "persistent_speedup_vs_gluon",
            "persistent_vs_gluon", "error")
    s["rows"] = [{**{k: row[k] for k in keep if k in row},
                  **{n: {k: v for k, v in row.get(n, {}).items() if k in ("us", "bw_frac", "speedup_vs_triton", "nan",
                                                                          "rel_err_vs_reference", "error")}
                     for n in ("gluon", "persistent")}} for row in r["rows"]]
    s["skipped"] = r.get("skipped", [])
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "attention_short.log", 20)
write(out, s, 6000)
PY
