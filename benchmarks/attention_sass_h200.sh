#!/usr/bin/env bash
# benchmarks/attention_sass_h200.sh (issue 15, FP4-KV decode attention >= 0.75 of the read ceiling): the Gluon
# attention's SASS-reduction variants (compile-only breakdown: docs/benchmarks.md "Decode attention",
# trace_rl/kernels/sass_histogram.py): LEAN = GluonAttentionConfig(n_pad=8, unroll=2, col_max=True) (the MMA's N = 8
# for groups <= 8, two full tiles per loop iteration, the one-barrier column max; 2.78 against 3.08 SASS per element
# for nvfp4, 3.21 against 3.43 for mxfp4) and col_max alone. Usage: benchmarks/attention_sass_h200.sh OUT_DIR (from
# the repo root; python3, torch, Triton 3.6, one H200, device wheels on PYTHONPATH). < 120 s.
# 1. pytest tests/kernels/test_paged_attention_gluon.py -m gpu -k "sass_variants and g4 and (lean or colmax) and not
#    persistent-lean and not fold": nvfp4 LEAN and col_max, mxfp4 LEAN (exact), group 4 (5 of the benchmark's 8
#    compiles), and the persistent kernel with col_max (which ends its nvfp4 wgmma serialisation), each bit-identical
#    to the same format's default config (lengths with even and odd full-tile counts, tails, an empty sequence, live
#    NaN K / V scale blocks that stay NaN) and vs the float64 reference (groups 1 / 8 / 16, folded mxfp4, the parts
#    alone and the persistent LEAN stay in the file: -k sass_variants runs all 13) -> OUT/pytest.{log,xml}
# 2. benchmarks/attention_sass.py -> OUT/attention_sass.json (+ .log): Qwen3-8B heads, B = 32 x 8k, 313 x 8447,
#    256 x 8k, 32 x 32k, 313 x 257 (the budget drops the last first), nvfp4 (gluon, lean, colmax, lean_s2, persistent,
#    persistent_colmax) and mxfp4 (gluon, lean, fold, fold_lean) vs the best SDPA backend (cuDNN among them) over a contiguous bf16 cache, CUDA-graph
#    medians, fraction of the read ceiling measured in the same run, speedups, bit-identity vs the shipped config.
# 3. OUT/summary.json: rcs, pytest tail, per row the us / fractions / speedups / bit-identity.
# What to look for: lean / colmax / lean_s2 / fold_lean / persistent_colmax vs_base.bit_identical true in every row and speedup_vs_gluon > 1 at the 8k / 32k rows (bw_frac of
# lean against gluon's); then paged_attention_gluon.LEAN_LOOP = True makes LEAN (LEAN_WIDE for groups 9..16) the
# default of calls without a config (the engine's).
. "$(dirname "$0")/h200_check.sh"
run_pytest 55 -m gpu tests/kernels/test_paged_attention_gluon.py \
    -k "sass_variants and g4 and (lean or colmax) and not persistent-lean and not fold"
left=$(( 112 - ($(date +%s) - start) ))
timeout $(( left > 20 ? left : 20 )) $PY benchmarks/attention_sass.py --out "$OUT/attention_sass.json" \
    --budget-s $(( left > 30 ? left - 15 : 10 )) > "$OUT/attention_sass.log" 2>&1
bench_rc=$?
$PY - "$OUT" "$test_rc" "$bench_rc" <<'PY'
import json, os, sys
sys.path.insert(0, "benchmarks")
from h200_summary import tail, write
out, test_rc, bench_rc = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = {"pytest_rc": test_rc, "bench_rc": bench_rc, "pytest_tail": tail(out, "pytest.log", 14)}
try:
    r = json.load(open(os.path.join(out, "attention_sass.json")))
    s["read_TBps"] = r["ceilings"]["read_TBps"]
    s["elapsed_s"] = r.get("elapsed_s")
    keep = ("format", "batch", "context", "roofline_us", "sdpa_best", "sdpa_best_us", "cudnn_us", "sdpa_bw_frac",
            "error")
    variants = ("gluon", "lean", "colmax", "lean_s2", "persistent", "persistent_colmax", "fold", "fold_lean")
    s["rows"] = [{**{k: row[k] for k in keep if k in row},
                  **{n: {k: v for k, v in row[n].items() if k in ("us", "bw_frac", "speedup_vs_gluon", "speedup_vs_sdpa",
                                                                  "vs_base", "nan", "rel_err_vs_reference", "error")}
                     for n in variants if n in row}} for row in r["rows"]]
    s["skipped"] = r.get("skipped", [])
except Exception as e:   # noqa: BLE001
    s["bench_error"] = repr(e)
    s["bench_log_tail"] = tail(out, "attention_sass.log", 20)
write(out, s, 6000)
PY
