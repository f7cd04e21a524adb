#!/usr/bin/env bash
# benchmarks/smallm_h200.sh (issue 15, "ahead of gemlite at every M": the shipped small-M FP4 linear loses to gemlite
# only at 4096x1024, M = 1): the small-weight candidate configs of the Gluon GEMM (fp4_gemm_gluon_config.
# SMALL_GRID_CANDIDATES) against the shipped config, cuBLAS BF16 and gemlite, same run. Usage (from the repo root;
# python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH; gemlite's source at .gpu/gemlite_src, optional:
# without it the rows say why and the rest runs; torchrl is not needed), < 120 s:
#     benchmarks/smallm_h200.sh OUT_DIR
# 0. the GPU tests tests/kernels/test_fp4_gemm_gluon_small_grid.py start in the background, 4 shards (each candidate
#    against the float64 reference at 4096x1024 and a ragged shape, bit-equal to the fin=False launch at its split
#    and without PDL, W4A4 row scale + bias; candidates sharing a K partition give the same bits) -> OUT/pytest_<i>;
#    meanwhile benchmarks/smallm_sweep.py --precompile-only compiles every launch of the sweep in worker processes
#    -> OUT/precompile.log; the tests are waited for before any timing starts
# 1. benchmarks/smallm_sweep.py -> OUT/smallm.json (+ .log): K x N = 4096 x 1024, M = 1 / 4 / 16, nvfp4 / mxfp4, W4A16
#    and W4A4 prequantized: every variant (shipped + candidates, PDL as shipped) checked against the reference and
#    the shipped output (bit identity), then CUDA-graph medians, 2 rounds (second in reverse order), with cuBLAS BF16
#    and gemlite A16W4 in the same rounds
# 2. OUT/summary.json: rcs, test counts / failures, `rule_proposal` (per format and token tile: the candidate to put
#    in fp4_gemm_gluon_config.SMALL_GRID, or keep; its Python), `vs_gemlite` (W4A16, shipped and best), failed
#    checks, per point us / best / ratios / splits / bits vs shipped.
# Env (the `smallwide` check: SMALLM_SHAPES=4096x12288,12288x4096,4096x6144,4096x4096,4096x1024 with
# SMALLM_TESTS naming the larger-weight candidates; `m16` also SMALLM_MS / SMALLM_ROUNDS / SMALLM_VARIANTS /
# SMALLM_GEMLITE, read by smallm_sweep.py, and SMALLM_TEST_FILES): SMALLM_SHAPES, K x N shapes measured in that order
# (default 4096x1024; the precompile covers all of them, the sweep stops starting points at its budget: later shapes
# are "skipped"); SMALLM_TESTS, an extended regex the GPU test ids must match (default: every test);
# SMALLM_TEST_FILES, the GPU test files (default tests/kernels/test_fp4_gemm_gluon_small_grid.py);
# SMALLM_PRECOMPILE_S, the precompile's limit (default 44 s; its hung jobs compile in the sweep, before timing).
. "$(dirname "$0")/h200_check.sh"
export GEMLITE_SRC=${GEMLITE_SRC:-$PWD/.gpu/gemlite_src}
[ -d "$GEMLITE_SRC" ] || [ "${SMALLM_GEMLITE:-1}" = 0 ] || \
    echo "gemlite source not at $GEMLITE_SRC: its rows say why; the rest runs" > "$OUT/gemlite.txt"
TESTS=${SMALLM_TEST_FILES:-tests/kernels/test_fp4_gemm_gluon_small_grid.py}
SHAPES=${SMALLM_SHAPES:-4096x1024}
echo "shapes $SHAPES; Ms ${SMALLM_MS:-1,4,16}; rounds ${SMALLM_ROUNDS:-2}; variants ${SMALLM_VARIANTS:-all}; \
gemlite ${SMALLM_GEMLITE:-1}; tests $TESTS matching ${SMALLM_TESTS:-.}" > "$OUT/config.txt"
: > "$OUT/test_ids.txt"
$PY -m pytest --collect-only -q -p no:cacheprovider $TESTS -m gpu 2>/dev/null | grep "::" \
    | grep -E -- "${SMALLM_TESTS:-.}" > "$OUT/test_ids.txt"
start_pytest_shards 4 55
PRE_S=${SMALLM_PRECOMPILE_S:-44}
timeout $(( PRE_S + 4 )) $PY benchmarks/smallm_sweep.py --precompile-only --precompile-timeout-s $PRE_S --shapes "$SHAPES" \
    > "$OUT/precompile.log" 2>&1
pre_rc=$?
wait_pytest_shards
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/smallm_sweep.py --out "$OUT/smallm.json" --shapes "$SHAPES" \
    --budget-s $(( left > 30 ? left - 14 : 15 )) > "$OUT/smallm.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import pytest_shards, tail, write
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"config": tail(out, "config.txt", 1), "precompile_rc": pre_rc, "bench_rc": bench_rc, "pytest_rc": test_rc,
     "precompile_tail": [line[:600] for line in tail(out, "precompile.log", 3)]}
if os.path.exists(os.path.join(out, "gemlite.txt")):
    s["gemlite_note"] = tail(out, "gemlite.txt", 1)
s.update(pytest_shards(out))
try:
    from smallm_summary import summarize
    s.update(summarize(json.load(open(os.path.join(out, "smallm.json")))))
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "smallm.log", 15)
s["look_at"] = ("pass: pytest_rc 0, pytest.failures 0, checks_failed []; rule_proposal.SMALL_GRID: the Python to paste "
                "into fp4_gemm_gluon_config.SMALL_GRID (rule_proposal.changes: what it changes, each winner <= 0.98 of "
                "the shipped time in every round); issue_table: cuBLAS BF16 / FP4 per shape, M and act, shipped / best "
                "(target 2.2; shipped_below_target); bits_vs_shipped: same = the shipped K partition")
# what the session log's first 3000 chars show
first = ("config", "look_at", "precompile_rc", "bench_rc", "pytest_rc", "pytest", "pytest_failed", "bench_error",
         "rule_proposal", "issue_table", "bits_vs_shipped", "checks_failed", "errors", "skipped")
s = {**{k: s[k] for k in first if k in s}, **{k: v for k, v in s.items() if k not in first}}
write(out, s, 9000)
PY
