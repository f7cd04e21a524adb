#!/usr/bin/env bash
# fp8cache (issue 16, mxfp4): the FP8 operand cache (trace_rl/kernels/operand_cache_fp8.py: each dense mxfp4 weight's
# operand as E4M3, exact; W4A4 activations stored as E4M3 by their quantize launch; torch._scaled_mm + the FP4
# epilogue) against the bf16 operand cache. Usage (from the repo root; python3, torch, Triton 3.6, one H200, device
# wheels on PYTHONPATH), < 120 s:
#     benchmarks/fp8cache_h200.sh OUT_DIR
# 1. GPU tests (tests/kernels/test_operand_cache_fp8.py: the GPU ones and, compiled, the activation stores / their
#    exactness bound / NaN-inf / the sync refusal, which CPU runs in the interpreter): bit-identical
#    operands (weights: E4M3 = bf16 operand x 32; activations: E4M3 x 2**(top - 133) = bf16 operand, plain / SiLU x mul
#    / RMSNorm-fused stores), NaN/inf stay non-finite, the accumulator against a float64 sum (printed: look for
#    "accumulator max error"), the linear against the bf16 cache's, CUDA-graph replay after an in-place reload; and
#    tests/engine/test_operand_cache_fp8_gpu.py: 2 Qwen3-8B layers, w4a4-kv4-mx, B = 313: decode logits with the FP8
#    cache vs the bf16 cache (eager + captured step on fp4.operand_cache_fp8), cache bytes 1 vs 2 per element.
# 2. benchmarks/fp8cache_gemm.py -> OUT/fp8cache_gemm.json (+ .log): at Qwen3-8B's q/k/v 6144x4096, gate/up
#    24576x4096, o_proj 4096x4096, down 4096x12288 and M = 128 / 313 / 512: us and TFLOP/s of the bf16 cache's cuBLAS
#    GEMM vs torch._scaled_mm on the E4M3 cache (use_fast_accum False = shipped, and True), the whole W4A4 linear
#    (quantize + GEMM + epilogue) both ways, the quantize launch with bf16 vs E4M3 stores and a separate cast launch;
#    accumulator errors vs float64 (bf16, fp8, fp8 fast); medians of CUDA-graph replays (engine/timing.py).
# 3. OUT/summary.json: pytest rc + tail, per row the speedups and errors, and the Qwen3-8B layer sum at M = 313
#    (qkv + gate_up + o_proj + down: bf16 vs fp8 linear us, x 36 layers = ms per step saved).
# DRY=1: the CPU plumbing only (bench --dry; no pytest).
. "$(dirname "$0")/h200_check.sh"
test_rc=-1
if [ -z "${DRY:-}" ]; then
    run_pytest 62 tests/kernels/test_operand_cache_fp8.py tests/engine/test_operand_cache_fp8_gpu.py -s \
        -k "gpu or bound or nan_and_inf or activation_kernels or reload"
fi
left=$(( 114 - ($(date +%s) - start) ))
timeout $(( left > 15 ? left : 15 )) $PY benchmarks/fp8cache_gemm.py --out "$OUT/fp8cache_gemm.json" \
    --budget-s $(( left > 25 ? left - 15 : 5 )) ${DRY:+--dry} > "$OUT/fp8cache_gemm.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "pytest_rc": test_rc, "pytest_tail": tail(out, "pytest.log", 3),
     "accumulator_lines": [x for x in tail(out, "pytest.log", 400) if "accumulator max error" in x][:8],
     "engine_lines": [x for x in tail(out, "pytest.log", 400) if "operand cache logits" in x][:2]}
try:
    r = json.load(open(os.path.join(out, "fp8cache_gemm.json")))
    s.update(device=r["device"], torch=r["torch"], skipped=r["skipped"], errors=r["errors"], wall_s=r.get("wall_s"))
    keys = ("gemm_bf16_us", "gemm_fp8_us", "gemm_fp8_fast_us", "gemm_bf16_tflops", "gemm_fp8_tflops",
            "gemm_fp8_fast_tflops", "gemm_fp8_speedup", "gemm_fp8_fast_speedup", "linear_bf16_us", "linear_fp8_us",
            "linear_fp8_speedup", "quant_bf16_us", "quant_e4m3_us", "cast_us", "operand_mismatch", "weight_mismatch",
            "err_bf16", "err_fp8", "err_fp8_fast", "refresh_bf16_us", "refresh_fp8_us")
    fmt = lambda k, v: round(v, 4) if isinstance(v, float) and not k.startswith("err") else v   # noqa: E731
    s["rows"] = [{"case": f"{x['shape']} M={x['M']}", **{k: fmt(k, x[k]) for k in keys if k in x},
                  **{k: v for k, v in x.items() if k.endswith("error")}} for x in r["rows"]]
    m313 = [x for x in r["rows"] if x["M"] == 313]
    if len(m313) == 4 and all("linear_bf16_us" in x and "linear_fp8_us" in x for x in m313):
        bf, f8 = sum(x["linear_bf16_us"] for x in m313), sum(x["linear_fp8_us"] for x in m313)
        gb, g8 = sum(x.get("gemm_bf16_us", 0) for x in m313), sum(x.get("gemm_fp8_us", 0) for x in m313)
        s["qwen3_8b_layer_M313"] = {"linear_bf16_us": bf, "linear_fp8_us": f8, "gemm_bf16_us": gb, "gemm_fp8_us": g8,
                                    "step_ms_saved_36_layers": (bf - f8) * 36 / 1e3}
except Exception as e:   # noqa: BLE001 - a cut run: say why, keep the log's tail
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "fp8cache_gemm.log", 8)
write(out, s)
PY
echo "total $(( $(date +%s) - start )) s"
