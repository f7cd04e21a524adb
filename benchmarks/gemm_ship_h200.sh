#!/usr/bin/env bash
# benchmarks/gemm_ship_h200.sh (issue 15: W4A16 / W4A4 FP4 at M <= 16 must reach >= 2.2x cuBLAS BF16, W4A4 within 15%
# of W4A16): the SHIPPED small-M path, `fp4_linear` -> the Gluon GEMM (fp4_gemm_gluon.SMALL_M, programmatic dependent
# launch; dispatch rule in trace_rl/kernels/gemm_dispatch.py). Usage (from the repo root; python3, torch, Triton 3.6,
# one H200, device wheels on PYTHONPATH; gemlite's source at .gpu/gemlite_src), < 120 s:
#     benchmarks/gemm_ship_h200.sh OUT_DIR
# 0. the GPU tests (step 2) start in the background; meanwhile benchmarks/gemm_ship.py --precompile-only: every
#    launch of the benchmark (shipped and Triton, W4A16 / W4A4 / prequantized, the RMSNorm, gemlite) in 8 worker
#    processes into Triton's cache -> OUT/precompile.log; the tests are waited for before any timing starts
# 1. benchmarks/gemm_ship.py -> OUT/gemm_ship.json (+ .log): per K x N (4096x12288, 12288x4096, 4096x1024), M (1, 4,
#    16), nvfp4 / mxfp4: cuBLAS BF16, fp4_linear shipped vs the Triton path (GLUON_SMALL_M off) for W4A16, W4A4 (with
#    its quantize launch) and fp4_linear_prequantized, gemlite A16W4, each GEMM after an RMSNorm (a non-PDL kernel),
#    bytes / time against the measured read ceiling; CUDA graphs over weight copies > L2, median us; speedups.
# 2. the GPU tests tests/kernels/test_fp4_gemm_gluon_small.py (the shipped config vs the reference, bit-equal to the
#    previous launch at the same split, fp4_linear W4A16 / W4A4 / prequantized with bias, the dispatch taking the
#    Gluon path, NaN rows, a PDL chain replayed in a CUDA graph), tests/kernels/test_gemm_dispatch.py and
#    test_quantize.py -k launch_dependents (the quantize kernel's launch_dependents changes no bit), in 8
#    parallel pytest shards (their kernels compile in parallel), <= 58 s -> OUT/pytest_<i>.{log,xml}
# 3. OUT/summary.json: rcs, test counts and failures, per row us and speedups (shipped vs cuBLAS, vs Triton, vs gemlite,
#    W4A4 / W4A16), errors.
# Env: SHIP_SHAPES="12288x4096,4096x1024" runs only those K x N (default all three); SHIP_TESTS=0 skips step 2 (the
# `gemmship2` check: the rows a budget-cut first run did not reach, with the whole budget for the bench).
. "$(dirname "$0")/h200_check.sh"
export GEMLITE_SRC=${GEMLITE_SRC:-$PWD/.gpu/gemlite_src}
TESTS="tests/kernels/test_fp4_gemm_gluon_small.py tests/kernels/test_gemm_dispatch.py"
SHAPE_ARGS=${SHIP_SHAPES:+--shapes $SHIP_SHAPES}
# the GPU tests first, in the background (not timed: they may share the GPU with the precompile), 8 shards
: > "$OUT/test_ids.txt"
if [ "${SHIP_TESTS:-1}" != 0 ]; then
    $PY -m pytest --collect-only -q -p no:cacheprovider $TESTS 2>/dev/null | grep "::" > "$OUT/test_ids.txt"
    $PY -m pytest --collect-only -q -p no:cacheprovider tests/kernels/test_quantize.py -k launch_dependents 2>/dev/null \
        | grep "::" >> "$OUT/test_ids.txt"      # the quantize kernel with launch_dependents: the same bits
fi
start_pytest_shards 8 58
timeout 34 $PY benchmarks/gemm_ship.py --precompile-only --precompile-timeout-s 30 $SHAPE_ARGS > "$OUT/precompile.log" 2>&1
pre_rc=$?
wait_pytest_shards
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/gemm_ship.py --out "$OUT/gemm_ship.json" $SHAPE_ARGS \
    --budget-s $(( left > 30 ? left - 14 : 15 )) > "$OUT/gemm_ship.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import pytest_shards, tail, write
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"precompile_rc": pre_rc, "bench_rc": bench_rc, "pytest_rc": test_rc, "precompile_tail": tail(out, "precompile.log", 3)}
s.update(pytest_shards(out))
try:
    r = json.load(open(os.path.join(out, "gemm_ship.json")))
    s["ceilings"], s["gemlite"] = r.get("ceilings"), r.get("gemlite")
    s["rows"] = []
    for row in r["rows"]:
        o = {k: row[k] for k in ("fmt", "K", "N", "M")}
        o["us"] = {k[:-3]: round(v, 2) for k, v in row.items() if k.endswith("_us")}
        o["speedup"] = row.get("speedup", {})
        o.update({k: row[k] for k in ("w4a4_over_w4a16", "prequant_over_w4a16", "w4a16_rel_vs_triton",
                                      "w4a4_rel_vs_triton", "w4a16_bw_fraction", "w4a4_bw_fraction") if k in row})
        s["rows"].append(o)
    sp = [row["speedup"].get("w4a16") for row in r["rows"] if row["M"] <= 16]
    s["min_w4a16_speedup"] = min((x for x in sp if x), default=None)
    sp4 = [row["speedup"].get("w4a4") for row in r["rows"]]
    s["min_w4a4_speedup"] = min((x for x in sp4 if x), default=None)
    s["max_w4a4_over_w4a16"] = max((row.get("w4a4_over_w4a16", 0) for row in r["rows"]), default=None)
    s["errors"], s["skipped"], s["total_s"] = r.get("errors", [])[:8], len(r.get("skipped", [])), r.get("total_s")
    rows = s.pop("rows")              # the headline numbers first (the session prints the summary's head)
    s["rows"] = rows
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "gemm_ship.log", 15)
write(out, s, 9000)
PY
