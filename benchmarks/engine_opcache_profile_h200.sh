#!/usr/bin/env bash
# Where the FP4 decode step of issue 16's fixed 8k workload goes, per op class, against bf16; and the shared W4A4
# input quantization (q/k/v and gate/up quantize their input once) before/after. Usage:
# benchmarks/engine_opcache_profile_h200.sh OUT_DIR (from the repo root; python3, torch, Triton 3.6, one H200, device
# wheels on PYTHONPATH). < 120 s. Registered in benchmarks/h200_session_checks.sh as `opprof`.
# 1. benchmarks/engine_step_profile.py -> OUT/profile.json (+ .log): Qwen3-8B shape, random weights, the FIRST 8 OF
#    ITS 36 LAYERS (LAYERS=...; the per-layer numbers do not depend on depth; each row also estimates the 36-layer
#    step as graph step + 28 x layer 1's kernel sum), contexts 257 and 8447 (KV filled with random values):
#    - w4a4-kv4 (nvfp4 W4A4 + nvfp4 KV, page pool), attention forced to Gluon, operand cache on, B = 313; at L = 257
#      also with the shared input quantization (models.linear.SHARE_ROLLOUT_INPUTS, this branch) and without
#      it (the code before), graphs re-captured in between, and the two forwards' logits compared bit for bit;
#    - bf16, B = 101, contiguous cache, auto attention.
#    - then (if time is left) a cuBLAS probe at M = 313 over one layer's Qwen3-8B linear shapes (random bf16
#      weights, graph-timed over copies > L2): float32 output (what the operand-cache path runs, before its epilogue
#      kernel) vs bf16 output, q/k/v and gate/up as separate GEMMs (now: nvfp4 is not stacked) vs stacked.
#    Per row: the CUDA-graph step median (10 replays), then ONE EAGER step under torch.profiler: GPU kernel ms per op
#    class (linear = cuBLAS / FP4 GEMM + the operand-cache float32 epilogue; quantization = W4A4 activation
#    quantize; attention; prologue = q/k-norm + RoPE + nvfp4 KV write fused; norm; rope = the step's cos/sin;
#    activation; embedding; sampling; bookkeeping; other), graph - kernel sum = gaps inside the graph, top kernels,
#    and layer 1's kernels in launch order (name, class, ms).
# 2. if >= 12 s are left: pytest -k nvfp4 tests/kernels/test_shared_input.py (GPU: the shared W4A4 input quantization
#    equals each linear's own, bit for bit, on the FP4 GEMM, dequant + cuBLAS and operand-cache paths) -> OUT/pytest.*
# 3. OUT/summary.json: rcs, pytest tail, per row the step, classes, layer classes, 36-layer estimate; A/B at L = 257
#    (step ms, quantization ms, logits identical); estimated w4a4 / bf16 tokens/s per context at 36 layers; the
#    first w4a4 and bf16 rows' per-layer kernel lists and top kernels; the cuBLAS probe (us per layer).
# DRY=1: the CPU dry path (tiny preset, no profiler classes; checks the plumbing, the A/B logits, this summary).
. "$(dirname "$0")/h200_check.sh"
timeout 98 $PY benchmarks/engine_step_profile.py "$OUT/profile.json" --layers "${LAYERS:-8}" --budget-s 74 \
    ${DRY:+--dry} > "$OUT/profile.log" 2>&1
bench_rc=$?
# then, with what is left (>= 12 s; Triton's cache is warm), the shared quantization's bits on the GPU kernels
test_rc=-1
if [ -z "${DRY:-}" ] && [ $(( $(date +%s) - start )) -le 103 ]; then
    run_pytest 115 -x -k nvfp4 tests/kernels/test_shared_input.py
fi
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "timed_out": bench_rc in (124, 137), "pytest_rc": test_rc,
     "pytest_tail": tail(out, "pytest.log", 4)}
try:
    r = json.load(open(os.path.join(out, "profile.json")))
    s["device"], s["layers_run"] = r["device"], r["layers_run"]
    rows = [x for x in r["rows"] if "graph_step_ms" in x]
    s["errors"] = [x for x in r["rows"] if "error" in x]
    s["logits_identical"] = {x["L"]: x["shared_vs_separate_logits_identical"] for x in r["rows"]
                             if "shared_vs_separate_logits_identical" in x}
    key = lambda x: f"{x['plan']} B={x['batch']} L={x['L']}" + ("" if x["share_inputs"] else " separate-quant")
    s["rows"] = {key(x): {k: x.get(k) for k in ("graph_step_ms", "kernel_sum_ms", "gaps_ms", "kernels",
                                                "attention_path", "layer_kernel_sum_ms", "step_ms_at_36_layers_est",
                                                "classes_ms", "layer_classes_ms")} for x in rows}
    by = {(x["plan"], x["L"], x["share_inputs"]): x for x in rows}
    s["shared_quant_ab"], s["w4a4_vs_bf16_tokens_per_s_est36"] = {}, {}
    for L in r["lens"]:
        on, off, bf = by.get(("w4a4-kv4", L, True)), by.get(("w4a4-kv4", L, False)), by.get(("bf16", L, True))
        if on and off:
            s["shared_quant_ab"][L] = {
                "step_ms_before_after": [off["graph_step_ms"], on["graph_step_ms"]],
                "est36_before_after": [off.get("step_ms_at_36_layers_est"), on.get("step_ms_at_36_layers_est")],
                "quantization_ms_before_after": [off["classes_ms"]["quantization"], on["classes_ms"]["quantization"]],
                "layer_quant_ms_before_after": [off["layer_classes_ms"].get("quantization"),
                                                on["layer_classes_ms"].get("quantization")]}
        if on and bf and on.get("step_ms_at_36_layers_est") and bf.get("step_ms_at_36_layers_est"):
            s["w4a4_vs_bf16_tokens_per_s_est36"][L] = round(
                (on["batch"] / on["step_ms_at_36_layers_est"]) / (bf["batch"] / bf["step_ms_at_36_layers_est"]), 3)
    s["gemm_probe_M313"] = r.get("gemm_probe")
    for plan in ("w4a4-kv4", "bf16"):
        first = next((x for x in rows if x["plan"] == plan and x["share_inputs"]), None)
        if first:
            s[f"layer_kernels {plan} L={first['L']}"] = first["layer_kernels"]
            s[f"top_kernels {plan} L={first['L']}"] = first["top_kernels_ms"][:10]
except Exception as e:   # noqa: BLE001 - a cut or failed run: say why, keep the log's tail
    s["summary_error"] = repr(e)
s["log_tail"] = [x for x in tail(out, "profile.log", 30) if "USDT" not in x and "Warning" not in x][-14:]
write(out, s, 9000)
PY
echo "total $(( $(date +%s) - start )) s"
