"""Issue 16's realistic RL workload on the WHOLE Qwen3-8B (all 36 layers; the earlier rows ran 2 of them): one
process per plan, each time-guarded, summary.json rewritten after each. Run by benchmarks/engine_realistic36_h200.sh
(check `real36`); usage: python benchmarks/engine_realistic36.py --out OUT [--budget-s 490] [--plans ...].

Per plan, in PLANS order (the FP4 plans, the claim, right after bf16): `python -m trace_rl bench rollout --parts
realistic` with 32 prompts x 8 samples, 256 prompt tokens, log-normal lengths (median 1500, sigma 1) in [16, 8192]
ended by stop tokens, up to 512 slots, and the plan's SPECS: w4a4-kv4 with the Gluon nvfp4-KV attention and the bf16
operand cache, w4a4-kv4-mx with the FP8 operand cache (both cached runs only: `--realistic-uncached 0`); the cache is
attached before the page pool is sized from free memory. One process each: a plan's memory (weights, cache, pool,
graphs) is gone before the next is built, and one crash loses one plan. Its rows -> OUT/<plan>/rollout.json, its log
-> OUT/<plan>.log.

Time: the bench's own guard (`--realistic-deadline`, trace_rl/bench/realistic_guard.py) probes each built engine and
skips a run whose estimate does not fit before the deadline (start + budget - SUMMARY_S); a plan is not started with
less than `--min-plan-s` left (a Qwen3-8B build and probe); a process still running at the deadline is killed.

summary.json (`summarize`): `headline` (tokens/s per plan, the FP4 plans' ratio over bf16, `ok`), `not_measured`
(plans not measured and why: empty for a good run), `all_layers` (every run had all of the model's layers),
`lengths_honoured` (every run generated exactly its drawn lengths, and all drew the same ones), `runs[]` (per run:
tokens/s, `wall_s` = the run's measured seconds against the guard's `estimate_s`, pool, cache, preemptions, ...).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from engine_remaining_summary import _report as _read_json
from engine_remaining_summary import _tail as _log_tail
from h200_summary import write

PLANS = ("bf16", "w4a4-kv4", "w4a4-kv4-mx", "fp8", "w4a16")
FP4 = ("w4a4-kv4", "w4a4-kv4-mx")
SPECS = {   # each plan's bench arguments beyond the workload's
    "w4a4-kv4": ["--engine-attention", "w4a4-kv4=gluon", "--realistic-operand-cache", "w4a4-kv4",
                 "--realistic-uncached", "0"],
    "w4a4-kv4-mx": ["--realistic-operand-cache", "w4a4-kv4-mx=fp8", "--realistic-uncached", "0"],
}
SUMMARY_S = 5.0       # kept after the deadline for the last summary
RUN_KEYS = ("layers", "full_layers", "rows", "tokens", "tokens_per_s", "tokens_per_s_with_capture", "graph_capture_s",
            "estimate_s", "operand_cache_kind", "operand_cache_GB", "kv_pool_GB", "num_pages", "peak_pages",
            "page_size", "preemptions", "mean_decode_batch", "decode_steps", "prefill_tokens", "shared_prompt_pages",
            "attention_requested", "attention_forced", "attention_refused", "attention_used", "lengths")


def parse_args(argv=None) -> argparse.Namespace:
    a = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    a.add_argument("--out", required=True)
    a.add_argument("--budget-s", type=float, default=490.0, help="seconds for every plan and the summary")
    a.add_argument("--plans", default=",".join(PLANS))
    a.add_argument("--model", default="qwen3-8b")
    a.add_argument("--layers", type=int, default=0, help="0: all the model's layers (the point of this check)")
    a.add_argument("--prompts", type=int, default=32)
    a.add_argument("--group", type=int, default=8)
    a.add_argument("--min-plan-s", type=float, default=60.0, help="a plan is not started with less left")
    a.add_argument("--bench-args", default="", help="more `bench rollout` arguments (last wins; tests: tiny on CPU)")
    a.add_argument("--python", default=sys.executable)
    args = a.parse_args(argv)
    unknown = [p for p in args.plans.split(",") if p and p not in PLANS]
    if unknown:
        a.error(f"--plans: {unknown} not among {', '.join(PLANS)}")
    return args


def plan_command(args, plan: str, deadline: float) -> list[str]:
    return [args.python, "-m", "trace_rl", "bench", "rollout", "--parts", "realistic", "--models", args.model,
            "--realistic-plans", plan, "--realistic-prompts", str(args.prompts), "--group", str(args.group),
            "--prompt-len", "256", "--realistic-max", "8192", "--realistic-median", "1500", "--realistic-sigma", "1",
            "--realistic-layers", str(args.layers), "--realistic-max-batch", "512",
            "--realistic-deadline", f"{deadline:.1f}", *SPECS.get(plan, []), *args.bench_args.split(),
            "--out", os.path.join(args.out, plan)]


def run_plans(args, runner=subprocess.run, clock=time.time) -> dict:
    """Each plan in its own process, the summary rewritten after each; {plan: meta} (rc, process_s, not_started)."""
    start = clock()
    deadline = start + args.budget_s - SUMMARY_S
    plans = [p for p in args.plans.split(",") if p]
    metas: dict[str, dict] = {}
    os.makedirs(args.out, exist_ok=True)
    for plan in plans:
        left = deadline - clock()
        if left < args.min_plan_s:
            metas[plan] = {"not_started": f"{left:.0f} s left before the deadline, < --min-plan-s {args.min_plan_s:.0f}"
                                          f" (a build and probe)"}
        else:
            t = clock()
            with open(os.path.join(args.out, f"{plan}.log"), "w") as log:
                try:
                    rc = runner(plan_command(args, plan, deadline), stdout=log, stderr=subprocess.STDOUT,
                                timeout=max(left, 1.0)).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            metas[plan] = {"rc": rc, "process_s": clock() - t, "timed_out": rc == 124}
        write(args.out, summarize(args.out, plans, metas, args), 600)     # the headline into driver.log
    return metas


def _report(out: str, plan: str) -> dict | None:
    return _read_json(os.path.join(out, plan, "rollout.json"))


def _tail(out: str, plan: str, n: int = 6) -> list[str]:
    return _log_tail(os.path.join(out, f"{plan}.log"), n)


def summarize(out: str, plans: list[str], metas: dict, args=None) -> dict:
    runs, not_measured, errors, requested, tails = [], [], [], None, {}
    for plan in plans:
        meta = metas.get(plan)
        if meta is None:
            not_measured.append({"plan": plan, "why": "not run yet"})
            continue
        if "not_started" in meta:
            not_measured.append({"plan": plan, "why": f"not started: {meta['not_started']}"})
            continue
        rep = _report(out, plan) or {}
        errors += [{"plan": plan, **e} for e in rep.get("errors", [])]
        a = rep.get("args") or {}
        requested = requested or ({k: a.get(f"realistic_{k}") for k in ("median", "sigma", "max")} if a else None)
        rows = rep.get("realistic", [])
        for r in rows:
            run = {"plan": r["plan"], "wall_s": r["seconds"], **{k: r.get(k) for k in RUN_KEYS},
                   "probe_s": (r.get("estimate") or {}).get("probe_s"), "process_s": meta.get("process_s")}
            run["wall_vs_estimate"] = run["wall_s"] / run["estimate_s"] if run.get("estimate_s") else None
            runs.append(run)
        if rows:
            continue
        skipped = rep.get("realistic_skipped", [])
        if skipped:
            why = f"time guard: {skipped[0]['skipped']}"
        elif meta.get("timed_out"):
            why = f"killed at the deadline after {meta['process_s']:.0f} s (log tail in log_tail)"
        elif rep.get("errors"):
            why = f"failed: {rep['errors'][0]['error'][:300]}"
        else:
            why = f"no row (rc {meta.get('rc')}; log tail in log_tail)"
        not_measured.append({"plan": plan, "why": why, "estimate_s": skipped[0].get("estimate_s") if skipped else None})
        tails[plan] = _tail(out, plan)
    bf16 = next((r for r in runs if r["plan"] == "bf16"), None)
    for r in runs:
        r["vs_bf16"] = r["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else None
    all_layers = bool(runs) and all(r["layers"] == r["full_layers"] for r in runs)
    lengths = [r.get("lengths") or {} for r in runs]
    same_draw = len({x.get("drawn_mean") for x in lengths}) == 1       # every plan ran the same samples
    honoured = bool(runs) and all(x.get("honoured") for x in lengths) and same_draw
    fp4 = {r["plan"]: r["vs_bf16"] for r in runs if r["plan"] in FP4}
    ok = not not_measured and not errors and all_layers and honoured
    headline = {"ok": ok, "tokens_per_s": {r["plan"]: r["tokens_per_s"] for r in runs},
                "fp4_vs_bf16": fp4, "fp4_faster_than_bf16": {p: v > 1 for p, v in fp4.items() if v is not None}}
    # the first 3000 characters are what h200_session_checks.sh prints: the verdict before the per-run detail
    s = {"headline": headline, "all_layers": all_layers, "lengths_honoured": honoured, "not_measured": not_measured,
         "look_at": ("ok true = every plan measured on all layers with every drawn length met; then fp4_vs_bf16 "
                     "(w4a4-kv4 = Gluon attention + bf16 operand cache, w4a4-kv4-mx = FP8 operand cache) is the "
                     "36-layer realistic-workload ratio for docs/benchmarks.md 'Realistic RL workload'; "
                     "runs[].wall_vs_estimate near 1 says the time guard's model holds; not_measured says why a "
                     "plan is missing"),
         "runs": runs, "lengths": {**(lengths[0] if lengths else {}), "requested": requested}, "errors": errors,
         "workload": None if args is None else {"model": args.model, "layers": args.layers or "all",
                                                "prompts": args.prompts, "group": args.group,
                                                "budget_s": args.budget_s, "bench_args": args.bench_args},
         "process": metas, "log_tail": tails}
    return s


def main(argv=None) -> dict:
    args = parse_args(argv)
    metas = run_plans(args)
    s = summarize(args.out, [p for p in args.plans.split(",") if p], metas, args)
    write(args.out, s, 6000)
    return s


if __name__ == "__main__":
    main()
