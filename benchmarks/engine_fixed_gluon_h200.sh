#!/usr/bin/env bash
# Issue 16's fixed 8k workload (docs/benchmarks.md "Fixed-length workload, memory filled") with the w4a4-kv4 engine's
# decode attention forced to the Gluon nvfp4-KV kernel. Usage: benchmarks/engine_fixed_gluon_h200.sh OUT_DIR
# (from the repo root; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH).
# NOT a < 120 s check: ONE WHOLE DEVICE CALL (expected ~3-5 min, capped at BUDGET_S = 530 s; run it with
# timeout_s 600). Registered in benchmarks/h200_session_checks.sh as `fixedgluon` (named only, never in the default
# order); standalone: `bash benchmarks/engine_fixed_gluon_h200.sh "$OUT"`.
# Budget: run 4 of the same part (benchmarks/results/rollout_engine_h200_run4_fixed.log, bf16 + w4a4-kv4, --iters 5)
# took 63 s after its imports and bandwidth probe: bf16 39 s (17 s of it the plain step's torch.compile), w4a4-kv4
# 24 s. Here four engines (bf16, w4a4-kv4 x 2, w4a4-kv4-mx) + the step rows' graph-timed attention candidates + a cold
# Triton cache (Gluon and FP4 kernels compiled on first use) + four Qwen3-8B builds: ~150-300 s; plus one engine
# for the operand-cache row (below, ~25-40 s).
# 1. `trace-rl bench rollout --parts fixed` (trace_rl/bench/workloads.py fixed_workload), Qwen3-8B shape (36 layers,
#    random weights), 64 prompts x 8 samples, 256 prompt tokens, 8192 response tokens, memory filled (B = what fits),
#    --iters 5, in this order: bf16 (contiguous cache, auto attention, plus the plain PyTorch step eager and
#    compiled at its batch and contexts), w4a4-kv4 (nvfp4 pool, 64-token pages) with attention forced to "gluon",
#    again on gluon WITH THE PERSISTENT OPERAND CACHE (--operand-cache w4a4-kv4=gluon: each dense FP4 linear keeps its
#    bf16 operand, +2 B per weight element ~14 GB, allocated before B is fitted, so that row's B is smaller; decode
#    linears at M >= 128 are cuBLAS on it, trace_rl/kernels/operand_cache.py; OPCACHE= empty skips the row),
#    then forced to "kernels" (the shipped Triton kernel), then w4a4-kv4-mx (mxfp4, auto), via
#    --engine-attention w4a4-kv4=gluon,w4a4-kv4=kernels (trace_rl/bench/engine_attention.py: a refused choice runs on
#    auto and its row says why). Per row: step_ms and forward_ms at L = 257 / 4352 / 8447, tokens/s of a modelled
#    wave (prefill + 8191 steps at the Simpson mean), the attention asked/forced/refused and the paths run. Rows
#    are written to OUT/fixed/rollout.json as each engine finishes: a run cut short keeps what it measured.
#    Log -> OUT/fixed.log.
#    OPCACHE also takes mxfp4 rows and the FP8 operand cache (trace_rl/bench/operand_cache.py, kernels/
#    operand_cache_fp8.py): OPCACHE=w4a4-kv4=gluon,w4a4-kv4-mx,w4a4-kv4-mx=fp8 adds w4a4-kv4-mx with the bf16 cache
#    and with the FP8 cache (1 B per weight element: a larger B than the bf16 cache's); two more engines, ~+60-80 s.
# 2. OUT/summary.json: the bench's rc, per row (plan/attention) tokens/s, vs bf16, vs the plain step (best of
#    eager/compiled, and the compiled one alone), step/forward ms and the attention path at each context, and
#    gluon vs kernels (tokens/s, step per context), gluon with vs without the operand cache (tokens/s, B, step per
#    context, cache GB); issue 16's bar (>= 2x bf16) and target (>= 2.5x) per FP4 row.
. "$(dirname "$0")/h200_check.sh"
BUDGET_S=${BUDGET_S:-530}
left=$(( BUDGET_S - 20 - ($(date +%s) - start) ))
timeout "$left" $PY -m trace_rl bench rollout --parts fixed --models "${MODEL:-qwen3-8b}" \
    --plans "${PLANS:-bf16,w4a4-kv4,w4a4-kv4-mx}" --engine-attention "${ATTN:-w4a4-kv4=gluon,w4a4-kv4=kernels}" \
    --operand-cache "${OPCACHE-w4a4-kv4=gluon}" \
    --response-lens 8192 --iters 5 ${BENCH_ARGS:-} --out "$OUT/fixed" > "$OUT/fixed.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc = sys.argv[1], int(sys.argv[2])
