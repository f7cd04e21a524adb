#!/usr/bin/env bash
# benchmarks/attention_fix_h200.sh (check attnfix; issue 15: the Gluon attention's LEAN variants faulted with an illegal
# address on 2026-12-02, benchmarks/results/attention_sass_h200_1202d_pytest.log: only the FIRST test, nvfp4 LEAN,
# faulted; the 3 after it failed in PagedKV.allocate, the sticky error of the first). Usage:
# benchmarks/attention_fix_h200.sh OUT_DIR (repo root; python3, torch, Triton 3.6, one H200). < 120 s.
# 1. benchmarks/attention_fault_case.py: every case in its OWN process with CUDA_LAUNCH_BLOCKING=1, 10 at once: base
#    (the default config) launch, sync, variant launch, sync (so a fault names its launch), bit identity (NaN scales
#    too) and the float64 reference -> OUT/case_<id>.json / .log. Cases: the default against itself; n_pad=8 /
#    unroll=2 / col_max alone and in pairs; LEAN at groups 1 / 4 / 8, mxfp4 LEAN (n_pad=8 padded: the fix,
#    pad_smem=True, the default); n8-nopad / lean-nopad (pad_smem=False: 8-wide q^T / P^T, the build that faulted);
#    group 16 col_max; the persistent kernel with col_max / LEAN.
# 2. benchmarks/attention_sass.py, per format in a fresh process, timing ONLY the variants whose case passed (lean,
#    colmax, persistent_colmax; mxfp4 lean and fold_lean) against the shipped gluon
#    config measured in the same process -> OUT/attention_sass_<fmt>.json: us, fraction of the read ceiling,
#    speedup, bit-identity to the base.
# 3. compute-sanitizer --tool memcheck on the first failing case (the fixed ones first, then the -nopad ones that
#    are expected to fault) with the time left -> OUT/memcheck.log: kernel, PC, address.
# 4. OUT/summary.json. What to look for: every case passed except n8-nopad / lean-nopad (failed_at "variant": an
#    illegal address, the bug reproduced; memcheck: an HGMMA's shared read out of bounds); rows[].lean
#    bit_identical (vs_base) and speedup_vs_gluon > 1 at 8k / 32k; then LEAN_LOOP = True.
. "$(dirname "$0")/h200_check.sh"
CASES=$($PY benchmarks/attention_fault_case.py --list)
export CUDA_LAUNCH_BLOCKING=1 OMP_NUM_THREADS=2
running=0
for c in $CASES; do
    timeout 50 $PY benchmarks/attention_fault_case.py --case "$c" --out "$OUT/case_$c.json" > "$OUT/case_$c.log" 2>&1 &
    running=$((running + 1))
    if [ "$running" -ge 10 ]; then wait -n; running=$((running - 1)); fi
done
wait
unset CUDA_LAUNCH_BLOCKING
passed() { $PY -c "import json,sys; sys.exit(0 if json.load(open('$OUT/case_$1.json')).get('passed') else 1)" \
    2> /dev/null; }
first=""
for c in nvfp4-g4-self nvfp4-g4-colmax nvfp4-g4-n8 nvfp4-g4-unroll2 nvfp4-g4-n8-unroll2 nvfp4-g4-n8-colmax \
         nvfp4-g4-unroll2-colmax nvfp4-g4-lean nvfp4-g4-n8-nopad nvfp4-g4-lean-nopad; do
    if ! passed "$c"; then first=$c; break; fi
done
echo "first failing case: ${first:-none} after $(( $(date +%s) - start )) s"
# timing: per format in its own fresh process, only the variants whose GPU case passed (a faulting one never runs
# in a process whose numbers count), each row's shipped gluon baseline measured in the same process
nv="" mx=""
passed nvfp4-g4-lean && nv="$nv,lean"
passed nvfp4-g4-colmax && nv="$nv,colmax"
passed nvfp4-g4-persistent-colmax && nv="$nv,persistent_colmax"
passed mxfp4-g4-lean && mx="$mx,lean,fold_lean"
bench() {   # FORMAT VARIANTS SECONDS
    [ -z "$2" ] && return
    [ "$3" -lt 20 ] && { echo "bench $1 skipped: $3 s"; return; }
    timeout "$3" $PY benchmarks/attention_sass.py --out "$OUT/attention_sass_$1.json" --formats "$1" \
        --variants "${2#,}" --budget-s $(( $3 - 12 )) > "$OUT/attention_sass_$1.log" 2>&1
    echo "bench $1 rc $?"
}
left=$(( 112 - ($(date +%s) - start) ))
[ -n "$mx" ] && nv_s=$(( left * 3 / 5 )) || nv_s=$left
bench nvfp4 "$nv" "$nv_s"
bench mxfp4 "$mx" $(( 112 - ($(date +%s) - start) ))
# memcheck on the first failing case with what is left (a bonus: which kernel, PC, address)
left=$(( 116 - ($(date +%s) - start) ))
if [ -n "$first" ] && [ "$left" -ge 15 ] && command -v compute-sanitizer > /dev/null; then
    CUDA_LAUNCH_BLOCKING=1 timeout "$left" compute-sanitizer --tool memcheck --print-limit 6 \
        --show-backtrace device $PY benchmarks/attention_fault_case.py --case "$first" \
        --out "$OUT/memcheck_case.json" > "$OUT/memcheck.log" 2>&1
fi
$PY - "$OUT" "$first" "${nv#,}" "${mx#,}" $CASES <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, first, nv, mx, cases = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
s = {"first_failing": first or None, "timed": {"nvfp4": nv, "mxfp4": mx}, "cases": {}}
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
names = ("gluon", "lean", "colmax", "persistent", "persistent_colmax", "fold", "fold_lean")
s["rows"], s["skipped"] = [], []
for fmt in ("nvfp4", "mxfp4"):
    try:
        r = json.load(open(os.path.join(out, f"attention_sass_{fmt}.json")))
        s["read_TBps_" + fmt] = r["ceilings"]["read_TBps"]
        s["rows"] += [{"format": row["format"], "batch": row["batch"], "context": row["context"],
                       "error": row.get("error"),
                       **{n: {k: v for k, v in row[n].items() if k in ("us", "bw_frac", "speedup_vs_gluon", "vs_base",
                                                                       "error")} for n in names if n in row}}
                      for row in r["rows"]]
        s["skipped"] += r.get("skipped", [])
    except Exception as e:   # noqa: BLE001
        if (nv if fmt == "nvfp4" else mx):
            s["bench_error_" + fmt] = repr(e)[:200]
            s["bench_log_tail_" + fmt] = tail(out, f"attention_sass_{fmt}.log", 10)
write(out, s, 9000)
PY
