#!/usr/bin/env bash
# The FP4 engine end to end with the Gluon nvfp4-KV decode attention (trace_rl/kernels/paged_attention_gluon.py,
# wired in as attention="gluon": trace_rl/kv/gluon.py). Usage: benchmarks/engine_fp4_gluon_h200.sh OUT_DIR [CELLS]
# (from the repo root; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH). < 120 s.
# 1. pytest -m gpu: tests/engine/test_native_gpu.py -k gluon (a forced-Gluon engine against a forced-kernels engine:
#    decode logits within 2e-2 at ragged lengths over scattered pages inside CUDA graphs, and again after the pages,
#    lengths and block tables change under the captured graphs; per layer against the reference; sampled log-probs
#    within the bf16 tolerance of the trainer's recomputation with nvfp4 K/V) and
#    tests/kernels/test_paged_attention_gluon.py (the kernel alone) -> OUT/pytest.*.
#    Both passed (2026-12-02), so GLUON_IN_AUTO (trace_rl/kv/gluon.py) is set; they also run an "auto" engine that
#    times the Gluon path beside the kernel. It also compiles the kernel (Triton cache).
# 2. `trace-rl bench rollout --parts steps` (trace_rl/bench/steps.py), Qwen3-8B shape (36 layers, random weights),
#    cells B = 100 and 256 at context 8447 (CELLS overrides, 'B:L;B2:L'): the w4a4-kv4 engine (page pool, 64-token
#    pages) with attention forced to "kernels" (the shipped Triton kernel) and to "gluon" -> OUT/steps_fp4/; then, in
#    what is left of the 116 s, the bf16 engine (contiguous, its own timed attention choice, "auto"; B = 256 does not
#    fit beside the weights: a skipped row) -> OUT/steps_bf16/. Per row: forward_ms (captured decode forward),
#    step_ms (whole captured step), floor_ms and roofline_frac, attention_times (ms per layer call, graph-timed over
#    8 layers, of the path run and of the Gluon path beside it). Rows are written as they finish (rollout.json): a
#    run cut short keeps what it measured. Both logs -> OUT/steps.log.
# 3. OUT/summary.json: rcs, pytest tail, every row, and per cell each plan/attention's step and forward ms with the
#    step speedups gluon vs kernels and gluon vs bf16.
. "$(dirname "$0")/h200_check.sh"
CELLS=${2:-"100:8447;256:8447"}
run_pytest 50 -m gpu tests/engine/test_native_gpu.py -k gluon tests/kernels/test_paged_attention_gluon.py
steps() {   # SECONDS_LEFT_AT_END NAME PLANS ATTENTION: one bench invocation, its log appended to OUT/steps.log
    local left=$(( $1 - ($(date +%s) - start) ))
    echo "== $2 ($3: $4), ${left} s" >> "$OUT/steps.log"
    timeout $(( left > 15 ? left : 15 )) $PY -m trace_rl bench rollout --parts steps --models "${MODEL:-qwen3-8b}" \
        --step-plans "$3" --step-attention "$4" --step-grid "$CELLS" --iters 5 --out "$OUT/$2" >> "$OUT/steps.log" 2>&1
}
steps 92 steps_fp4 w4a4-kv4 kernels,gluon
fp4_rc=$?
steps 116 steps_bf16 bf16 auto
bf16_rc=$?
$PY - "$OUT" "$test_rc" "$fp4_rc" "$bf16_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, test_rc, fp4_rc, bf16_rc = sys.argv[1], *map(int, sys.argv[2:5])
s = {"pytest_rc": test_rc, "fp4_bench_rc": fp4_rc, "bf16_bench_rc": bf16_rc, "pytest_tail": tail(out, "pytest.log", 12)}
try:
    rows = []
    for d in ("steps_fp4", "steps_bf16"):
        f = os.path.join(out, d, "rollout.json")
        if os.path.exists(f):
            rep = json.load(open(f))
            rows += rep["steps"]                 # trace_rl/bench/steps.py rows
            s["read_TBps"] = rep.get("read_bandwidth_TBps")
            if rep.get("errors"):
                s[f"{d}_errors"] = rep["errors"]
        else:
            s[f"{d}_missing"] = True
    s["rows"] = []
    for r in rows:
        keep = {k: r.get(k) for k in ("plan", "attention", "batch", "L", "path", "forward_ms", "step_ms",
                                      "roofline_frac", "skipped", "error") if r.get(k) is not None}
        at = r.get("attention_times") or {}
        if at:
            keep["attention_ms_per_layer"], keep["gluon_timed"] = at.get("ms"), at.get("gluon")
        s["rows"].append(keep)
    from trace_rl.bench.steps import summary
    s["cells"] = [x["steps"] for x in summary(rows)]
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "steps.log", 20)
write(out, s, 6000)
PY
echo "total $(( $(date +%s) - start )) s"
