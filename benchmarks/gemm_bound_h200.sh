#!/usr/bin/env bash
# benchmarks/gemm_bound_h200.sh (issue 15, M <= 16 W4A16 at ~1.7 TB/s whatever the variant): what bounds it. Usage (from
# the repo root of a checkout; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH), < 120 s:
#     benchmarks/gemm_bound_h200.sh OUT_DIR
# 1. benchmarks/gemm_bound.py -> OUT/gemm_bound.json (+ .log): at M = 1, 16 on K x N = 4096x12288 and 12288x4096,
#    nvfp4 then mxfp4 (skipped past the budget), CUDA graphs over weight copies > L2 (gemm_gluon.py's timing):
#    - floor per shape and format: a Triton stream XOR-reducing exactly the weight's bytes (values + scales) at the
#      shipped grid's program count and at 1 / 2 / 4 x 132 programs (cp.async, 3 stages; and 2 x 132 with plain
#      loads), torch .sum() and copy_ of the same bytes;
#    - per M: cuBLAS BF16, the shipped fp4_matmul, and the probe kernel (benchmarks/gemm_bound_kernels.py, the
#      shipped K loop) as full (should equal shipped, bit-equal output), load-only (same loads XOR-reduced, no decode
#      / wgmma) and compute-only (register words decoded + wgmma, no weight loads), with registers, shared memory,
#      CTAs per SM, waves and bytes per program of each compiled kernel.
# 2. if ncu exists: one eager launch of the shipped kernel and one of the load-only probe at M = 1, 4096x12288 nvfp4
#    under `ncu --page raw --csv` (SpeedOfLight, MemoryWorkloadAnalysis, WarpStateStats, Occupancy, LaunchStats,
#    SchedulerStats; clocks not locked; caches flushed) -> OUT/ncu.csv (+ ncu.log), time-boxed to 40 s; else
#    "ncu": "absent".
# 3. OUT/summary.json: per config us and TB/s of every variant, the floor entries, one verdict per shape and M
#    (nvfp4 and mxfp4), the ncu headline metrics and top stall reasons, rcs and errors.
. "$(dirname "$0")/h200_check.sh"
timeout 72 $PY benchmarks/gemm_bound.py --out "$OUT/gemm_bound.json" --budget-s 52 > "$OUT/gemm_bound.log" 2>&1
bench_rc=$?
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
ncu_rc=-1
if [ -n "$NCU" ]; then
    left=$(( 112 - ($(date +%s) - start) ))
    timeout $(( left < 40 ? (left > 5 ? left : 5) : 40 )) "$NCU" --target-processes all --clock-control none \
        --kernel-name "regex:_fp4_gemm_kernel|_probe_gemm_kernel" --launch-skip 2 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats --page raw --csv $PY benchmarks/gemm_bound.py --ncu-target \
        > "$OUT/ncu.csv" 2> "$OUT/ncu.log"
    ncu_rc=$?
fi
$PY - "$OUT" "$bench_rc" "$ncu_rc" "${NCU:-absent}" <<'PY'
import csv, json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc, ncu_rc, ncu = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s = {"bench_rc": bench_rc, "ncu": ncu, "ncu_rc": ncu_rc}
try:
    r = json.load(open(os.path.join(out, "gemm_bound.json")))
    keep = ("us", "TBps", "TBps_read", "programs", "registers", "spills", "shared_bytes", "ctas_per_sm", "limited_by",
            "waves")
    us = lambda v: {k: round(v[k], 3) if isinstance(v[k], float) else v[k] for k in keep if k in v}
    s["verdicts"] = r["verdicts"]
    s["floor"] = [{k: (us(v) if isinstance(v, dict) else v) for k, v in f.items()} for f in r["floor"]]
    s["rows"] = [{k: (us(v) if isinstance(v, dict) and "us" in v else v) for k, v in row.items() if k != "config"}
                 for row in r["rows"]]
    s["bit_equal_full_vs_shipped"] = [row.get("full", {}).get("bit_equal_shipped") for row in r["rows"]]
    s["errors"], s["skipped"] = r.get("errors", [])[:6], r.get("skipped", [])
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
s["bench_log_tail"] = tail(out, "gemm_bound.log", 6)
if ncu != "absent":
    try:   # --page raw --csv: a header of metric names, a row of units, one row per profiled kernel
        rows = [row for row in csv.reader(line for line in open(os.path.join(out, "ncu.csv")) if line.startswith('"'))]
        head = rows[0]       # then a units row (its "ID" cell empty) where ncu prints one, then a row per kernel
        unit = rows[1] if len(rows) > 1 and not rows[1][0].strip() else [""] * len(head)
        kernels = [r for r in rows[1:] if r[0].strip()]
        want = ("gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
                "sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum",
                "sm__warps_active.avg.pct_of_peak_sustained_active",
                "smsp__issue_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread",
                "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem", "launch__grid_size",
                "smsp__average_warp_latency_per_inst_issued.ratio")
        def num(x):
            try:
                return float(x.replace(",", ""))
            except ValueError:
                return -1.0
        s["ncu_kernels"] = []
        for val in kernels:
            m = {h: (v, u) for h, u, v in zip(head, unit, val)}
            stalls = [(k, num(v)) for k, (v, u) in m.items() if "issue_stalled" in k and "not_issued" not in k]
            s["ncu_kernels"].append({"kernel": m.get("Kernel Name", ("?", ""))[0],
                                     "metrics": {k: " ".join(m[k]).strip() for k in want if k in m},
                                     "top_stalls": sorted(stalls, key=lambda kv: -kv[1])[:10]})
    except Exception as e:   # noqa: BLE001
        s["ncu_error"] = repr(e)
    s["ncu_log_tail"] = tail(out, "ncu.log", 6)
write(out, s, 8000)
PY
