#!/usr/bin/env bash
# benchmarks/gemm_fixed_h200.sh (issue 15: the Gluon W4A16 GEMM's fixed cost at M <= 16, 4.7-8.6 us of its 15-19 us
# with no K step at all, benchmarks/results/gemm_compute_h200_1202c.json): what the fixed cost is made of and the
# variants of benchmarks/gemm_fixed_kernels.py that cut it. Usage (from the repo root; python3, torch, Triton 3.6,
# one H200, device wheels on PYTHONPATH), < 120 s:
#     benchmarks/gemm_fixed_h200.sh OUT_DIR
# 1. benchmarks/gemm_fixed.py -> OUT/gemm_fixed.json (+ .log): compiles every kernel first (16 worker processes, at
#    the real shapes), then per format (nvfp4, mxfp4), K x N (4096x12288, 12288x4096) and M (1, 16): cuBLAS BF16 at
#    the shape and at K = 256 (its fixed cost); an empty Gluon kernel at each variant's grid (the launch floor);
#    for shipped (the launcher's config), n64_k512 (the fastest probe variant), n64_fin (row factors before the
#    ticket, constexpr split: one round of partial loads, one GPU fence), n64_nosplit (split 1) and n64_fin_pdl
#    (n64_fin as a programmatic dependent launch: next call's setup + weight TMAs under this one's tail; the empty
#    kernel with PDL too): the full output
#    against the torch reference (rel < 1e-2, else not timed) and n64_k512's (n64_fin bit-equal), then full,
#    compute-only and no-K-step us (CUDA graph over weight copies > L2, median of 15 replays after 3 warm-up), the
#    plan, registers / spills; and `split`: launch floor, setup + store, split-K epilogue, what n64_fin saves.
# 2. OUT/summary.json: rc, per row the split and per variant full / no-K us and speedup, errors, log tail.
. "$(dirname "$0")/h200_check.sh"
timeout 110 $PY benchmarks/gemm_fixed.py --out "$OUT/gemm_fixed.json" --budget-s 80 > "$OUT/gemm_fixed.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc = sys.argv[1], int(sys.argv[2])
s = {"bench_rc": bench_rc}
try:
    r = json.load(open(os.path.join(out, "gemm_fixed.json")))
    s["precompile_s"], s["precompile_errors"] = r.get("precompile_s"), r.get("precompile_errors", [])[:4]
    s["precompile_hung"] = r.get("precompile_hung", [])
    s["rows"] = []
    for row in r["rows"]:
        o = {k: row[k] for k in ("fmt", "K", "N", "M")}
        o["cublas_us"] = round(row.get("cublas_bf16_us", -1), 2)
        o["split"] = row.get("split", {})
        o["empty_us"] = {g: round(u, 2) for g, u in row.get("empty_us", {}).items()}
        for name, v in row.items():
            if not isinstance(v, dict) or "plan" not in v and "skipped" not in v:
                continue
            p = v.get("plan", {})
            o[name] = {"full_us": round(v.get("full_us", -1), 2), "speedup": round(v.get("full_speedup", -1), 3),
                       "compute_us": round(v.get("compute_only_us", -1), 2),
                       "no_k_us": round(v.get("no_k_steps_us", -1), 2), "rel_ref": v.get("rel_ref"),
                       "bit_equal_n64_k512": v.get("bit_equal_n64_k512"), "grid": p.get("grid"),
                       "regs": [v.get("full_kernel", {}).get("registers"), v.get("compute_kernel", {}).get("registers")],
                       "spills": [v.get("full_kernel", {}).get("spills"), v.get("compute_kernel", {}).get("spills")]}
        s["rows"].append(o)
    s["errors"], s["skipped"], s["total_s"] = r.get("errors", [])[:8], r.get("skipped", []), r.get("total_s")
except Exception as e:   # noqa: BLE001
    s["summary_error"] = repr(e)
s["log_tail"] = tail(out, "gemm_fixed.log", 8)
write(out, s, 8000)
PY
