#!/usr/bin/env bash
# benchmarks/attention_fault_h200.sh (issue 15: the Gluon attention's LEAN / col_max variants faulted with an illegal
# address on 2026-12-02, all 4 variant tests in ONE pytest process, so every test after the first may only have
# inherited the sticky CUDA error). Usage: benchmarks/attention_fault_h200.sh OUT_DIR (repo root; python3, torch,
# Triton 3.6, one H200, device wheels on PYTHONPATH). < 120 s.
# 1. each SASS variant's GPU test (test_sass_variants_bit_identical_to_shipped_gpu[<case>]) in its OWN process, 6
#    at once -> OUT/case_<case>.log: which part faults (n_pad=8 alone, unroll=2 alone, col_max alone, LEAN).
# 2. compute-sanitizer --tool memcheck on the first faulting case among col_max / n8 / unroll2 / lean (where the
#    runtime allows it: gVisor refuses the device) -> OUT/memcheck.log: the faulting kernel, PC and address.
# 3. OUT/summary.json: per case pass / fail / the error line; memcheck's first errors.
. "$(dirname "$0")/h200_check.sh"
CASES=${FAULT_CASES:-"nvfp4-g4-n8 mxfp4-g4-n8 nvfp4-g4-lean mxfp4-g4-lean nvfp4-g1-lean nvfp4-g8-lean \
nvfp4-g4-colmax-unroll2 mxfp4-g4-colmax mxfp4-g4-colmax-unroll2 nvfp4-g4-persistent-lean"}
T=tests/kernels/test_paged_attention_gluon.py::test_sass_variants_bit_identical_to_shipped_gpu
pids=()
for c in $CASES; do
    timeout 60 $PY -m pytest -x -q -p no:cacheprovider -m gpu "$T[$c]" > "$OUT/case_$c.log" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
first=""
for c in $CASES; do
    if ! grep -q "1 passed" "$OUT/case_$c.log"; then first=$c; break; fi
done
if [ -n "$first" ] && command -v compute-sanitizer > /dev/null; then
    timeout 30 compute-sanitizer --tool memcheck --print-limit 8 --show-backtrace no \
        $PY -m pytest -x -q -p no:cacheprovider -m gpu "$T[$first]" > "$OUT/memcheck.log" 2>&1
fi
# 3. the variants whose GPU tests passed (both formats' cases), timed against the shipped config (attention_sass.py)
ok_variants=""
passed() { grep -q "1 passed" "$OUT/case_$1.log" 2>/dev/null; }
passed nvfp4-g4-lean && passed mxfp4-g4-lean && ok_variants="$ok_variants,lean"
passed nvfp4-g4-colmax-unroll2 && passed mxfp4-g4-colmax-unroll2 && ok_variants="$ok_variants,colmax_u2"
passed mxfp4-g4-colmax && ok_variants="$ok_variants,colmax"
bench_rc=-1
if [ -n "$ok_variants" ]; then
    left=$(( 115 - ($(date +%s) - start) ))
    timeout $(( left > 20 ? left : 20 )) $PY benchmarks/attention_sass.py --out "$OUT/attention_sass.json" \
        --variants "${ok_variants#,}" --budget-s $(( left > 30 ? left - 12 : 10 )) > "$OUT/attention_sass.log" 2>&1
    bench_rc=$?
fi
$PY - "$OUT" "$first" $CASES <<'PY'
import os, re, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, first, cases = sys.argv[1], sys.argv[2], sys.argv[3:]
s = {"first_faulting": first or None, "cases": {}}
for c in cases:
    text = open(os.path.join(out, f"case_{c}.log")).read() if os.path.exists(os.path.join(out, f"case_{c}.log")) else ""
    errs = [l for l in text.splitlines() if re.search(r"Error|error:|illegal|assert", l)][:4]
    s["cases"][c] = {"passed": "1 passed" in text, "errors": errs, "tail": text.strip().splitlines()[-2:]}
mc = os.path.join(out, "memcheck.log")
if os.path.exists(mc):
    lines = open(mc).read().splitlines()
    s["memcheck"] = [l for l in lines if l.startswith("=========")][:40] or lines[-20:]
bench = os.path.join(out, "attention_sass.json")
if os.path.exists(bench):
    import json
    r = json.load(open(bench))
    s["read_TBps"] = r.get("ceilings", {}).get("read_TBps")
    s["rows"] = [{**{k: row[k] for k in ("format", "batch", "context", "roofline_us", "sdpa_best_us", "error")
                     if k in row},
                  **{n: {k: v for k, v in val.items() if k in ("us", "bw_frac", "speedup_vs_gluon", "speedup_vs_sdpa",
                                                               "vs_base", "error")}
                     for n, val in row.items() if isinstance(val, dict) and n not in ("sdpa", )}}
                 for row in r.get("rows", [])]
    s["skipped"] = r.get("skipped", [])
else:
    s["bench_log_tail"] = tail(out, "attention_sass.log", 10)
write(out, s, 8000)
PY
