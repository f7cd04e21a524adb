#!/usr/bin/env bash
# benchmarks/gemm_wide256_h200.sh OUT_DIR (check `gemm256`; issue 15 FP4 W4A16 at M = 256 / 512 >= 0.8x cuBLAS, M = 64
# >= 1.6x): the opt-in 256-token Gluon GEMM (trace_rl/kernels/fp4_gemm_wide256.py, fp4_gemm_wide256_sk.py). One H200,
# python3, torch, Triton 3.6, < 120 s. A CUDA error is sticky (every later launch of its process fails), so each step
# that launches the new kernels keeps its families in separate processes, and a family whose smoke failed is not
# launched again:
# 1. benchmarks/gemm_wide256_smoke.py: ONE launch of each family (w256: split-K grid at 256 tokens; sk: stream-K;
#    2cta: WIDE64_2CTA on the grid; sk2cta: WIDE64_2CTA stream-K) x format in its OWN process, all at once, against
#    the float64 reference (K = 1536: every scale-box position) -> OUT/smoke_<family>_<fmt>.{json,log}. The first
#    version faulted here with "an illegal instruction" (the scale box's unaligned TMA coordinate, fixed). Beside
#    them, benchmarks/tma_alignment_probe.py COL, each column in its own process: one TMA load of the [128, 4] int32
#    scale box at innermost word 4 (aligned: must copy exactly; beside the smokes), 2 and 1 (the first version's
#    nvfp4 / mxfp4 odd steps: expected to fault; after the smokes) -> OUT/tma_probe_<col>.{json,log}: the rule the fix
#    rests on, on this GPU.
# 2. benchmarks/gemm_wide256.py --precompile-only --families <passed>: their binaries and the existing wide kernel's
#    into Triton's cache, 16 processes (a worker's jobs after its first CUDA error are reported as not run)
#    -> OUT/precompile.log
# 3. tests/kernels/test_fp4_gemm_wide256.py, one pytest process per family at once (-k: w256 = the grid tests, sk =
#    the stream-K tests (they compare with the grid kernel too), 2cta = the two-CTAs-per-SM test under both
#    schedules), the CPU tests in a fourth -> OUT/pytest_<part>.{log,xml}
# 4. benchmarks/gemm_wide256.py --families <smoke passed> -> OUT/gemm_wide256.json (+ .log): per format, shape (K x N
#    = 4096x12288, 12288x4096) and M (256, 512, 64, 128: the tail is what a budget cut skips), cuBLAS BF16 vs the
#    existing wide Gluon kernel (config_for, WIDE_OVERLAP) vs this kernel's variants, all in the same run; CUDA graphs
#    over weight copies > L2, median us; after a CUDA error no later row is measured (`poisoned_by`).
# 5. OUT/summary.json: smoke per family and format (ok, rel_err, error), pytest counts per part, per row cuBLAS / best
#    existing wide / best w256 us and speedups.
# What to look for: tma_probe 4 ok, 2 / 1 "illegal instruction" (the cause confirmed); smoke all ok (rel_err ~3e-3);
# pytest parts without failures; best_w256.speedup >= 0.8 at M = 256 / 512 (vs best_wide.speedup, the existing
# kernel), >= 1.6 at M = 64; max_rel_diff_vs_wide ~1e-3 (a different split).
. "$(dirname "$0")/h200_check.sh"
W256_M=${W256_M:-256,512,64,128}
FAMILIES="w256 sk 2cta sk2cta"      # benchmarks/gemm_wide256_smoke.FAMILIES
pids=()
for f in $FAMILIES; do
    for fmt in nvfp4 mxfp4; do
        timeout 40 $PY benchmarks/gemm_wide256_smoke.py "$f" "$fmt" --out "$OUT/smoke_${f}_${fmt}.json" \
            > "$OUT/smoke_${f}_${fmt}.log" 2>&1 &
        pids+=($!)
    done
done
tma_probe() { timeout 20 $PY benchmarks/tma_alignment_probe.py "$1" --out "$OUT/tma_probe_$1.json" > "$OUT/tma_probe_$1.log" 2>&1; }
tma_probe 4 &
pids+=($!)
for p in "${pids[@]}"; do wait "$p"; done
# the probes expected to fault after the smokes, not beside them (a fault is its process's, but nothing is left to doubt)
tma_probe 2 & p2=$!
tma_probe 1 & p1=$!
wait $p2 $p1
passed=""
for f in $FAMILIES; do
    grep -q '"ok": true' "$OUT/smoke_${f}_nvfp4.json" 2>/dev/null && grep -q '"ok": true' "$OUT/smoke_${f}_mxfp4.json" \
        2>/dev/null && passed="$passed,$f"
