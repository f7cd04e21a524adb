#!/usr/bin/env bash
# benchmarks/gemm_compute_h200.sh (issue 15: the Gluon W4A16 GEMM at M <= 16 is compute/latency bound, compute-only
# 11.9-16.8 us against a 9.3 us read floor): the shipped Gluon launch and the variants of
# benchmarks/gemm_compute_kernels.py (overlap; two consumer warpgroups + overlap; 64-row tiles x 512-column steps,
# 3 CTAs/SM), each full and compute-only. Usage (from the repo root; python3, torch, Triton 3.6, one H200, device
# wheels on PYTHONPATH), < 120 s:
#     benchmarks/gemm_compute_h200.sh OUT_DIR
# 1. benchmarks/gemm_compute.py -> OUT/gemm_compute.json (+ .log): compiles every kernel first (16 worker processes),
#    then per format (nvfp4, mxfp4), K x N (4096x12288, 12288x4096) and M (1, 16): cuBLAS BF16; shipped and each
#    variant: the full output against the torch reference (rel error < 1e-2, else not timed) and the shipped output
#    (rel difference, bit-equal), then full, compute-only and no-K-step (compute-only binary, 0 K steps: launch +
#    setup + split-K epilogue) us (CUDA graph over weight copies > L2, median of 15
#    replays after 3 warm-up), speedups, the launch plan (grid, steps per program, CTAs per SM, waves, busiest SM's
#    work over the mean) and each compiled kernel's registers / spills / shared bytes.
# 2. OUT/summary.json: rc, per row and variant full us / speedup / compute-only us / errors, errors, log tail.
. "$(dirname "$0")/h200_check.sh"
timeout 108 $PY benchmarks/gemm_compute.py --out "$OUT/gemm_compute.json" --budget-s 80 > "$OUT/gemm_compute.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc = sys.argv[1], int(sys.argv[2])
s = {"bench_rc": bench_rc}
try:
    r = json.load(open(os.path.join(out, "gemm_compute.json")))
    s["precompile_s"], s["precompile_errors"] = r.get("precompile_s"), r.get("precompile_errors", [])[:4]
    s["precompile_hung"] = r.get("precompile_hung", [])
    s["rows"] = []
    for row in r["rows"]:
        o = {k: row[k] for k in ("fmt", "K", "N", "M")}
        o["cublas_us"] = round(row.get("cublas_bf16_us", -1), 2)
        for name, v in row.items():
            if not isinstance(v, dict):
                continue
            p = v.get("plan", {})
            o[name] = {"full_us": round(v.get("full_us", -1), 2), "speedup": round(v.get("full_speedup", -1), 3),
                       "compute_us": round(v.get("compute_only_us", -1), 2),
                       "no_k_us": round(v.get("no_k_steps_us", -1), 2),
                       "rel_ref": v.get("rel_ref"), "bit_equal_shipped": v.get("bit_equal_shipped",
                                                                              v.get("bit_equal_fp4_matmul_gluon")),
                       "ctas": p.get("programs"), "per_sm": p.get("ctas_per_sm"),
                       "busiest": p.get("busiest_over_mean"),
                       "regs": [v.get("full_kernel", {}).get("registers"), v.get("compute_kernel", {}).get("registers")],
                       "spills": [v.get("full_kernel", {}).get("spills"), v.get("compute_kernel", {}).get("spills")]}
        s["rows"].append(o)
    s["errors"], s["skipped"], s["total_s"] = r.get("errors", [])[:8], r.get("skipped", []), r.get("total_s")
except Exception as e:   # noqa: BLE001
    s["summary_error"] = repr(e)
s["log_tail"] = tail(out, "gemm_compute.log", 8)
write(out, s, 6000)
PY
