#!/usr/bin/env bash
# benchmarks/attention_fix_h200.sh (check attnfix; issue 15: the Gluon attention's LEAN variants faulted with an illegal
# address on 2026-12-02, benchmarks/results/attention_sass_h200_1202d_pytest.log: only the FIRST test, nvfp4 LEAN,
# faulted; the 3 after it failed in PagedKV.allocate, the sticky error of the first). Usage:
# benchmarks/attention_fix_h200.sh OUT_DIR (repo root; python3, torch, Triton 3.6, one H200). < 120 s.
# 1. benchmarks/attention_fault_case.py: every case (the default against itself, each of n_pad=8 / unroll=2 / col_max
#    alone, the pairs, LEAN, mxfp4 LEAN, group 16 col_max, the persistent kernel) in its OWN process with
#    CUDA_LAUNCH_BLOCKING=1, 8 at once: base launch, sync, variant launch, sync (so a fault names its launch), bit
#    identity (NaN scales too) and the float64 reference -> OUT/case_<id>.json / .log
# 2. compute-sanitizer --tool memcheck on the first faulting case, smallest first (where the runtime allows it)
#    -> OUT/memcheck.log: kernel, PC, address, the access size.
# 3. benchmarks/attention_sass.py timing ONLY the variants whose cases passed, in a fresh process (never in one that
#    saw a fault) -> OUT/attention_sass.json: us, fraction of the read ceiling, speedup vs the shipped config and
#    bit-identity, each measured in the same run as the shipped gluon baseline.
# 4. OUT/summary.json.
. "$(dirname "$0")/h200_check.sh"
CASES=$($PY benchmarks/attention_fault_case.py --list)
export CUDA_LAUNCH_BLOCKING=1 OMP_NUM_THREADS=2
running=0
for c in $CASES; do
    timeout 75 $PY benchmarks/attention_fault_case.py --case "$c" --out "$OUT/case_$c.json" > "$OUT/case_$c.log" 2>&1 &
    running=$((running + 1))
    if [ "$running" -ge 8 ]; then wait -n; running=$((running - 1)); fi
done
wait
unset CUDA_LAUNCH_BLOCKING
passed() { $PY -c "import json,sys; sys.exit(0 if json.load(open('$OUT/case_$1.json')).get('passed') else 1)" \
    2> /dev/null; }
first=""
for c in nvfp4-g4-self nvfp4-g4-colmax nvfp4-g4-n8 nvfp4-g4-unroll2 nvfp4-g4-n8-unroll2 nvfp4-g4-n8-colmax \
         nvfp4-g4-unroll2-colmax nvfp4-g4-lean; do
    if ! passed "$c"; then first=$c; break; fi
done
echo "first failing case: ${first:-none} after $(( $(date +%s) - start )) s"
if [ -n "$first" ] && command -v compute-sanitizer > /dev/null; then
    left=$(( 70 - ($(date +%s) - start) ))
    timeout $(( left > 20 ? left : 20 )) compute-sanitizer --tool memcheck --print-limit 6 --show-backtrace device \
        $PY benchmarks/attention_fault_case.py --case "$first" --out "$OUT/memcheck_case.json" \
        > "$OUT/memcheck.log" 2>&1
fi
# nvfp4 rows time the nvfp4 variants that passed; mxfp4 rows only when mxfp4 LEAN passed as well as every nvfp4
# variant timed (the bench runs both formats' variants by name: a failing one must not run in it)
variants="" formats=nvfp4
passed nvfp4-g4-lean && variants="$variants,lean,lean_s2"
passed nvfp4-g4-colmax && variants="$variants,colmax"
passed nvfp4-g4-persistent-colmax && variants="$variants,persistent_colmax"
if passed mxfp4-g4-lean && { passed nvfp4-g4-lean || [ -z "$variants" ]; }; then
    variants="$variants,lean,fold_lean"
    formats=$([ "$variants" = ",lean,fold_lean" ] && echo mxfp4 || echo nvfp4,mxfp4)
fi
bench_rc=skipped
if [ -n "$variants" ]; then
    left=$(( 114 - ($(date +%s) - start) ))
    if [ "$left" -gt 25 ]; then
        timeout "$left" $PY benchmarks/attention_sass.py --out "$OUT/attention_sass.json" --variants "${variants#,}" \
            --formats "$formats" \
            --budget-s $(( left - 18 )) > "$OUT/attention_sass.log" 2>&1
        bench_rc=$?
    fi
fi
$PY - "$OUT" "$first" "$bench_rc" "${variants#,}" $CASES <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, first, bench_rc, variants, cases = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
s = {"first_failing": first or None, "bench_rc": bench_rc, "timed_variants": variants, "cases": {}}
for c in cases:
    try:
        r = json.load(open(os.path.join(out, f"case_{c}.json")))
        s["cases"][c] = {k: r.get(k) for k in ("passed", "failed_at", "bit_identical", "bit_identical_nan",
                                               "rel_err_vs_reference")}
        if r.get("failed_at"):
            s["cases"][c]["error"] = r["steps"][r["failed_at"]]["error"][:300]
    except Exception as e:   # noqa: BLE001
        s["cases"][c] = {"passed": False, "no_json": repr(e)[:200], "log": tail(out, f"case_{c}.log", 6)}
mc = os.path.join(out, "memcheck.log")
if os.path.exists(mc):
    lines = open(mc).read().splitlines()
    s["memcheck"] = [l for l in lines if l.startswith("=========")][:40] or lines[-20:]
try:
    r = json.load(open(os.path.join(out, "attention_sass.json")))
    s["read_TBps"] = r["ceilings"]["read_TBps"]
    names = ("gluon", "lean", "colmax", "lean_s2", "persistent", "persistent_colmax", "fold", "fold_lean")
    s["rows"] = [{"format": row["format"], "batch": row["batch"], "context": row["context"], "error": row.get("error"),
                  **{n: {k: v for k, v in row[n].items() if k in ("us", "bw_frac", "speedup_vs_gluon", "vs_base",
                                                                  "error")} for n in names if n in row}}
                 for row in r["rows"]]
    s["skipped"] = r.get("skipped", [])
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)[:300]
    s["bench_log_tail"] = tail(out, "attention_sass.log", 12)
write(out, s, 9000)
PY