done
passed=${passed#,}
echo "smoke passed: ${passed:-none} ($(( $(date +%s) - start )) s)"
pre_rc=-1
if [ -n "$passed" ]; then
    left=$(( 55 - ($(date +%s) - start) ))
    timeout $(( left > 10 ? left : 10 )) $PY benchmarks/gemm_wide256.py --precompile-only --M "$W256_M" --families "$passed" --out /dev/null \
        > "$OUT/precompile.log" 2>&1
    pre_rc=$?
fi
T=tests/kernels/test_fp4_gemm_wide256.py
part_args() {   # pytest's selection of part $1 (a family's GPU tests, or the CPU tests)
    case $1 in
        cpu) echo "-m not gpu" ;;
        w256) echo "-k wide256_matches or wide256_variants or wide256_issue" ;;
        sk) echo "-k stream_k_matches or stream_k_issue" ;;
        2cta) echo "-k two_ctas" ;;                 # both schedules: the 2cta and sk2cta families
    esac
}
left=$(( 85 - ($(date +%s) - start) ))
pids=()
for part in cpu w256 sk 2cta; do
    read -r opt sel <<< "$(part_args "$part")"
    ( timeout $(( left > 15 ? left : 15 )) $PY -m pytest -v -p no:cacheprovider -rs --junitxml="$OUT/pytest_$part.xml" \
        "$opt" "$sel" "$T" > "$OUT/pytest_$part.log" 2>&1; echo $? > "$OUT/pytest_$part.rc" ) &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
bench_rc=-1
if [ -n "$passed" ]; then
    left=$(( 114 - ($(date +%s) - start) ))
    timeout $(( left > 20 ? left : 20 )) $PY benchmarks/gemm_wide256.py --out "$OUT/gemm_wide256.json" \
        --M "$W256_M" --families "$passed" --budget-s $(( left > 30 ? left - 14 : 15 )) > "$OUT/gemm_wide256.log" 2>&1
    bench_rc=$?
fi
$PY - "$OUT" "$pre_rc" "$bench_rc" "$passed" $FAMILIES <<'PY'
import glob, json, os, re, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, pre_rc, bench_rc, passed, families = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5:]
s = {"smoke_passed": passed.split(",") if passed else [], "precompile_rc": pre_rc, "bench_rc": bench_rc, "smoke": {}}
for f in families:
    for fmt in ("nvfp4", "mxfp4"):
        p = os.path.join(out, f"smoke_{f}_{fmt}.json")
        if os.path.exists(p):
            r = json.load(open(p))
            s["smoke"][f"{f}_{fmt}"] = {k: r.get(k) for k in ("ok", "rel_err", "launch_s", "error") if k in r}
        else:
            s["smoke"][f"{f}_{fmt}"] = {"ok": False, "log_tail": tail(out, f"smoke_{f}_{fmt}.log", 4)}
s["tma_probe"] = {}   # innermost TMA coordinate (words) -> ok / the error: 4 ok, 2 and 1 expected to fault
for col in (4, 2, 1):
    p = os.path.join(out, f"tma_probe_{col}.json")
    s["tma_probe"][col] = ({k: v for k, v in json.load(open(p)).items() if k in ("ok", "error")} if os.path.exists(p)
                           else {"ok": False, "log_tail": tail(out, f"tma_probe_{col}.log", 3)})
pre = tail(out, "precompile.log", 1)
s["precompile_errors"] = pre[0][:1500] if pre and "'errors': []" not in pre[0] else []
s["pytest"] = {}
for p in sorted(glob.glob(os.path.join(out, "pytest_*.log"))):
    part = os.path.basename(p)[len("pytest_"):-len(".log")]
    text = open(p).read()
    last = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped|deselected)", l)][-1:]
    rc = open(p[:-4] + ".rc").read().strip() if os.path.exists(p[:-4] + ".rc") else None
    s["pytest"][part] = {"rc": rc, "result": last[0].strip("= ") if last else None,
                         "failed": re.findall(r"^(?:FAILED|ERROR) (\S+)", text, re.M)[:8]}
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
    s["poisoned_by"] = r.get("poisoned_by")
    s["skipped"] = len(r.get("skipped", []))
except Exception as e:   # noqa: BLE001
    s["bench_error"] = "not run: no family passed its smoke" if bench_rc == -1 else repr(e)
    s["bench_log_tail"] = tail(out, "gemm_wide256.log", 15)
write(out, s, 8000)
PY
