#!/usr/bin/env bash
# benchmarks/moe_wire_h200.sh (check `moewire`): the MoE rollout's grouped FP4 GEMMs on the Gluon kernel where
# kernels/grouped_dispatch.py's rule says (fp4_grouped_gluon.TILE_RULE: the H200 measurements of check `moegluon`).
# Usage (repo root; python3, torch, Triton 3.6, one H200), < 120 s:
#     benchmarks/moe_wire_h200.sh OUT_DIR
# 1. in parallel (nothing timed yet), each its own process and timeout:
#    pytest shard 0: tests/models/test_moe_gpu.py (the engine's MoE decode: graph == eager, load_weights; tiny model:
#      its experts take Triton by the rule, K = 64 / 40) -> OUT/pytest_0.{log,rc}
#    pytest shard 1: tests/models/test_moe_gateup_gpu.py (Qwen3-30B-A3B shape, 200 tokens: stacked gate|up == the
#      unstacked pair bit for bit, both on the Gluon kernel, the MoE block's paths), tests/backends/
#      test_grouped_linear.py (on the GPU: the grouped path vs the per-expert loop, nvfp4 on Gluon), the dispatch rule's
#      CPU tests -> OUT/pytest_1.{log,rc}
#    benchmarks/moe_wire.py --precompile-only, one process per plan (every kernel the timing runs, eager and
#    captured, into Triton's disk cache) -> OUT/precompile_<plan>.log
# 2. benchmarks/moe_wire.py -> OUT/moe_wire.json (+ .log): one MoE layer's experts (gate|up stacked, SwiGLU fused
#    into down's input, as models.moe runs them) at B = 128 / 256 / 512, nvfp4 W4A16 / mxfp4 W4A16 / nvfp4 W4A4,
#    GLUON_GROUPED off vs on interleaved (off, on, off, on; CUDA-graph us), the kernels each setting ran, graph ==
#    eager with it on, on-vs-off and vs-bf16 output differences.
# 3. OUT/summary.json: rcs, pytest tails, per (plan, B): us off / on, speedup, kernels, graph bits, differences.
# What to look for: pytest_rc 0; per row kernels_on {"gluon": 2} (nvfp4) / {"gluon": 1, "triton": 1} (mxfp4: down
# K = 768 stays on Triton), kernels_off {"triton": 2}, graph_equals_eager_on true, on_vs_off_rel ~1e-3 (summation
# order), speedup >= 1 (expected from the kernel numbers, nvfp4: ~1.0 at B = 128, ~1.2 at 256 / 512).
. "$(dirname "$0")/h200_check.sh"
( timeout 60 $PY -m pytest -v -p no:cacheprovider -rs tests/models/test_moe_gpu.py > "$OUT/pytest_0.log" 2>&1
  echo $? > "$OUT/pytest_0.rc" ) &
( timeout 60 $PY -m pytest -v -p no:cacheprovider -rs tests/models/test_moe_gateup_gpu.py \
      tests/backends/test_grouped_linear.py tests/kernels/test_grouped_dispatch.py > "$OUT/pytest_1.log" 2>&1
  echo $? > "$OUT/pytest_1.rc" ) &
for plan in nvfp4_w4a16 mxfp4_w4a16 nvfp4_w4a4; do     # one process per plan: the compiles run side by side
    timeout 60 $PY benchmarks/moe_wire.py --precompile-only --budget-s 50 --plans $plan \
        > "$OUT/precompile_$plan.log" 2>&1 &
done
wait
test_rc=$(cat "$OUT"/pytest_*.rc 2>/dev/null | sort -n | tail -1)   # the worst shard's
test_rc=${test_rc:-99}
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/moe_wire.py --out "$OUT/moe_wire.json" \
    --budget-s $(( left > 30 ? left - 15 : 15 )) > "$OUT/moe_wire.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"pytest_rc": test_rc, "bench_rc": bench_rc,
     "pytest_tails": [l for i in range(2) for l in tail(out, f"pytest_{i}.log", 3)],
     "pytest_failed": [l for i in range(2) for l in tail(out, f"pytest_{i}.log", 400) if l.startswith("FAILED")][:12],
     "precompile_errors": [l for n in sorted(os.listdir(out)) if n.startswith("precompile_")
                           for l in tail(out, n, 200) if "error" in l.lower()][:6]}
try:
    r = json.load(open(os.path.join(out, "moe_wire.json")))
    s["device"], s["triton"] = r.get("device"), r.get("triton")
    s["rows"] = [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()} for row in r["rows"]]
    s["skipped"] = r.get("skipped", [])
    if "error" in r:
        s["bench_error"] = r["error"][-800:]
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "moe_wire.log", 15)
write(out, s, 9000)
PY
