#!/usr/bin/env bash
# benchmarks/skfix_h200.sh OUT_DIR (check `skfix`; issue 15, W4A16 at M = 256 / 512 >= 0.8x cuBLAS BF16): the stream-K
# 256-token GEMM with the register-side two-segment fix-up (trace_rl/kernels/fp4_gemm_wide256_sk2.py) against the
# current best and the old stream-K, and two probes of why the old stream-K was slow. One H200, python3, torch,
# Triton 3.6 (device wheels on PYTHONPATH), < 120 s:
# 0. its GPU tests (tests/kernels/test_fp4_gemm_wide256_sk2.py -m gpu: float64 reference at odd shapes, equal to
#    the old stream-K at the same grid, the race path, deterministic) in 6 background shards -> OUT/pytest_<i>;
#    meanwhile benchmarks/skfix.py --precompile-only -> OUT/precompile.log; the tests are waited for before timing
# 1. benchmarks/skfix.py -> OUT/skfix.json (+ .log): the `rate` probe (the 256-token grid at split 1 over 66 / 96 /
#    132 tiles of 4096 x 128, nvidia-smi clock / power under each), then 4096x12288 and 12288x4096 (K x N), M = 256,
#    512, nvfp4 / mxfp4: cuBLAS BF16, OLD = wide / w256 / sk_bm128 / sk (nvfp4), NEW = sk2 / sk2_bm128 /
#    sk2_nooverlap (+ sk2_allsm, nvfp4), the probe sk2_nofixup (wrong split tiles: timing only); CUDA-graph
#    medians over weight copies beyond L2, 3 rounds
# 2. OUT/summary.json: pytest counts / failures; per point x_cublas of each variant (target 0.8: `meets_0.8`),
#    best_old / best_new, new_beats_old_every_round, fixup_cost_us (sk2 - sk2_nofixup); rate.n132_over_n96 (~1.0:
#    the old sk's loss was its own; ~1.375: the machine bounds the 256-token tile with every SM busy).
. "$(dirname "$0")/h200_check.sh"
TESTS=tests/kernels/test_fp4_gemm_wide256_sk2.py
: > "$OUT/test_ids.txt"
$PY -m pytest --collect-only -q -p no:cacheprovider $TESTS -m gpu 2>/dev/null | grep "::" > "$OUT/test_ids.txt"
start_pytest_shards 6 66
timeout 55 $PY benchmarks/skfix.py --precompile-only --out /dev/null > "$OUT/precompile.log" 2>&1
pre_rc=$?
wait_pytest_shards
# a CUDA error in the new kernel's tests (sticky: it would poison every later launch of the timing process): time
# only cuBLAS and the old variants
no_new=""
grep -qE "CUDA error|illegal (instruction|memory)|misaligned address" "$OUT"/pytest_*.log 2>/dev/null && no_new=--no-new
left=$(( 114 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/skfix.py --out "$OUT/skfix.json" $no_new \
    --budget-s $(( left > 30 ? left - 14 : 15 )) > "$OUT/skfix.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import pytest_shards, tail, write
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"verdict_keys": "points[].meets_0.8 / new_beats_old_every_round / x_cublas; rate.n132_over_n96; wiring",
     "precompile_rc": pre_rc, "bench_rc": bench_rc, "pytest_rc": test_rc,
     "precompile_tail": [line[:600] for line in tail(out, "precompile.log", 3)]}
s.update(pytest_shards(out))
try:
    from skfix import summarize
    s.update(summarize(json.load(open(os.path.join(out, "skfix.json")))))
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "skfix.log", 15)
write(out, s, 9000)
PY
