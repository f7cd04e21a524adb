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
CASES="nvfp4-g4-colmax nvfp4-g4-n8 nvfp4-g4-unroll2 nvfp4-g4-lean mxfp4-g4-lean nvfp4-g1-lean"
T=tests/kernels/test_paged_attention_gluon.py::test_sass_variants_bit_identical_to_shipped_gpu
pids=()
for c in $CASES; do
    timeout 60 $PY -m pytest -x -q -p no:cacheprovider -m gpu "$T[$c]" > "$OUT/case_$c.log" 2>&1 &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
first=""
for c in nvfp4-g4-colmax nvfp4-g4-n8 nvfp4-g4-unroll2 nvfp4-g4-lean; do
    if ! grep -q "1 passed" "$OUT/case_$c.log"; then first=$c; break; fi
done
if [ -n "$first" ] && command -v compute-sanitizer > /dev/null; then
    left=$(( 112 - ($(date +%s) - start) ))
    timeout $(( left > 15 ? left : 15 )) compute-sanitizer --tool memcheck --print-limit 8 --show-backtrace no \
        $PY -m pytest -x -q -p no:cacheprovider -m gpu "$T[$first]" > "$OUT/memcheck.log" 2>&1
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
write(out, s, 8000)
PY
