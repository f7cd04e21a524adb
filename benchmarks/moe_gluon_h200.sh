#!/usr/bin/env bash
# benchmarks/moe_gluon_h200.sh (check `moegluon`; issue 15 item 3: the grouped MoE FP4 GEMM at >= 2.5x the BF16 grouped
# baseline for 64-512 tokens): the opt-in Gluon grouped kernel (trace_rl/kernels/fp4_grouped_gluon.py). Usage (repo
# root; python3, torch, Triton 3.6, one H200), < 120 s:
#     benchmarks/moe_gluon_h200.sh OUT_DIR
# 1. in parallel (nothing timed yet): pytest tests/kernels/test_fp4_grouped_gluon.py (4 shards, own processes, <= 50 s
#    each; -v logs show which test hung if one does): vs the
#    torch reference and the Triton grouped kernel at 0 / 1 / 17 / 46 / 70 rows per expert, every token tile, nvfp4 +
#    mxfp4, bias, W4A4 prequantized, zero tail, grid-size bit identity -> OUT/pytest_{0..3}.{log,rc}; and
#    benchmarks/kernels_moe_gluon.py --precompile-only, one process per (GEMM, format, kernel group) (Triton's disk
#    cache)
#    -> OUT/precompile_*.log
# 2. benchmarks/kernels_moe_gluon.py -> OUT/moe_gluon.json (+ .log): B = 409, 512, 128, 256 routed tokens (top-8 of
#    128, fixed seed; row-count stats), gate+up [1536 x 2048] and down [2048 x 768] (the missed cells B = 409 / 512
#    first, a budget cut drops B = 256 last): cuBLAS loop (graph) and
#    torch._grouped_mm vs the Triton grouped kernel vs Gluon token tiles 16 / 32 / 64, nvfp4 + mxfp4, + nvfp4 W4A4
#    prequantized; every output checked against the torch reference first; CUDA-graph medians; bw vs the read ceiling
#    measured in the same run. A budget skips the last (GEMM, B) rows ("skipped").
# 3. OUT/summary.json: rcs, pytest tail, per (GEMM, B) the row stats, bf16 best, Triton vs Gluon us / x_bf16 / bw.
. "$(dirname "$0")/h200_check.sh"
T=tests/kernels/test_fp4_grouped_gluon.py
i=0
for k in "reference_and_triton and (nvfp4-1 or nvfp4-3 or nvfp4-6)" "reference_and_triton and mxfp4 or w4a4" \
         "reference_and_triton and nvfp4-v" "not reference_and_triton and not w4a4"; do
    ( timeout 50 $PY -m pytest -v -p no:cacheprovider -rs -k "$k" "$T" > "$OUT/pytest_$i.log" 2>&1
      echo $? > "$OUT/pytest_$i.rc" ) &
    i=$((i + 1))
done
for g in gate_up down; do
    for f in nvfp4 mxfp4; do
        for p in 0 1 2; do
            [ "$f$p" = mxfp42 ] && continue
            timeout 50 $PY benchmarks/kernels_moe_gluon.py --precompile-only --gemms $g --fmts $f --parts $p \
                > "$OUT/precompile_${g}_${f}_$p.log" 2>&1 &
        done
    done
done
wait
test_rc=$(cat "$OUT"/pytest_*.rc 2>/dev/null | sort -n | tail -1)   # the worst shard's
test_rc=${test_rc:-99}
pre_rc=$(grep -l "FAILED\|Traceback" "$OUT"/precompile_*.log 2>/dev/null | wc -l)
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/kernels_moe_gluon.py --out "$OUT/moe_gluon.json" \
    --budget-s $(( left > 30 ? left - 16 : 15 )) > "$OUT/moe_gluon.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"pytest_rc": test_rc, "precompile_logs_with_errors": pre_rc, "bench_rc": bench_rc, "pytest_tails": [l for i in range(4) for l in tail(out, f"pytest_{i}.log", 3)],
     "precompile_tail": [l for n in sorted(os.listdir(out)) if n.startswith("precompile_")
                        for l in tail(out, n, 12) if not l.startswith("compiled")][:12]}
try:
    r = json.load(open(os.path.join(out, "moe_gluon.json")))
    s["read_TBps"] = round(r.get("ceilings", {}).get("read_TBps", 0), 3)
    rows = []
    for row in r["rows"]:
        keep = {k: row.get(k) for k in ("gemm", "B", "rows_per_expert", "active_experts", "gluon_default_tile",
                                        "cublas_loop_us", "grouped_mm_us", "bf16_best_us")}
        for f in ("nvfp4", "mxfp4"):
            keep[f + "_triton"] = {k: v for k, v in row.get(f + "_triton", {}).items() if k != "rel_err"}
            keep[f + "_gluon"] = {bm: row.get(f"{f}_gluon_{bm}", {}).get("us", row.get(f"{f}_gluon_{bm}", {})
                                                                         .get("error", ""))
                                  for bm in ("16", "32", "64", "64x256", "32x256", "64x64", "64o", "default_grid_sms")
                                  if f"{f}_gluon_{bm}" in row}
            keep[f + "_gluon_best"] = row.get(f + "_gluon_best")
        keep["nvfp4_a4"] = {k: {kk: vv for kk, vv in row.get(f"nvfp4_a4_{k}", {}).items() if kk != "rel_err"}
                            for k in ("triton", "gluon")}
        rows.append(keep)
    s["rows"] = rows
    if "unfinished_row" in r:   # the bench was cut (timeout or a hang): what it had measured of the row
        s["unfinished_row"] = {k: v for k, v in r["unfinished_row"].items() if not k.endswith("rel_err")}
    s["skipped"] = r.get("skipped", [])
    if "error" in r:
        s["bench_error"] = r["error"][-800:]
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "moe_gluon.log", 15)
write(out, s, 9000)
PY
