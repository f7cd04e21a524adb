#!/usr/bin/env bash
# benchmarks/moe512_h200.sh (check `moe512`; issue 15: the grouped MoE FP4 GEMM at >= 2.5x BF16 `torch._grouped_mm`,
# missed at 409-512 routed tokens: 2.0-2.5x): every Gluon grouped config that can take 25-32 rows per expert (shipped
# tiles 32 / 64 / 64x64 / 64x256 / 64o, the candidates of trace_rl/kernels/fp4_grouped_gluon_candidates.py: the
# balanced tile order, 3-CTA 64-row tiles, overlap) in one run. Usage (repo root; python3, torch, Triton 3.6, one
# H200, device wheels on PYTHONPATH), < 120 s:
#     benchmarks/moe512_h200.sh OUT_DIR
# 1. in parallel (nothing timed yet): the candidates' GPU tests (tests/kernels/test_fp4_grouped_gluon_candidates.py:
#    bit-identical to the shipped tile, torch reference, zero tail, bias, grid of 3; B = 512 at the real shape; 3
#    shards) -> OUT/pytest_{0,1,2}.{log,rc}; the compile gate of the grouped Gluon cases (SASS per weight element,
#    sm_90, this Triton) -> OUT/sass_gate.{json,log}; benchmarks/moe512.py --precompile-only, one process per
#    (format, config) -> OUT/precompile_*.log (Triton's disk cache; experts of 17 / 46 / 17 rows: one and two
#    32-row tiles); a config whose precompile did not run both GEMMs is left out of step 2 (--exclude; summary
#    `excluded`)
# 2. benchmarks/moe512.py -> OUT/moe512.json (+ .log): B = 409, 512, then 256 (the control), gate+up [1536 x 2048]
#    and down [2048 x 768], nvfp4 + mxfp4: cuBLAS loop (graph) and torch._grouped_mm vs the Triton grouped kernel, the
#    dispatch's pick (`shipped`) and every config: CUDA-graph medians, rel err vs the torch reference, bit_equal vs
#    the shipped tile, the tile-deal model; a budget skips the last rows ("skipped").
# 3. OUT/summary.json (benchmarks/moe512_summary.py): per point shipped vs best bit-identical config (us, x_bf16),
#    every config's us / x_bf16 / bit_equal / tiles_max / SASS per element, and `tile_rule`: per format the winner per
#    B (least gate_up + down, >= 3% over the shipped pick) and the TILE_RULE line they give (`line`, `changed`).
. "$(dirname "$0")/h200_check.sh"
i=0
for k in "bits_equal and nvfp4" "bits_equal and mxfp4" "moe_shape"; do    # 3 shards: each compiles its own configs
    ( timeout 60 $PY -m pytest -v -p no:cacheprovider -rs -m gpu -k "$k" \
        tests/kernels/test_fp4_grouped_gluon_candidates.py > "$OUT/pytest_$i.log" 2>&1
      echo $? > "$OUT/pytest_$i.rc" ) &
    i=$((i + 1))
done
( timeout 60 $PY -m trace_rl.kernels.sass_gate --only "grouped gluon" --json "$OUT/sass_gate.json" \
    > "$OUT/sass_gate.log" 2>&1; echo $? > "$OUT/sass_gate.rc" ) &
jobs=$($PY -c "import sys; sys.path.insert(0, 'benchmarks'); import moe512
print(' '.join(f'{f}:{c}' for f in ('nvfp4', 'mxfp4') for c in ['triton', *moe512.configs(f)]))")
for j in $jobs; do
    timeout 55 $PY benchmarks/moe512.py --precompile-only --fmts "${j%%:*}" --configs "${j#*:}" \
        > "$OUT/precompile_${j%%:*}_${j#*:}.log" 2>&1 &
done
wait
echo "precompiled ${jobs:-NOTHING (the config list failed)} in $(( $(date +%s) - start )) s"
# a Gluon config whose precompile did not run both GEMMs (failed, or hung into its timeout) stays out of the timed
# run: one hang there would stop every row after it (mxfp4's down projection is refused by the launcher: fine)
exclude=""
for j in $jobs; do
    f=${j%%:*}; c=${j#*:}; log="$OUT/precompile_${f}_$c.log"
    [ "$c" = triton ] && continue
    if ! grep -q "compiled gate_up" "$log" || ! grep -q -e "compiled down" -e "refused down" "$log"; then
        exclude="$exclude${exclude:+,}$j"
    fi
done
echo "excluded: ${exclude:-none}"
left=$(( 114 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/moe512.py --out "$OUT/moe512.json" --exclude "$exclude" \
    --budget-s $(( left > 40 ? left - 25 : 15 )) > "$OUT/moe512.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, bench_rc = sys.argv[1], int(sys.argv[2])
rc = lambda n: int(open(os.path.join(out, n)).read().strip() or 99) if os.path.exists(os.path.join(out, n)) else 99
s = {"bench_rc": bench_rc, "pytest_rc": max(rc(f"pytest_{i}.rc") for i in range(3)),
     "pytest_tails": [l for i in range(3) for l in tail(out, f"pytest_{i}.log", 3)],
     "sass_gate_rc": rc("sass_gate.rc"),
     "precompile_errors": [l for n in sorted(os.listdir(out)) if n.startswith("precompile_")
                           for l in tail(out, n, 30) if "FAILED" in l or "Traceback" in l][:8]}
try:
    from moe512_summary import summarize
    s.update(summarize(out))
except Exception as e:   # noqa: BLE001
    s["summary_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "moe512.log", 15)
write(out, s, 12000)
PY
