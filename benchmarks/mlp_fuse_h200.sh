#!/usr/bin/env bash
# benchmarks/mlp_fuse_h200.sh (issue 16: the FP4 rollout's MLP tail with fewer launches). Usage (from the repo root;
# python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH), < 100 s:
#     benchmarks/mlp_fuse_h200.sh OUT_DIR
# Registered in benchmarks/h200_session_checks.sh as `mlpfuse` (named only).
# 1. pytest -m gpu (<= 55 s) -> OUT/pytest.{log,xml}:
#    tests/kernels/test_epilogue_silu_quantize_gpu.py: the stacked gate/up epilogue fused into the SiLU x mul quantize
#      bit-identical to the epilogue kernel + quantize_dequant_bf16(silu_mul=True) at 313 / 1 / 16 / 512 x 2 x 12288
#      and odd shapes, NaN / Inf rows, nvfp4:row and mxfp4, through the real stacked operand cache, and the torch spec;
#    tests/engine/test_mlp_fuse_gpu.py: 2 Qwen3-8B layers, B = 313 / 16: logits bit-identical with the epilogue
#      fusion and the norm fusions (now attention AND MLP input) on / off, the fused path once per layer at 313;
#    tests/engine/test_norm_quantize_gpu.py: the fused norm now 2 launches per layer (attention + MLP input), logits
#      bit-identical on / off, nvfp4 and mxfp4;
#    tests/kernels/test_silu_exact_gpu.py -k engine: the SiLU-only fusion's engine A/B (epilogue fusion pinned off).
# 2. benchmarks/mlp_fuse.py -> OUT/mlp_fuse.json (+ .log), with what is left: CUDA-graph medians of the MLP tail at
#    M = 313 / 1 / 16 / 512 (today: cuBLAS + epilogue + SiLU quantize; fused: cuBLAS + one launch; and the parts), the
#    bits of both in this run; then an 8-layer engine step A/B at B = 313, L = 257 (all fused / epilogue apart /
#    epilogue and norms apart), logits compared.
# 3. OUT/summary.json.
. "$(dirname "$0")/h200_check.sh"
run_pytest 55 -m gpu tests/kernels/test_epilogue_silu_quantize_gpu.py tests/engine/test_mlp_fuse_gpu.py \
    tests/engine/test_norm_quantize_gpu.py "tests/kernels/test_silu_exact_gpu.py::test_engine_logits_bit_identical_fused_or_apart"
left=$(( 97 - ($(date +%s) - start) ))
timeout $(( left > 15 ? left : 15 )) $PY benchmarks/mlp_fuse.py "$OUT/mlp_fuse.json" \
    --budget-s $(( left > 30 ? left - 12 : 10 )) > "$OUT/mlp_fuse.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$test_rc" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, test_rc, bench_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"pytest_rc": test_rc, "bench_rc": bench_rc, "pytest_tail": tail(out, "pytest.log", 16)}
try:
    r = json.load(open(os.path.join(out, "mlp_fuse.json")))
    rnd = lambda v: round(v, 2) if isinstance(v, float) else v   # noqa: E731
    s["all_bit_identical"], s["total_s"] = r.get("all_bit_identical"), r.get("total_s")
    s["kernel"] = [{k: rnd(v) for k, v in row.items()} for row in r["kernel"]]
    s["engine"] = [{k: rnd(v) for k, v in row.items()} for row in r["engine"]]
    for k in ("engine_saved_ms_per_layer_epilogue", "engine_saved_ms_per_layer_norms"):
        if k in r:
            s[k] = round(r[k], 4)
    s["errors"] = [e["what"] + ": " + e["trace"][-300:] for e in r["errors"]]
    s["skipped"] = r["skipped"]
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "mlp_fuse.log", 20)
write(out, s, 6000)
PY
