#!/usr/bin/env bash
# benchmarks/gemm_gluon_h200.sh (issue 15 FP4 W4A16: M <= 16 at >= 1.8x cuBLAS, M = 64 >= 1.6x, M = 256 / 512 >= 0.8x):
# the opt-in Gluon warp-specialised GEMM (trace_rl/kernels/fp4_gemm_gluon.py). Usage (from the repo root of a checkout;
# python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH), each call < 120 s:
#     benchmarks/gemm_gluon_h200.sh OUT_DIR                          # decode: M = 1, 16; the M <= 16 GPU tests
#     GLUON_M=64,256,512 benchmarks/gemm_gluon_h200.sh OUT_DIR2      # wide token tiles: its own call, own OUT_DIR
# GLUON_M (default 1,16) is the benchmark's M set; any M > 16 in it selects the wide GPU tests (pytest -k wide:
# M 17..256 vs the reference and the shipped kernel), else the others (-k "not wide").
# 0. benchmarks/gemm_gluon.py --precompile-only --M GLUON_M: the Gluon binaries of steps 1-2 and the shipped kernel's,
#    in 16 processes into Triton's cache -> OUT/precompile.log
# 1. benchmarks/gemm_gluon.py -> OUT/gemm_gluon.json (+ .log): at M = GLUON_M on K x N = 4096x12288 and 12288x4096,
#    cuBLAS BF16 vs the shipped kernel (nvfp4, mxfp4) vs Gluon variants x splits (auto, x2, /2), each variant's
#    output compared with the shipped kernel's first (rel_diff_vs_shipped); CUDA graphs over weight copies > L2,
#    median us. Variants in order of interest; a time budget skips the tail ("skipped").
# 2. pytest tests/kernels/test_fp4_gemm_gluon.py, the -k set above (not wide: vs the float64 reference at M 1/5/16,
#    ragged N/K, nvfp4 x 4 configs, mxfp4 x 2, determinism; the issue's shapes at M = 16, bit-equality with the
#    shipped kernel at split 1. wide: M 17..256, odd N, both formats, forced splits) with what is left
#    -> OUT/pytest.{log,xml} (-v: a timeout still shows the tests that ran)
# 3. OUT/summary.json: rcs, pytest tail, per row cuBLAS / shipped / best Gluon us and speedups, errors.
. "$(dirname "$0")/h200_check.sh"
GLUON_M=${GLUON_M:-1,16}
if echo "$GLUON_M" | tr ',' '\n' | awk '$1 > 16 {f = 1} END {exit !f}'; then TESTS="wide"; else TESTS="not wide"; fi
timeout 42 $PY benchmarks/gemm_gluon.py --precompile-only --M "$GLUON_M" --out /dev/null > "$OUT/precompile.log" 2>&1
pre_rc=$?
left=$(( 86 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/gemm_gluon.py --out "$OUT/gemm_gluon.json" --M "$GLUON_M" \
    --budget-s $(( left > 30 ? left - 12 : 15 )) > "$OUT/gemm_gluon.log" 2>&1
bench_rc=$?
run_pytest 114 -k "$TESTS" tests/kernels/test_fp4_gemm_gluon.py
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"precompile_rc": pre_rc, "bench_rc": bench_rc, "pytest_rc": test_rc,
     "precompile_tail": tail(out, "precompile.log", 3), "pytest_tail": tail(out, "pytest.log", 14)}
try:
    r = json.load(open(os.path.join(out, "gemm_gluon.json")))
    s["rows"] = [{k: (v if not isinstance(v, dict) else {kk: vv for kk, vv in v.items() if kk != "config"})
                  for k, v in row.items() if k not in ("shipped_config", "copies")} for row in r["rows"]]
    s["errors"] = r.get("errors", [])[:6]
    s["skipped"] = len(r.get("skipped", []))
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "gemm_gluon.log", 15)
write(out, s, 6000)
PY
