#!/usr/bin/env bash
# benchmarks/midm_h200.sh (issue 15, "W4A16 M = 64 >= 1.6x cuBLAS BF16"; the Gluon wide tile reaches 1.33-1.46x but the
# shipped fp4_linear took the Triton path at 16 < M < 128): the mid-M Gluon path (gemm_dispatch.GLUON_MID_M ->
# fp4_gemm_gluon_config.mid_m_config on the fin kernel, PDL in graphs) against the Triton path and cuBLAS BF16 on
# Qwen3-8B's six dense shapes, and the table to ship. Usage (from the repo root; python3, torch, Triton 3.6, one H200,
# device wheels on PYTHONPATH; no torchrl), < 120 s:
#     benchmarks/midm_h200.sh OUT_DIR
# 0. the GPU tests tests/kernels/test_fp4_gemm_gluon_mid_m.py (28: mid_m_config vs the float64 reference at M = 17..64
#    ragged, bit-equal to the fin=False launch per split with / without PDL, W4A4 row scale + bias, fp4_linear W4A16 /
#    W4A4 recorded fp4.gluon, a PDL chain in a CUDA graph, an engine decode at B = 33) start in the background, 4
#    shards -> OUT/pytest_<i>; meanwhile benchmarks/midm_sweep.py --precompile-only compiles every launch of the
#    sweep in worker processes -> OUT/precompile.log; the tests are waited for before any timing starts
# 1. benchmarks/midm_sweep.py -> OUT/midm.json (+ .log): K x N = 4096x12288, 12288x4096, 4096x6144, 4096x4096,
#    4096x24576, 4096x1024; nvfp4 / mxfp4; M = 17 / 24 / 32 / 48 / 64 everywhere, then 96 / 128 as the budget allows;
#    fp4_linear W4A16 and W4A4 with the weight listed (Gluon) and the table empty (Triton), cuBLAS BF16; CUDA-graph
#    medians, 2 rounds (second in reverse order)
# 2. OUT/summary.json: rcs, test counts / failures, `rule_proposal.GLUON_MID_M` (the line to paste into
#    trace_rl/kernels/gemm_dispatch.py: per padded (N, K) the largest M up to which Gluon won every round at W4A16 and
#    W4A4), `issue15_m64` (x cuBLAS at M = 64 per shape / format, target 1.6), one `table` line per point.
. "$(dirname "$0")/h200_check.sh"
TESTS=tests/kernels/test_fp4_gemm_gluon_mid_m.py
: > "$OUT/test_ids.txt"
$PY -m pytest --collect-only -q -p no:cacheprovider $TESTS -m gpu 2>/dev/null | grep "::" > "$OUT/test_ids.txt"
start_pytest_shards 4 55
timeout 48 $PY benchmarks/midm_sweep.py --precompile-only --precompile-timeout-s 44 > "$OUT/precompile.log" 2>&1
pre_rc=$?
wait_pytest_shards
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/midm_sweep.py --out "$OUT/midm.json" \
    --budget-s $(( left > 30 ? left - 12 : 15 )) > "$OUT/midm.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import pytest_shards, tail, write
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"look_at": "rule_proposal.GLUON_MID_M (paste into trace_rl/kernels/gemm_dispatch.py), issue15_m64 (target 1.6x "
                "cuBLAS at M = 64), pytest (28 GPU tests, failures listed)",
     "precompile_rc": pre_rc, "bench_rc": bench_rc, "pytest_rc": test_rc,
     "precompile_tail": [line[:600] for line in tail(out, "precompile.log", 3)]}
shards = pytest_shards(out)
tails = shards.pop("pytest_tails")
s.update(shards)
counts, failed = s["pytest"], s["pytest_failed"]
s["pytest_pass"] = counts["collected"] > 0 and counts["tests"] == counts["collected"] and not failed \
    and counts["skipped"] == 0
s["pytest_tails"] = tails
try:
    from midm_sweep import summarize
    s.update(summarize(json.load(open(os.path.join(out, "midm.json")))))
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "midm.log", 15)
write(out, s, 9000)
PY
