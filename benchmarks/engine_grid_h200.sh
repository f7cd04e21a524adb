#!/usr/bin/env bash
# Issue 16 (BF16 engine >= 0.9x / 0.95x the honest baseline): the engine's decode step against the compiled plain
# PyTorch step (`trace-rl bench rollout --parts grid`, Qwen3-8B shape) at the cells that missed on 2026-12-01
# (B = 100 at L = 4352 / 8447, now with the split-count attention candidates `kernels.decode_attention:sN`) and
# B = 1, L = 257 (0.94x there). Usage: benchmarks/engine_grid_h200.sh OUT_DIR [GRID] (from the repo root, device
# wheels on PYTHONPATH). < 120 s (run 3's full grid took 62 s with 17 s of torch.compile).
# Writes OUT_DIR/grid/rollout.json (rows: engine_ms with the path the engine chose, engine_path_ms per candidate,
# baseline_ms, ratio), OUT_DIR/grid.log and OUT_DIR/summary.json (per cell: chosen path, engine / best-candidate /
# baseline ms, ratio and the ratio of the best candidate).
. "$(dirname "$0")/h200_check.sh"
GRID=${2:-"100:4352,8447;1:257"}
timeout 110 $PY -m trace_rl bench rollout --parts grid --models "${MODEL:-qwen3-8b}" --iters 5 --grid "$GRID" \
    --out "$OUT/grid" > "$OUT/grid.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, rc = sys.argv[1], int(sys.argv[2])
s = {"bench_rc": rc}
try:
    rep = json.load(open(os.path.join(out, "grid", "rollout.json")))
    for r in rep["grid"]:                    # trace_rl/bench/rollout.py: a list of decode_grid rows
        best = min(r["engine_path_ms"], key=r["engine_path_ms"].get)
        s[f"B{r['batch']}/L{r['L']}"] = {
            "path": r["path"], "engine_ms": r["engine_ms"], "best_candidate": best,
            "best_candidate_ms": r["engine_path_ms"][best], "candidates_ms": r["engine_path_ms"],
            "baseline_ms": r["baseline_ms"], "baseline": f"{r['baseline_variant']}/{r['baseline_backend']}",
            "ratio": r["ratio"], "ratio_best_candidate": r["baseline_ms"] / r["engine_path_ms"][best],
            "step_ms": r["step_ms"], "errors": r.get("engine_path_errors"),
            "autotune": r.get("attention_autotune")}   # the choice: ms per layer call of each candidate, how timed
except Exception as e:   # noqa: BLE001
    s["error"] = repr(e)
    s["log_tail"] = tail(out, "grid.log", 15)
write(out, s)
PY
echo "total $(( $(date +%s) - start )) s"
