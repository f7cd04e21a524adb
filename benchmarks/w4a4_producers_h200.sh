#!/usr/bin/env bash
# benchmarks/w4a4_producers_h200.sh (check `w4a4prod`; issue 15: "W4A4 within 15% of W4A16 at every M", measured the
# way the engine runs W4A4: the producer emits the quantized operand). Usage (from the repo root; python3, torch,
# Triton 3.6, one H200, device wheels on PYTHONPATH), < 120 s:
#     benchmarks/w4a4_producers_h200.sh OUT_DIR
# 0. benchmarks/w4a4_producers.py --precompile-only: every row's kernels (eager and captured: the captured Gluon GEMM
#    is its PDL variant) in 12 worker processes into Triton's cache -> OUT/precompile.log (<= 40 s; what it does not
#    reach compiles in the bench's first call of that row)
# 1. benchmarks/w4a4_producers.py -> OUT/w4a4_producers.json (+ .log): per pair (layer_input: add + RMSNorm ->
#    4096x6144; mlp_down: SiLU x mul -> 12288x4096; o_proj: attention output -> 4096x4096), nvfp4 / mxfp4,
#    M = 1/4/16/64/256/512 (o_proj + 313): CUDA-graph us of bf16 (producer + cuBLAS), w4a16 (producer + fp4_linear),
#    w4a4 (fused producer + fp4_linear_prequantized; o_proj: operand quantized outside the graph), w4a4_apart
#    (producer + fp4_linear(.., fmt): o_proj's engine path today), for the MLP also torch's SiLU x mul before W4A16 /
#    W4A4 apart (nvfp4's engine path), the producers alone, o_proj's quantize alone; w4a4 / w4a16 (target <= 1.15),
#    the engine's W4A4 today over its W4A16, the GEMM path, operand and output bits fused vs apart.
# 2. OUT/summary.json: rcs, headline (worst w4a4 / w4a16 per pair and format, fused and as the engine runs it today,
#    rows over the target, bits, o_proj's quantize launch at M = 313 and its cost over 36 layers), then the rows.
# Env: W4A4P_PAIRS="layer_input,mlp_down" / W4A4P_MS="1,16" / W4A4P_FMTS=mxfp4 restrict the rows (a follow-up run
# for rows a budget cut).
. "$(dirname "$0")/h200_check.sh"
SEL=(${W4A4P_PAIRS:+--pairs $W4A4P_PAIRS} ${W4A4P_MS:+--ms $W4A4P_MS} ${W4A4P_FMTS:+--fmts $W4A4P_FMTS})
timeout 44 $PY benchmarks/w4a4_producers.py --precompile-only --precompile-timeout-s 40 ${SEL[@]+"${SEL[@]}"} \
    > "$OUT/precompile.log" 2>&1
pre_rc=$?
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/w4a4_producers.py --out "$OUT/w4a4_producers.json" ${SEL[@]+"${SEL[@]}"} \
    --budget-s $(( left > 30 ? left - 12 : 15 )) > "$OUT/w4a4_producers.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, pre_rc, bench_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"precompile_rc": pre_rc, "bench_rc": bench_rc, "precompile_tail": tail(out, "precompile.log", 3)}
try:
    r = json.load(open(os.path.join(out, "w4a4_producers.json")))
    rows = r["rows"]
    for field, name in (("w4a4_over_w4a16", "worst_fused_over_w4a16"),
                        ("engine_today_over_w4a16", "worst_engine_today_over_w4a16")):
        worst = {}
        for row in rows:
            key = f"{row['pair']} {row['fmt']}"
            if field in row and row[field] > worst.get(key, (0, 0))[0]:
                worst[key] = (row[field], row["M"])
        s[name] = {k: {"ratio": v[0], "M": v[1]} for k, v in worst.items()}
    s["over_target"] = [f"{row['pair']} {row['fmt']} M={row['M']}: {row['w4a4_over_w4a16']}" for row in rows
                        if row.get("meets_target") is False]
    s["all_meet_target"] = bool(rows) and all(row.get("meets_target", True) for row in rows)
    checks = [row.get("check", {}) for row in rows]
    s["bits_ok"] = bool(rows) and all(c.get("output_bits") and c.get("operand_bits", True) for c in checks)
    q = [row for row in rows if row["pair"] == "o_proj" and row["M"] == 313 and "quantize_alone_us" in row]
    s["o_proj_quantize_at_313"] = {row["fmt"]: {"quantize_us": round(row["quantize_alone_us"], 2),
                                                "apart_us": round(row.get("w4a4_apart_us", float("nan")), 2),
                                                "w4a16_us": round(row.get("w4a16_us", float("nan")), 2),
                                                "per_step_36_layers_us": round(36 * row["quantize_alone_us"], 1)}
                                   for row in q}
    s["ceilings"], s["errors"], s["skipped"] = r.get("ceilings"), r.get("errors", [])[:8], len(r.get("skipped", []))
    s["total_s"] = r.get("total_s")
    s["rows"] = [{"pair": row["pair"], "fmt": row["fmt"], "M": row["M"], "path": row["gemm_path"],
                  "us": {k[:-3]: round(v, 2) for k, v in row.items() if k.endswith("_us")},
                  "engine_today": [row.get("engine_today"), row.get("engine_today_w4a16")],
                  **{k: row[k] for k in ("w4a4_over_w4a16", "apart_over_w4a16", "engine_today_over_w4a16",
                                         "speedup_vs_bf16",
                                         "producer_w4a4_minus_w4a16_us", "quantize_share_of_apart") if k in row},
                  "bits": {k: v for k, v in row.get("check", {}).items() if isinstance(v, bool)},
                  "rel_w4a4_vs_w4a16": round(row.get("check", {}).get("rel_w4a4_vs_w4a16", float("nan")), 4)}
                 for row in rows]
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "w4a4_producers.log", 20)
write(out, s, 12000)
PY