s = {"bench_rc": bench_rc, "timed_out": bench_rc in (124, 137)}
try:
    rep = json.load(open(os.path.join(out, "fixed", "rollout.json")))
    s["device"], s["read_TBps"], s["errors"] = rep["device"], rep["read_bandwidth_TBps"], rep["errors"]
    rows = rep["results"]
    simpson = lambda v: (v[0] + 4 * v[1] + v[2]) / 6
    bf16 = next((r for r in rows if r["plan"] == "bf16"), None)
    plain = (bf16 or {}).get("plain_baseline") or {}
    compiled = None
    # a variant that failed is {"error": ...} (decode_grid.best_baseline): no compiled number, not a KeyError
    if bf16 and all("ms" in (st.get("baseline_compiled") or {}) for st in bf16["steps"]):
        compiled = bf16["batch"] / (simpson([st["baseline_compiled"]["ms"] for st in bf16["steps"]]) * 1e-3)
    s["plain_step_decode_tokens_per_s"] = {"best": plain.get("decode_tokens_per_s"), "compiled": compiled}
    s["rows"] = []
    for r in rows:
        tps = r["tokens_per_s"]
        keep = {"plan": r["plan"], "attention_requested": r.get("attention_requested"),
                "attention_forced": r.get("attention_forced"), "attention_refused": r.get("attention_refused"),
                "attention_used": r.get("attention_used"), "layout": r["layout"], "batch": r["batch"],
                "operand_cache": r.get("operand_cache", False), "operand_cache_GB": r.get("operand_cache_GB", 0.0),
                "operand_cache_kind": r.get("operand_cache_kind") or ("bf16" if r.get("operand_cache") else None),
                "tokens_per_s": tps, "vs_bf16": tps / bf16["tokens_per_s"] if bf16 else None,
                "vs_plain_step_best": tps / plain["decode_tokens_per_s"] if plain else None,
                "vs_plain_step_compiled": tps / compiled if compiled else None,
                "step_ms": {st["L"]: st["step_ms"] for st in r["steps"]},
                "forward_ms": {st["L"]: st["forward_ms"] for st in r["steps"]},
                "roofline_frac": {st["L"]: st["roofline_frac"] for st in r["steps"]},
                "path": {st["L"]: st["path"] for st in r["steps"]},
                "attention_ms_per_layer": {st["L"]: (st.get("attention_times") or {}).get("ms") for st in r["steps"]},
                "prefill_s": r["prefill_s"], "e2e_ratio": r["e2e"]["ratio"]}
        if r["plan"] != "bf16" and keep["vs_bf16"]:
            keep["issue16_bar_2x"], keep["issue16_target_2_5x"] = keep["vs_bf16"] >= 2.0, keep["vs_bf16"] >= 2.5
        s["rows"].append(keep)
    by = {(x["plan"], x["attention_forced"], x["operand_cache_kind"] or False): x for x in s["rows"]}
    gl, kn = by.get(("w4a4-kv4", "gluon", False)), by.get(("w4a4-kv4", "kernels", False))
    if gl and kn:
        s["w4a4-kv4_gluon_vs_kernels"] = {"tokens_per_s": gl["tokens_per_s"] / kn["tokens_per_s"],
                                          "step": {L: kn["step_ms"][L] / gl["step_ms"][L] for L in gl["step_ms"]}}
    oc = by.get(("w4a4-kv4", "gluon", "bf16"))
    if gl and oc:   # per step at its own B; tokens/s includes B's shrink (the cache's memory)
        s["w4a4-kv4_gluon_operand_cache_vs_off"] = {
            "tokens_per_s": oc["tokens_per_s"] / gl["tokens_per_s"], "batch": [gl["batch"], oc["batch"]],
            "cache_GB": oc["operand_cache_GB"],
            "step_ms": {L: [gl["step_ms"][L], oc["step_ms"][L]] for L in oc["step_ms"]}}
    mx = {k: by.get(("w4a4-kv4-mx", None, k)) for k in (False, "bf16", "fp8")}
    if mx["fp8"]:   # the FP8 operand cache against the bf16 one and none, each at its own B
        s["w4a4-kv4-mx_operand_cache"] = {
            str(k or "off"): {"tokens_per_s": r["tokens_per_s"], "vs_bf16": r["vs_bf16"], "batch": r["batch"],
                              "cache_GB": r["operand_cache_GB"], "step_ms": r["step_ms"]}
            for k, r in mx.items() if r}
        if mx["bf16"]:
            s["w4a4-kv4-mx_fp8_vs_bf16_cache"] = {
                "tokens_per_s": mx["fp8"]["tokens_per_s"] / mx["bf16"]["tokens_per_s"],
                "step": {L: mx["bf16"]["step_ms"][L] / mx["fp8"]["step_ms"][L] for L in mx["fp8"]["step_ms"]}}
    s["bench_summary"] = rep.get("summary")
except Exception as e:   # noqa: BLE001 - a cut or failed run: say why, keep the log's tail
    s["summary_error"] = repr(e)
s["log_tail"] = [x for x in tail(out, "fixed.log", 40) if "Warning" not in x and "o = F." not in x][-14:]
write(out, s, 8000)
PY
echo "total $(( $(date +%s) - start )) s"
