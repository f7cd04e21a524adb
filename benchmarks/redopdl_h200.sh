#!/usr/bin/env bash
# benchmarks/redopdl_h200.sh (issue 15: mxfp4-KV decode attention at >= 0.75 of the read ceiling; 32 x 8k was 0.70):
# LEAN_CHECKED's REDO launched as a programmatic dependent of the checked launch (GluonAttentionConfig.redo_pdl,
# preset LEAN_CHECKED_PDL, switch LEAN_REDO_PDL) must be bit-identical to the exact kernel and never slower than the
# plain REDO launch. Usage: benchmarks/redopdl_h200.sh OUT_DIR (repo root; python3, torch, Triton 3.6, one H200,
# device wheels on PYTHONPATH). < 120 s.
# 1. GPU tests, one process per case, 5 at once (the compiles are the time) -> OUT/case_<id>.{log,xml,rc}:
#    tests/kernels/test_redo_pdl.py::test_pdl_redo_is_bit_identical_gpu (checked + PDL REDO == exact == checked +
#    plain REDO, 'window' and 'loud' corruption: 'loud' makes the REDO recompute items; 3 calls each from a zeroed
#    output block, a CUDA graph; g4-lean-waves: 2400 programs, ~9 waves) and, for the cases it shares, the checked
#    fold's own test_checked_is_bit_identical_to_exact_gpu (the plain REDO); a case passed: pytest rc 0 and its junit
#    counts every test, none failed, erroring or skipped. The CPU tests of test_redo_pdl.py -> OUT/cpu_tests.log.
# 2. timing (benchmarks/attention_sass.py, CUDA-graph medians, the read ceiling measured in the same run) of exact
#    DEFAULT (gluon), exact LEAN (lean), LEAN_CHECKED with the plain REDO (checked_lean) and with the PDL REDO
#    (checked_lean_pdl) in one process, then 5 more alternate rounds of the two checked ones (--pair-rounds), and the
#    best SDPA over a bf16 cache; mxfp4, Qwen3-8B heads, B x L = 32 x 8k (first: the row under 0.75), 256 x 8k,
#    32 x 32k, 313 x 8447 -> OUT/attention_sass.json;
# 3. OUT/summary.json: tests per case, per row checked_us / checked_pdl_us (best of the 6 timings each),
#    pdl_speedup, bw_frac (the PDL one's; target 0.75), bit identity to lean; green (every test passed, every row
#    bit-identical, PDL not slower anywhere beyond a 0.5% noise band) and the line to paste.
. "$(dirname "$0")/h200_check.sh"
P=tests/kernels/test_redo_pdl.py::test_pdl_redo_is_bit_identical_gpu
C=tests/kernels/test_paged_attention_gluon_checked.py::test_checked_is_bit_identical_to_exact_gpu
CASES="g4-lean g8-lean g1-lean g4-persistent-lean g4-lean-waves"
SHARED=" g4-lean g8-lean g1-lean g4-persistent-lean "      # ids test_paged_attention_gluon_checked.CASES has too
pids=()
for c in $CASES; do
    ids=("$P[$c-window]" "$P[$c-loud]")
    [[ "$SHARED" == *" $c "* ]] && ids+=("$C[$c-window]" "$C[$c-loud]")
    echo "${#ids[@]}" > "$OUT/case_$c.expected"
    ( timeout 75 $PY -m pytest -q -p no:cacheprovider -m gpu --junitxml="$OUT/case_$c.xml" "${ids[@]}" \
        > "$OUT/case_$c.log" 2>&1; echo $? > "$OUT/case_$c.rc" ) &
    pids+=($!)
done
timeout 75 $PY -m pytest -q -p no:cacheprovider tests/kernels/test_redo_pdl.py -m "not gpu" \
    > "$OUT/cpu_tests.log" 2>&1 &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
left=$(( 115 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/attention_sass.py --out "$OUT/attention_sass.json" --formats mxfp4 \
    --variants lean,checked_lean,checked_lean_pdl --pair-rounds 5 --shapes 32x8192,256x8192,32x32768,313x8447 \
    --budget-s $(( left > 30 ? left - 15 : 10 )) > "$OUT/attention_sass.log" 2>&1
bench_rc=$?
$PY benchmarks/redopdl_summary.py "$OUT" "$bench_rc" $CASES
