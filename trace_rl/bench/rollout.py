"""`trace-rl bench rollout`: the native engine's decode step and RL rollout throughput per precision plan,
against the plain PyTorch decode step, the read-bandwidth roofline and transformers' `generate`.

Parts (`--parts`, each written to rollout.json as soon as it finishes, one failure never hides the rest):
- `grid`: the bf16 engine's decode step against the plain PyTorch step (eager and `torch.compile`d, the
  fastest SDPA backend each) at every (B, context) of `--grid` (`trace_rl.bench.decode_grid`);
- `profile`: GPU time per op class of one decode step per plan and context (`trace_rl.bench.profile`);
- `fixed`: tokens/s on fixed-length responses with memory filled, per plan (`workloads.fixed_workload`);
- `realistic`: tokens/s on long-tailed response lengths with stop tokens, GRPO groups sharing prompt
  pages, the page pool (`workloads.realistic_workload`);
- `hf`: HF `generate` against the native engine on the same workload, decode rates over the same tokens, HF
  optionally stopped after `--hf-time-limit` s (`trace_rl.bench.hf`);
- `steps` (not run by default): the decode step per plan and decode-attention choice at fixed (B, context) cells,
  e.g. attention forced to the Triton vs the Gluon kernel (`trace_rl.bench.steps`).
`--engine-attention` forces the decode attention of the fixed and realistic parts' engines, per plan where wanted
(`trace_rl.bench.engine_attention`; default auto; rows and summary lines say what was asked and what ran). The
fixed workload's step rows also carry `attention_times`: ms per layer call of the engine's candidates and of the
Gluon path where the cache can take it (`steps.attention_times`). `--operand-cache` repeats fixed-workload runs of FP4
plans with the engine's persistent operand cache (`trace_rl.bench.operand_cache`); `--realistic-operand-cache` and
`--realistic-uncached` do the same for the realistic workload, and `--realistic-deadline` guards each of its runs'
time (`trace_rl.bench.realistic_guard`).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from trace_rl.bench import measure as bm
from trace_rl.bench.measure import build_rollout_model, free  # noqa: F401  (used by the parts)

PLANS = ("bf16", "fp8", "w4a16", "w4a4-kv4", "w4a4-kv4-mx")
PARTS = ("grid", "profile", "fixed", "realistic", "hf")
EXTRA_PARTS = ("steps",)     # valid in --parts, not run unless named
ROW_KEYS = ("model", "plan", "batch", "attention")   # name a failed steps row under "errors"
MEASURED = ("grid", "profile", "results", "realistic", "hf")  # report keys whose every row counts as measured


def add_rollout_bench_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    a = parser.add_argument
    a("--parts", default=",".join(PARTS), help=f"comma-separated parts to run (default: {','.join(PARTS)})")
    a("--models", default="qwen3-8b", help="comma-separated model presets (qwen3-1.7b, qwen3-8b, tiny)")
    a("--layers", type=int, default=0, help="run only the first N layers of each model (0: all)")
    a("--grid", default="1:257,4352,8447;100:257,4352,8447;512:257,768,1536",
      help="decode grid 'B:L1,L2;B2:...' for the engine vs plain PyTorch comparison")
    a("--sdpa-backends", default="default,cudnn,efficient,flash", help="SDPA backends the plain step tries")
    a("--baseline-variants", default="eager,compiled",
      help="plain-step variants timed (eager, compiled = torch.compile'd layer functions); the fastest is the baseline")
    a("--plans", default=",".join(PLANS), help=f"plans of the fixed workload (default: {','.join(PLANS)})")
    a("--fixed-baseline", type=int, default=1, help="1: the fixed workload's bf16 run also times the plain "
      "PyTorch step (--baseline-variants) at its batch and contexts; 0: skip")
    a("--prompts", type=int, default=64, help="N prompts")
    a("--group", type=int, default=8, help="G samples per prompt")
    a("--prompt-len", type=int, default=256, help="tokens per prompt")
    a("--response-lens", default="8192", help="comma-separated response lengths of the fixed workload")
    a("--max-batch", type=int, default=0, help="cap on concurrent sequences (0: what fits in memory)")
    a("--block-size", type=int, default=0, help="KV page size in tokens (0: the format's default)")
    a("--iters", type=int, default=10, help="timed repetitions per measurement")
    a("--e2e-tokens", type=int, default=16, help="response length of the end-to-end check")
    a("--prefill-tokens", type=int, default=8192, help="prompt tokens per prefill chunk")
    a("--profile-plans", default="bf16,w4a4-kv4", help="plans profiled")
    a("--profile-batch", type=int, default=100, help="batch of the profiled step")
    a("--profile-lens", default="257,8447", help="contexts of the profiled step")
    a("--realistic-plans", default="bf16,fp8,w4a16,w4a4-kv4", help="plans of the realistic workload")
    a("--realistic-prompts", type=int, default=64, help="prompts of the realistic workload (G samples each)")
    a("--realistic-max", type=int, default=8192, help="longest response of the realistic workload")
    a("--realistic-median", type=float, default=1500.0, help="median drawn response length")
    a("--realistic-sigma", type=float, default=1.0, help="log-normal sigma of the response lengths")
    a("--realistic-layers", type=int, default=0, help="layers run in the realistic workload (0: all; fewer "
      "layers keep the shapes and scale the KV pool to the whole model's token capacity)")
    a("--realistic-max-batch", type=int, default=512, help="slots of the realistic workload's engine")
    a("--realistic-operand-cache", default="",
      help="realistic workload: PLAN, PLAN=CHOICE, PLAN=fp8 or PLAN=CHOICE:fp8 entries (the syntax of "
           "--operand-cache, plans of --realistic-plans) that run with the engine's operand cache, attached before the "
           "page pool is sized from free memory (rows record operand_cache, operand_cache_kind, operand_cache_GB)")
    a("--realistic-uncached", type=int, default=1,
      help="1: each plan --realistic-operand-cache names also runs without the cache (first); 0: only with it")
    a("--realistic-deadline", type=float, default=0.0,
      help="realistic workload's time guard: a Unix time (seconds) by which each plan's run must end; each plan is "
           "probed after its engine is built (a few short steps, trace_rl/bench/realistic_guard.py), its run's time "
           "estimated, and the run skipped (under \"realistic_skipped\", with why) when it would end later; "
           "0: no guard")
    a("--hf-batch", type=int, default=64, help="sequences in the HF comparison")
    a("--hf-new-tokens", type=int, default=64, help="response length of the HF comparison")
    a("--hf-model", default="", help="model preset of the HF comparison (default: each of --models)")
    a("--hf-layers", type=int, default=0, help="layers of the HF comparison's model (0: all)")
    a("--hf-time-limit", type=float, default=0.0,
      help="stop HF generate after this many seconds (0: never); the row says hf_truncated and the tokens reached, "
           "and the native engine is timed over the same tokens")
    a("--engine-attention", default="auto",
      help="decode attention of the fixed and realistic parts' engines: CHOICE (every plan) and/or PLAN=CHOICE "
           "entries, comma-separated; a plan named twice runs once per choice (e.g. w4a4-kv4=kernels,w4a4-kv4=gluon). "
           "A choice a plan's cache or this machine cannot take runs on auto, said in its row (attention_refused)")
    a("--operand-cache", default="",
      help="fixed workload: PLAN (each of its attention choices) and/or PLAN=CHOICE entries, comma-separated, that run "
           "once more with the engine's persistent operand cache (FP4 plans; +2 bytes per weight element, allocated "
           "before B is fitted; rows record operand_cache, operand_cache_kind, operand_cache_GB, batch); PLAN=fp8 or "
           "PLAN=CHOICE:fp8: the FP8 operand cache instead (mxfp4 W4A4 plans, 1 byte per element)")
    a("--step-plans", default="w4a4-kv4,bf16", help="plans of the steps part")
    a("--step-attention", default="kernels,gluon,auto",
      help="decode-attention choices of the steps part, each forced per plan (auto: the engine's timed choice); one "
           "a plan's cache or this machine cannot take is recorded as skipped")
    a("--step-grid", default="100:8447;256:8447", help="cells 'B:L1,L2;B2:...' of the steps part")
    a("--reserve-gb", type=float, default=6.0, help="GPU memory kept free beside weights and KV cache")
    a("--device", default=None, help="cuda (default when present) or cpu")
    a("--out", default="runs/bench_rollout", help="folder for rollout.json and rollout.png")
    a("--seed", type=int, default=0, help="seed of weights, caches and prompts")
    return parser


def run_rollout_bench(args) -> dict:
    """Run the bench described by `args` (see `add_rollout_bench_args`); writes JSON + PNG, returns the dict."""
    from trace_rl.bench.decode_grid import parse_grid, run_grid
    from trace_rl.bench.hf import hf_vs_native
    from trace_rl.bench.profile import run_profiles
    from trace_rl.bench.workloads import fixed_workload, realistic_workload

    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS) - set(EXTRA_PARTS))
    if unknown:
        raise ValueError(f"--parts: unknown {unknown}; choose from {', '.join(PARTS + EXTRA_PARTS)}")
    parse_grid(args.grid)
    from trace_rl.kv.cache import ATTENTION_CHOICES

    if "steps" in parts:
        parse_grid(args.step_grid)
        bad = sorted(set(filter(None, args.step_attention.split(","))) - set(ATTENTION_CHOICES))
        if bad or not args.step_attention.strip(","):
            raise ValueError(f"--step-attention: {bad or args.step_attention!r}; choose from "
                             f"{', '.join(ATTENTION_CHOICES)}")
    from trace_rl.bench import engine_attention

    known = tuple(dict.fromkeys(p for p in f"{args.plans},{args.realistic_plans}".split(",") if p))
    attention = engine_attention.parse(args.engine_attention, known)
    from trace_rl.bench import operand_cache

    oc = operand_cache.parse(args.operand_cache, tuple(p for p in args.plans.split(",") if p),
                             lambda plan: engine_attention.choices_for(attention, plan))
    real_oc = operand_cache.parse(args.realistic_operand_cache, tuple(p for p in args.realistic_plans.split(",") if p),
                                  lambda plan: engine_attention.choices_for(attention, plan),
                                  flag=operand_cache.REALISTIC_FLAG, plans_flag="--realistic-plans")
    real_uncached = operand_cache.parse_uncached(args.realistic_uncached, real_oc)
    from trace_rl.bench.baseline import VARIANTS

    variants = [v for v in args.baseline_variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        raise ValueError(f"--baseline-variants: {args.baseline_variants!r} is not a list of {', '.join(VARIANTS)}")
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    bw = bm.bandwidth_ceilings(device)
    report = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
              "torch": torch.__version__, "read_bandwidth_TBps": (bw["read"] or 0) / 1e12,
              "copy_bandwidth_TBps": (bw["copy"] or 0) / 1e12,
              "args": {k: v for k, v in vars(args).items() if not callable(v)},
              "grid": [], "profile": [], "results": [], "realistic": [], "realistic_skipped": [], "hf": [],
              "steps": [], "errors": [], "log": []}
    t0 = time.perf_counter()

    def log(line: str) -> None:
        line = f"[{time.perf_counter() - t0:7.1f}s] {line}"
        print(line, flush=True)
        report["log"].append(line)

    def attempt(what: str, fn, key: str, many: bool = False) -> None:
        try:
            value = fn()
            report[key].extend(value) if many else report[key].append(value)
        except Exception as err:             # one failing part must not hide the others
            report["errors"].append({"part": what, "error": f"{type(err).__name__}: {err}"})
            log(f"FAILED {what}: {type(err).__name__}: {err}")
            free()
        _write(report, out_dir)

    def sink(part: str):
        """A row of `part` goes into the report, written at once (a cut run keeps what it measured). A steps row
        that failed (`error`: run_steps catches one engine's failure to keep the others) also goes under "errors",
        so that the CLI exits 1 on it (a grid row's error stays in its row, as it always did)."""
        def add(row: dict) -> None:
            report[part].append(row)
            if part == "steps" and "error" in row:
                report["errors"].append({"part": "steps " + " ".join(f"{k}={row[k]}" for k in ROW_KEYS if k in row),
                                         "error": row["error"]})
            _write(report, out_dir)
        return add

    for name in filter(None, args.models.split(",")):
        if "grid" in parts:
            attempt(f"grid {name}", lambda n=name: run_grid(args, n, device, bw, log, sink=sink("grid")) and [],
                    "grid", many=True)
        if "steps" in parts:
            from trace_rl.bench.steps import run_steps

            attempt(f"steps {name}", lambda n=name: run_steps(args, n, device, bw, log, sink=sink("steps")) and [],
                    "steps", many=True)
        if "fixed" in parts:
            for r in [int(x) for x in args.response_lens.split(",") if x]:
                for plan in filter(None, args.plans.split(",")):
                    for choice in engine_attention.choices_for(attention, plan):
                        for cached in operand_cache.runs_for(oc, plan, choice):
                            attempt(f"fixed {name} {plan} R={r} attention={choice}" + operand_cache.label(cached),
                                    lambda n=name, p=plan, r=r, c=choice, o=cached: fixed_workload(
                                        args, n, p, r, device, bw, log, c, o), "results")
        if "profile" in parts:
            attempt(f"profile {name}", lambda n=name: run_profiles(args, n, device, log), "profile", many=True)
        if "realistic" in parts:
            for plan in filter(None, args.realistic_plans.split(",")):
                for choice in engine_attention.choices_for(attention, plan):
                    for cached in operand_cache.runs_for(real_oc, plan, choice, real_uncached):
                        attempt(f"realistic {name} {plan} attention={choice}" + operand_cache.label(cached),
                                lambda n=name, p=plan, c=choice, o=cached: _realistic_row(
                                    realistic_workload(args, n, p, device, log, c, o), report), "realistic", many=True)
        if "hf" in parts and args.hf_batch:
            attempt(f"hf {name}", lambda n=name: hf_vs_native(args, n, device, log), "hf")
    report["summary"] = summary(report)
    _write(report, out_dir)
    try:
        _plot(report, out_dir / "rollout.png")
    except Exception as err:                 # a plot is not worth losing the numbers for
        report["errors"].append({"part": "plot", "error": f"{type(err).__name__}: {err}"})
    for line in report["summary"]:
        print("summary:", json.dumps(line))
    for e in report["errors"]:
        print("error:", json.dumps(e))
    return report


def _realistic_row(row: dict, report: dict) -> list[dict]:
    """A realistic run's row as a list for `attempt` (many=True): [] when the time guard skipped it (its row goes
    under "realistic_skipped", which is no measurement)."""
    if "skipped" in row:
        report["realistic_skipped"].append(row)
        return []
    return [row]


def unmeasured(report: dict) -> str:
    """Why the run measured nothing ("" when it measured something; the CLI then exits 1 with this). A steps row
    counts when it has step times: a skipped one (a choice the cache or machine cannot take, a batch that does not
    fit beside the weights) is no measurement, but does not hide the rows that are. A row of another part counts
    unless it is a failure (`error`: run_profiles and the grid catch one engine's failure into its row), so that a
    run whose every profile failed does not exit 0."""
    steps = report.get("steps", [])
    if any("error" not in r for k in MEASURED for r in report.get(k, [])) or any("step_ms" in r for r in steps):
        return ""
    failed = [r for k in MEASURED for r in report.get(k, []) if "error" in r]
    if failed:
        return (f"nothing was measured: every row failed ({len(failed)}, \"error\" in their rows; e.g. "
                f"{failed[0]['error']})")
    guarded = report.get("realistic_skipped", [])
    if guarded:
        return (f"nothing was measured: the time guard skipped every realistic run ({len(guarded)}, under "
                f"\"realistic_skipped\"; e.g. {guarded[0]['plan']}: {guarded[0]['skipped']})")
    skipped = [r for r in steps if "skipped" in r]
    if skipped:
        return (f"nothing was measured: every steps cell was skipped ({len(skipped)}, \"skipped\" in their rows; "
                f"e.g. B={skipped[0].get('batch')} {skipped[0].get('attention')}: {skipped[0]['skipped']})")
    return "nothing was measured (no model, part, plan or length selected)"


def _write(report: dict, out_dir: Path) -> None:
    (out_dir / "rollout.json").write_text(json.dumps(report, indent=1, default=str))


def _best(results, **match):
    rows = [x for x in results if all(x.get(k) == v for k, v in match.items())]
    return max(rows, key=lambda x: x["tokens_per_s"]) if rows else None


def summary(report: dict) -> list[dict]:
    lines = []
    ratios = [g["ratio"] for g in report["grid"] if "ratio" in g]
    if ratios:
        lines.append({"bf16_engine_vs_plain_min": min(ratios), "max": max(ratios),
                      "per_shape": {f"B{g['batch']}/L{g['L']}": f"{g['ratio']:.3f} vs {g['baseline_variant']}"
                                    for g in report["grid"] if "ratio" in g},
                      "baseline_compile_s": {f"B{g['batch']}": g["baseline_compile_s"] for g in report["grid"]
                                             if g.get("baseline_compile_s") is not None}})
    attention = ("attention_requested", "attention_forced", "attention_refused", "attention_used")
    for r in sorted({(x["model"], x["response_len"]) for x in report["results"]}):
        bf16 = _best(report["results"], model=r[0], response_len=r[1], plan="bf16")
        for plan in ("w4a4-kv4", "w4a4-kv4-mx", "fp8", "w4a16"):
            # one line per run of the plan (several when --engine-attention names it with several choices)
            for other in [x for x in report["results"] if bf16 and (x["model"], x["response_len"], x["plan"])
                          == (*r, plan)]:
                plain = bf16.get("plain_baseline")
                lines.append({"model": r[0], "response_len": r[1], "plan": plan,
                              "vs_bf16_tokens_per_s": other["tokens_per_s"] / bf16["tokens_per_s"],
                              "vs_plain_step_decode_tokens_per_s": other["tokens_per_s"] / plain["decode_tokens_per_s"]
                              if plain else None,
                              "tokens_per_s": other["tokens_per_s"], **{k: other.get(k) for k in attention},
                              "batch": other.get("batch"), "operand_cache": other.get("operand_cache", False),
                              "operand_cache_kind": other.get("operand_cache_kind"),
                              "operand_cache_GB": other.get("operand_cache_GB", 0.0),
                              "bf16_attention_used": bf16.get("attention_used")})
    bf16 = next((x for x in report["realistic"] if x["plan"] == "bf16"), None)
    for x in report["realistic"]:
        lines.append({"realistic": x["plan"], "tokens_per_s": x["tokens_per_s"],
                      "vs_bf16": x["tokens_per_s"] / bf16["tokens_per_s"] if bf16 else None,
                      "operand_cache_kind": x.get("operand_cache_kind"), **{k: x.get(k) for k in attention}})
    for x in report.get("realistic_skipped", []):
        lines.append({"realistic": x["plan"], "skipped": x["skipped"], "estimate_s": x.get("estimate_s")})
    for hf in report["hf"]:
        lines.append({"model": hf["model"], "native_vs_hf_decode_same_tokens": hf["native_vs_hf_decode_same_tokens"],
                      "hf_truncated": hf["hf_truncated"], "hf_tokens_reached": hf["hf_tokens_reached"],
                      "new_tokens": hf["new_tokens"], "hf_s": hf["hf_s"],
                      "hf_decode_tokens_per_s": hf["hf_decode_tokens_per_s"],
                      "native_decode_tokens_per_s_same_tokens": hf["native_decode_tokens_per_s_same_tokens"],
                      "native_vs_hf_whole_run": hf["speedup"]})
    from trace_rl.bench.steps import summary as steps_summary

    return lines + steps_summary(report.get("steps", []))


def _plot(report: dict, path: Path) -> None:
    import matplotlib

    from trace_rl.bench.engine_attention import label

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [g for g in report["grid"] if "ratio" in g]
    fixed = report["results"]
    if not grid and not fixed and not report["realistic"]:
        return
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    if grid:
        labels = [f"B{g['batch']}\nL{g['L']}" for g in grid]
        x = range(len(grid))
        axes[0].bar([i - 0.2 for i in x], [g["engine_ms"] for g in grid], 0.4, label="engine bf16")
        axes[0].bar([i + 0.2 for i in x], [g["baseline_ms"] for g in grid], 0.4,
                    label="plain PyTorch (best of eager/compiled, SDPA)")
        axes[0].set_xticks(list(x), labels, fontsize=7)
        axes[0].set_ylabel("decode step forward (ms)")
        axes[0].legend(fontsize=7)
    for ax, rows, title in ((axes[1], fixed, "fixed length, memory filled"),
                            (axes[2], report["realistic"], "realistic (long-tailed, stops)")):
        if rows:
            ax.bar(range(len(rows)), [x["tokens_per_s"] for x in rows])
            ax.set_xticks(range(len(rows)), [label(x) for x in rows], fontsize=7)
            ax.set_ylabel("tokens / s")
            ax.set_title(title, fontsize=9)
    fig.suptitle(f"rollout, {report['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = add_rollout_bench_args(argparse.ArgumentParser(description=__doc__.split("\n")[0]))
    return run_rollout_bench(parser.parse_args(argv))
