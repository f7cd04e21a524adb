#!/usr/bin/env bash
# Issue 16's realistic RL workload on the WHOLE Qwen3-8B shape (all 36 layers, random weights; the earlier rows in
# docs/benchmarks.md "Realistic RL workload" ran 2 of them), with the FP4 plans' operand cache. Usage:
# benchmarks/engine_realistic36_h200.sh OUT_DIR (from the repo root; python3, torch, Triton 3.6, one H200, device
# wheels on PYTHONPATH).
# NOT a < 120 s check: ONE WHOLE DEVICE CALL, alone (BUDGET_S = 490 s by default; run it with timeout_s 600).
# Registered in benchmarks/h200_session_checks.sh as `real36` (named only: `... h200_session_checks.sh OUT real36`).
# benchmarks/engine_realistic36.py runs one `trace-rl bench rollout --parts realistic` process per plan (memory
# isolation): 32 prompts x 8 samples, 256 prompt tokens, log-normal lengths (median 1500, sigma 1) in [16, 8192] with
# stop tokens, up to 512 slots; plans bf16, w4a4-kv4 (Gluon attention + bf16 operand cache), w4a4-kv4-mx (FP8 operand
# cache), fp8, w4a16 (FP4 first: the headline ratio). Each run is time-guarded (`--realistic-deadline`: a probe of the
# built engine estimates the run; one that would not end before the deadline is skipped, with why). Budget (a model of
# the H200's step, not measured yet): per plan ~15-30 s of process start, build and probe, then the run: ~8191 decode
# steps (the longest sample) at 3-6 ms + the KV read (1.2 G token-reads: ~70 s bf16, ~20 s nvfp4): ~50-130 s.
# OUT/summary.json after each plan: headline (tokens/s, FP4 / bf16, ok), not_measured (empty for a good run),
# all_layers, lengths_honoured, runs[] (wall_s vs estimate_s). Env: PLANS MODEL PROMPTS LAYERS BENCH_ARGS (more
# `bench rollout` args, last wins: the CPU test runs tiny this way).
. "$(dirname "$0")/h200_check.sh"
BUDGET_S=${BUDGET_S:-490}
$PY benchmarks/engine_realistic36.py --out "$OUT" --budget-s "$(( BUDGET_S - ($(date +%s) - start) ))" \
    --plans "${PLANS:-bf16,w4a4-kv4,w4a4-kv4-mx,fp8,w4a16}" --model "${MODEL:-qwen3-8b}" --prompts "${PROMPTS:-32}" \
    --layers "${LAYERS:-0}" --bench-args "${BENCH_ARGS:-}" ${DRIVER_ARGS:-} > "$OUT/driver.log" 2>&1
echo "driver rc $? after $(( $(date +%s) - start )) s"
head -c 3000 "$OUT/summary.json"; echo
echo "total $(( $(date +%s) - start )) s"
