#!/usr/bin/env bash
# benchmarks/norm_quant_h200.sh (issue 16 item 3: the residual add + RMSNorm with the W4A4 activation quantization
# fused in, trace_rl/kernels/rmsnorm_quantize.py). Usage (from the repo root; python3, torch, Triton 3.6, one H200,
# device wheels on PYTHONPATH), < 90 s:
#     benchmarks/norm_quant_h200.sh OUT_DIR
# 1. pytest -m gpu tests/engine/test_norm_quantize_gpu.py tests/kernels/test_rmsnorm_quantize.py -> OUT/pytest.{log,xml}:
#    a decode step's logits of 2 Qwen3-8B-shaped layers (w4a4-kv4 and w4a4-kv4-mx, B = 313 and 16) bit-identical
#    with the fusion on and off, the fused kernel once per layer, and in the captured step; then the fused kernel
#    bit-identical to add_rms_norm + quantize_dequant_bf16 at B = 1 / 313 / 512 x 4096 (NaN, Inf, zero, tiny, huge
#    rows), hidden 2048 / 2560 / 5120, a CUDA-graph replay.
# 2. benchmarks/norm_quant.py -> OUT/norm_quant.json (+ .log): per format (nvfp4:row, mxfp4) and B = 1 / 16 / 313 /
#    512 x 4096, bf16: bits of fused vs separate in this run, CUDA-graph medians of separate (add_rms_norm +
#    quantize_dequant_bf16), fused (h written) and fused without h (what the decoder runs without activation hooks),
#    the bytes each moves and the floor at the copy bandwidth measured in this run.
# 3. OUT/summary.json: rcs, pytest tail, per row the bits and us / floors / saved us / speedup.
. "$(dirname "$0")/h200_check.sh"
run_pytest 60 -m gpu tests/engine/test_norm_quantize_gpu.py tests/kernels/test_rmsnorm_quantize.py
left=$(( 88 - ($(date +%s) - start) ))
timeout $(( left > 15 ? left : 15 )) $PY benchmarks/norm_quant.py --out "$OUT/norm_quant.json" \
    --budget-s $(( left > 30 ? left - 15 : 10 )) > "$OUT/norm_quant.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$test_rc" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, test_rc, bench_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"pytest_rc": test_rc, "bench_rc": bench_rc, "pytest_tail": tail(out, "pytest.log", 14)}
try:
    r = json.load(open(os.path.join(out, "norm_quant.json")))
    s["copy_rw_TBps"], s["all_bit_identical"], s["total_s"] = r["copy_rw_TBps"], r["all_bit_identical"], r["total_s"]
    rnd = lambda v: round(v, 2) if isinstance(v, float) else v   # noqa: E731
    s["rows"] = [{"format": row["format"], "B": row["batch"], "bits": all(row["bit_identical"].values()),
                  **{k: rnd(row[k]) for k in ("separate_us", "fused_us", "fused_noh_us", "saved_us", "speedup_noh")},
                  "floor_us": {k: rnd(v) for k, v in row.get("floor_us", {}).items()},
                  "noh_8warps_us": rnd(row.get("fused_noh_8warps", {}).get("us")),
                  "noh_8warps_bits": row.get("fused_noh_8warps", {}).get("operand_bits_equal")} for row in r["rows"]]
    s["errors"] = [e["what"] + ": " + e["trace"][-300:] for e in r["errors"]]
    s["skipped"] = r["skipped"]
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "norm_quant.log", 20)
write(out, s, 6000)
PY
