#!/usr/bin/env bash
# siluexact (issue 16): the fused SiLU x mul + W4A4 quantize of the MLP's down projection, bit-identical with torch's
# F.silu(gate) * up quantized apart (kernels.swiglu.EXACT_SILU), and what the fusion saves. Usage (from the repo
# root; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH), < 90 s:
#     benchmarks/silu_exact_h200.sh OUT_DIR
# 1. benchmarks/silu_exact.py -> OUT/silu_exact.json (+ .log): at M = 313, intermediate 12288 (Qwen3-8B), nvfp4:row,
#    the bits in this run (fused exact vs apart: 0 mismatches; exact / fast silu_mul vs torch over every bf16 gate)
#    and us per call under CUDA graphs (median of 15 replays of 20 calls, after warm-up), hot and cold inputs:
#    apart (torch SiLU, multiply, quantize), fused_exact (shipped, 16 warps), fused_exact_8_warps, fused_fast (old
#    form), the silu_mul kernel + quantize; saved us per layer / per 36-layer step. Exit 1 when the exact form is not bit-identical.
# 2. GPU tests: tests/kernels/test_silu_exact_gpu.py (the kernels against torch, the fused quantize against the
#    separate one, the engine's decode logits with decoder.FUSE_ROLLOUT_SILU_QUANTIZE on / off, bit-identical, and
#    the captured step taking the fused path).
# 3. OUT/summary.json.
# DRY=1: the CPU dry path (interpreter, tiny shapes: checks the plumbing and this summary; no pytest).
. "$(dirname "$0")/h200_check.sh"
timeout 40 $PY benchmarks/silu_exact.py --out "$OUT/silu_exact.json" > "$OUT/silu_exact.log" 2>&1
bench_rc=$?
test_rc=-1
if [ -z "${DRY:-}" ]; then
    run_pytest 85 tests/kernels/test_silu_exact_gpu.py
fi
$PY - "$OUT" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"bench_rc": bench_rc, "pytest_rc": test_rc, "pytest_tail": tail(out, "pytest.log", 3)}
try:
    r = json.load(open(os.path.join(out, "silu_exact.json")))
    for k in ("rows", "inter", "fmt", "cold_copies", "bits", "bits_error", "us", "saved_us_per_layer_hot",
              "saved_us_per_layer_cold", "saved_us_per_step_hot", "saved_us_per_step_cold", "speedup_hot",
              "speedup_cold", "wall_s"):
        if k in r:
            s[k] = r[k]
except Exception as e:
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "silu_exact.log", 8)
write(out, s)
PY
echo "total $(( $(date +%s) - start )) s"
