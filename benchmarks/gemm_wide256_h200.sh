#!/usr/bin/env bash
# benchmarks/gemm_wide256_h200.sh OUT_DIR (check `gemm256`; issue 15 FP4 W4A16 at M = 256 / 512 >= 0.8x cuBLAS, M = 64
# >= 1.6x): the opt-in 256-token Gluon GEMM (trace_rl/kernels/fp4_gemm_wide256.py). One H200, python3, torch, Triton
# 3.6, < 120 s:
# 0. benchmarks/gemm_wide256.py --precompile-only: the binaries of steps 1-2 (both formats, every variant and token
#    tile, the stream-K schedule, the existing wide configs) in 16 processes into Triton's cache -> OUT/precompile.log
# 1. pytest tests/kernels/test_fp4_gemm_wide256.py in its own process (-v: a timeout still shows what ran): vs the
#    float64 reference at M 17..600, odd N / K, both formats, every variant, forced splits (deterministic), vs the
#    existing wide kernel; the stream-K schedule (fp4_gemm_wide256_sk.py) at one CTA per SM and at 3-7 CTAs (tiles
#    split over 2-3 CTAs, ranges over several tiles) -> OUT/pytest.{log,xml}
# 2. benchmarks/gemm_wide256.py -> OUT/gemm_wide256.json (+ .log): per format, shape (K x N = 4096x12288, 12288x4096)
#    and M (256, 512, 64, 128: the tail is what a budget cut skips), cuBLAS BF16 vs the existing wide Gluon kernel
#    (config_for, WIDE_OVERLAP) vs this kernel: stream-K (`sk`, `sk_nooverlap`: one CTA per SM, equal K-step ranges)
#    and the split-K grid (w256 at the auto split, x2, /2; no overlap; 2 slots), all in the same run; CUDA graphs
#    over weight copies > L2, median us. What to look for: best_w256.speedup >= 0.8 at M = 256 / 512 (vs
#    best_wide.speedup, the existing kernel), >= 1.6 at M = 64; rel_diff_vs_wide ~1e-3 (a different split).
# 3. OUT/summary.json: rcs, the pytest tail, per row cuBLAS / best existing wide / best w256 us and speedups.
. "$(dirname "$0")/h200_check.sh"
W256_M=${W256_M:-256,512,64,128}
timeout 45 $PY benchmarks/gemm_wide256.py --precompile-only --M "$W256_M" --out /dev/null > "$OUT/precompile.log" 2>&1
pre_rc=$?
run_pytest 65 tests/kernels/test_fp4_gemm_wide256.py
left=$(( 114 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/gemm_wide256.py --out "$OUT/gemm_wide256.json" --M "$W256_M" \
    --budget-s $(( left > 30 ? left - 14 : 15 )) > "$OUT/gemm_wide256.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$pre_rc" "$bench_rc" "$test_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, pre_rc, bench_rc, test_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
s = {"precompile_rc": pre_rc, "bench_rc": bench_rc, "pytest_rc": test_rc,
     "precompile_tail": tail(out, "precompile.log", 3), "pytest_tail": tail(out, "pytest.log", 12)}
try:
    r = json.load(open(os.path.join(out, "gemm_wide256.json")))
    s["rows"] = []
    for row in r["rows"]:     # compact: the best of each kernel as [variant, us, speedup], then every variant's us
        c = {k: row.get(k) for k in ("fmt", "K", "N", "M")}
        c["cublas_us"] = round(row.get("cublas_bf16_us", 0), 2)
        for b in ("best_wide", "best_w256"):
            if b in row:
                c[b] = [row[b]["variant"], round(row[b]["us"], 2), round(row[b]["speedup"], 3)]
        c["us"] = {k: round(v["us"], 2) for k, v in row.items() if isinstance(v, dict) and "us" in v
                   and not k.startswith("best")}
        c["max_rel_diff_vs_wide"] = max((v.get("rel_diff_vs_wide") or 0 for v in row.values()
                                         if isinstance(v, dict) and "us" in v), default=None)
        s["rows"].append(c)
    s["errors"] = r.get("errors", [])[:6]
    s["skipped"] = len(r.get("skipped", []))
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "gemm_wide256.log", 15)
write(out, s, 8000)
PY
