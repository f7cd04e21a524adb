#!/usr/bin/env bash
# benchmarks/m64_h200.sh (issue 15, "W4A16 M = 64 >= 1.6x cuBLAS BF16" at 4096x12288 and 12288x4096; the opt-in wide
# 64-token tile reaches 1.29-1.33x): the M = 64 candidate configs of the Gluon GEMM (fp4_gemm_gluon_config.
# M64_CANDIDATES: split 2 / 4, the fin epilogue, overlap, 64-row tiles at 2 CTAs per SM, 2 x 32-token tiles)
# against the wide tile and cuBLAS BF16, same run. Usage (from the repo root; python3, torch, Triton 3.6, one H200,
# device wheels on PYTHONPATH; no torchrl), < 120 s:
#     benchmarks/m64_h200.sh OUT_DIR
# 0. the GPU tests tests/kernels/test_fp4_gemm_gluon_m64.py start in the background, 4 shards (each candidate against
#    the float64 reference at ragged shapes, deterministic, bit-equal to WIDE's tile at its own split) ->
#    OUT/pytest_<i>; meanwhile benchmarks/m64_sweep.py --precompile-only compiles every launch of the sweep in worker
#    processes -> OUT/precompile.log; the tests are waited for before any timing starts
# 1. benchmarks/m64_sweep.py -> OUT/m64.json (+ .log): K x N = 4096 x 12288 and 12288 x 4096, M = 64 (then 128 as
#    the budget allows), nvfp4 / mxfp4, W4A16: every variant (wide + candidates) checked against the reference, for
#    determinism and for bit identity with WIDE at its split, then CUDA-graph medians over weight copies beyond L2,
#    2 rounds (second in reverse order), cuBLAS BF16 in the same rounds
# 2. OUT/summary.json: rcs, test counts / failures, `rule_proposal` (per format and shape: the candidate to put in
#    fp4_gemm_gluon_config.M64_GRID or "keep", and the Python line `M64_GRID`; `M64_GRID_common`: one config for both
#    shapes), failed checks, per point us / best / ratios to cuBLAS and wide / won every round / grids.
. "$(dirname "$0")/h200_check.sh"
TESTS=tests/kernels/test_fp4_gemm_gluon_m64.py
: > "$OUT/test_ids.txt"
$PY -m pytest --collect-only -q -p no:cacheprovider $TESTS -m gpu 2>/dev/null | grep "::" > "$OUT/test_ids.txt"
start_pytest_shards 4 55
timeout 48 $PY benchmarks/m64_sweep.py --precompile-only --precompile-timeout-s 44 > "$OUT/precompile.log" 2>&1
pre_rc=$?
wait_pytest_shards
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/m64_sweep.py --out "$OUT/m64.json" \
    --budget-s $(( left > 30 ? left - 14 : 15 )) > "$OUT/m64.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import pytest_shards, tail, write
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"precompile_rc": pre_rc, "bench_rc": bench_rc, "pytest_rc": test_rc,
     "precompile_tail": [line[:600] for line in tail(out, "precompile.log", 3)]}
s.update(pytest_shards(out))
try:
    from m64_sweep import summarize
    s.update(summarize(json.load(open(os.path.join(out, "m64.json")))))
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "m64.log", 15)
write(out, s, 9000)
PY
