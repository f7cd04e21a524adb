#!/usr/bin/env bash
# Issue 16's two missing rollout-engine measurements (docs/benchmarks.md "Native engine against HF `generate`" and
# "Realistic RL workload"). Usage: benchmarks/engine_remaining_h200.sh OUT_DIR (from the repo root; python3, torch,
# Triton 3.6, transformers, one H200, device wheels on PYTHONPATH).
# NOT a < 120 s check: ONE WHOLE DEVICE CALL (expected ~330-420 s, capped at BUDGET_S = 530 s; run it with timeout_s
# 600). Registered in benchmarks/h200_session_checks.sh as `engremain` (named only, never in the default order);
# standalone: `bash benchmarks/engine_remaining_h200.sh "$OUT"`.
# 1. `--parts hf` (trace_rl/bench/hf.py), Qwen3-1.7B shape (28 layers, random weights), bf16, 16 prompts x 256
#    tokens, 1024 sampled tokens each (stops ignored): the native engine warmed up, then timed for 1024 and for 1
#    new token; HF generate (SDPA, dynamic cache) stopped after HF_LIMIT_S = 120 s (--hf-time-limit); then the native
#    engine timed again for the tokens HF reached. The claim: native / HF decode tokens/s over the same tokens 2..n
#    (`native_vs_hf_decode_same_tokens`; definitions in the row's `rate_definitions`). Budget: the native side
#    took 18 s from the bench's start in run 3 (rollout_engine_h200_run3.log); + HF build and warm-up, 120 s of HF,
#    the native re-run (<= 3 s): ~160 s, capped at HF_CAP_S = 220 s. Log -> OUT/hf.log, rows -> OUT/hf/rollout.json.
# 2. `--parts realistic` (workloads.realistic_workload), Qwen3-8B shape cut to REAL_LAYERS = 2 of its 36 layers (the
#    page pool scaled to the whole model's token capacity beside its weights), 64 prompts x 8 samples, 256 prompt
#    tokens, log-normal lengths (median 1500, sigma 1) in [16, 8192] with stop tokens, up to 512 slots, plans in the
#    order bf16, w4a4-kv4, w4a16, fp8 (the two that make the claim first); each row is written to
#    OUT/realistic/rollout.json when its plan finishes, so a run cut by the budget keeps the plans done. Budget:
#    run 2's 16-prompt rows took 10-16 s each (+ build); 4x the samples at a mean batch ~145 instead of 49 and ~4x
#    the KV read: ~30-50 s per plan, ~150-200 s for four. Log -> OUT/realistic.log.
# 3. OUT/summary.json: each bench's rc; HF: the ratio, hf_truncated, tokens reached, seconds, both rates, issue 16's
#    bar (>= 20x); realistic per plan: tokens/s (captures excluded and included), vs bf16, preemptions, prompt pages
#    shared, mean decode batch, lengths honoured, pool, attention run (benchmarks/engine_remaining_summary.py).
# Env (defaults above): HF_MODEL HF_NEW HF_LIMIT_S HF_CAP_S HF_ARGS (more hf args, last wins), REAL_MODEL REAL_PLANS
# REAL_PROMPTS REAL_LAYERS BENCH_ARGS (more realistic args); the CPU test runs it on the tiny preset this way.
. "$(dirname "$0")/h200_check.sh"
BUDGET_S=${BUDGET_S:-530}
left() { local l=$(( BUDGET_S - 20 - ($(date +%s) - start) )); echo $(( l > 10 ? l : 10 )); }   # timeout 0: none
hf_t=$(left); hf_t=$(( hf_t < ${HF_CAP_S:-220} ? hf_t : ${HF_CAP_S:-220} ))
timeout "$hf_t" $PY -m trace_rl bench rollout --parts hf --models "${HF_MODEL:-qwen3-1.7b}" --hf-batch 16 \
    --prompt-len 256 --hf-new-tokens "${HF_NEW:-1024}" --hf-time-limit "${HF_LIMIT_S:-120}" ${HF_ARGS:-} \
    --out "$OUT/hf" > "$OUT/hf.log" 2>&1
hf_rc=$?
echo "hf rc $hf_rc after $(( $(date +%s) - start )) s"
timeout "$(left)" $PY -m trace_rl bench rollout --parts realistic --models "${REAL_MODEL:-qwen3-8b}" \
    --realistic-plans "${REAL_PLANS:-bf16,w4a4-kv4,w4a16,fp8}" --realistic-prompts "${REAL_PROMPTS:-64}" --group 8 \
    --prompt-len 256 --realistic-layers "${REAL_LAYERS:-2}" --realistic-max-batch 512 ${BENCH_ARGS:-} \
    --out "$OUT/realistic" > "$OUT/realistic.log" 2>&1
real_rc=$?
echo "realistic rc $real_rc after $(( $(date +%s) - start )) s"
$PY benchmarks/engine_remaining_summary.py "$OUT" "$hf_rc" "$real_rc"
echo "total $(( $(date +%s) - start )) s"
