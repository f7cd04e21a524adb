#!/usr/bin/env bash
# benchmarks/oprojpf_h200.sh (check `oprojpf`; issue 15: "W4A4 within 15% of W4A16 at every M", whose last miss is
# o_proj 4096x4096 at M <= 16, its activation quantize a PDL launch of its own): the prefetch-all configs of the Gluon
# GEMM (trace_rl/kernels/fp4_gemm_gluon_prefetch.py: the ring holds all of a program's weight steps, so the weight
# streams under the quantize) vs the shipped config vs W4A16, and the attention's new launch_dependents signal.
# Usage (from the repo root; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH), < 120 s:
#     benchmarks/oprojpf_h200.sh OUT_DIR
# 0. the GPU tests tests/kernels/test_oproj_prefetch_gpu.py (35: each candidate vs the float64 reference and bit-equal
#    to the shipped config where the K partition is the same; fp4_linear's W4A4 PDL path with the table naming each
#    candidate captured in a CUDA graph = the same config eagerly; the Gluon / Triton attention with launch_dependents
#    on = off, and attention -> o_proj W4A4 in a graph = eager) in 4 background shards -> OUT/pytest_<i>.{log,xml};
#    meanwhile benchmarks/oproj_prefetch.py --precompile-only (every variant's PDL compile, the engine pair) ->
#    OUT/precompile.log; the tests are waited for before any timing starts
# 1. benchmarks/oproj_prefetch.py -> OUT/oprojpf.json (+ .log): nvfp4 / mxfp4, M = 1 / 4 / 8 / 16, W4A16, shipped
#    W4A4 and each candidate (3 rounds, CUDA-graph medians over weight copies beyond L2; the quantize after the previous
#    copy's GEMM, which signals launch_dependents), then the engine pair (Gluon attention B = 16 x L = 2048 -> o_proj
#    W4A4, one graph, the attention's launch_dependents on / off, shipped config and the M = 16 best)
# 2. OUT/summary.json. Look at: `pytest.failures` == 0 and `bits_ok`; `points[]` (shipped_over_w4a16 and
#    best.ratio_w4a16 per format / M: target <= 1.15; best.over_shipped, best.wins); `over_target_shipped` /
#    `over_target_with_rule` (points still > 1.15); `rule_proposal.W4A4_PDL_GRID` (the line to paste into
#    trace_rl/kernels/fp4_gemm_gluon_prefetch.py; W4A16 never reads the table); `engine[]` (*_on_over_off < 1: the
#    attention's signal helps; *_over_w4a16: attention + o_proj W4A4 over attention + W4A16, shipped / candidate).
#    Follow-up: paste the rule; if engine on_over_off > 1.02, set GluonAttentionConfig.launch_dependents /
#    paged_attention.LAUNCH_DEPENDENTS False.
# Env: OPROJPF_MS="1,16" / OPROJPF_FMTS=nvfp4 restrict the rows.
. "$(dirname "$0")/h200_check.sh"
SEL=(${OPROJPF_MS:+--ms $OPROJPF_MS} ${OPROJPF_FMTS:+--fmts $OPROJPF_FMTS})
TESTS=tests/kernels/test_oproj_prefetch_gpu.py
: > "$OUT/test_ids.txt"
$PY -m pytest --collect-only -q -p no:cacheprovider $TESTS -m gpu 2>/dev/null | grep "::" > "$OUT/test_ids.txt"
start_pytest_shards 4 58
timeout 48 $PY benchmarks/oproj_prefetch.py --precompile-only --precompile-timeout-s 44 --workers 10 \
    ${SEL[@]+"${SEL[@]}"} > "$OUT/precompile.log" 2>&1
pre_rc=$?
wait_pytest_shards
left=$(( 114 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/oproj_prefetch.py --out "$OUT/oprojpf.json" ${SEL[@]+"${SEL[@]}"} \
    --budget-s $(( left > 30 ? left - 14 : 15 )) > "$OUT/oprojpf.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import pytest_shards, tail, write
from oproj_prefetch import TARGET, summarize
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"look_at": "pytest failures == 0 and bits_ok; points[].shipped_over_w4a16 / best.ratio_w4a16 (target <= 1.15), "
                "best.wins (beat shipped by >= 2% every round); rule_proposal.W4A4_PDL_GRID: paste into "
                "trace_rl/kernels/fp4_gemm_gluon_prefetch.py; engine[].*_on_over_off (< 1: the attention's "
                "launch_dependents helps; > 1.02: turn it off), engine[].*_over_w4a16 (attention + o_proj W4A4 over "
                "attention + o_proj W4A16)",
     "target_w4a4_over_w4a16": TARGET, "precompile_rc": pre_rc, "bench_rc": bench_rc, "pytest_rc": test_rc,
     "precompile_tail": [line[:600] for line in tail(out, "precompile.log", 3)]}
s.update(pytest_shards(out))
try:
    s.update(summarize(json.load(open(os.path.join(out, "oprojpf.json")))))
except Exception as e:   # noqa: BLE001 -- the bench cut before its first row
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "oprojpf.log", 20)
write(out, s, 12000)
PY
