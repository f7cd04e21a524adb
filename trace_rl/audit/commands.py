"""The `trace-rl drift` and `trace-rl compare` subcommands: arguments and what they run.

Input checks raise ConfigError / UsageError (exit 2) before any file is written; `drift` returns 1 when a
`--fail-above` threshold is crossed, so it can gate CI or a launch script.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from trace_rl.cli_common import UsageError, load_pipeline_config
from trace_rl.config import ConfigError

DEFAULT_COMPARE_PRESETS = "bf16,fp4,fp4-tis,fp4-aligned"


def add_drift_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="pipeline config whose model, task, sampling, precision and seed are "
                                             "the defaults (default: the embedded default)")
    p.add_argument("--model", help="local HF-format folder or model preset ('default': the embedded policy; "
                                   "'tiny', 'tiny-llama', 'tiny-moe': random init)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompts", metavar="FILE", help="JSONL file, one {\"prompt\": ...} per line")
    src.add_argument("--task", help="task kind ('arithmetic') or YAML mapping ('{kind: arithmetic, show_work: "
                                    "true}'); default: the config's task (its held-out prompts)")
    p.add_argument("--plans", help="comma-separated precision presets (bf16, fp8, w4a16, fp4, w4a4-kv4-mx, "
                                   "fp4-aligned, fp4-guided, ...); default: the config's precision plan")
    p.add_argument("--trainer", choices=("bf16", "aligned", "guided"),
                   help="trainer mode for every plan (default: each preset's own; bf16 unless it says aligned)")
    p.add_argument("--num-prompts", type=int, default=32, help="prompts (default 32; a file's first N)")
    p.add_argument("--samples", type=int, help="responses per prompt (default: the config's group size)")
    p.add_argument("--max-new-tokens", type=int, help="most tokens per response (default: the config's)")
    p.add_argument("--temperature", type=float, help="sampling temperature (default: the config's)")
    p.add_argument("--top-k", type=int, help="top-k (default: the config's)")
    p.add_argument("--top-p", type=float, help="top-p (default: the config's)")
    p.add_argument("--ignore-stop", action="store_true", help="generate exactly --max-new-tokens per response")
    p.add_argument("--seed", type=int, help="seed of the prompts, the sampling and random models (default: config)")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), help="trainer dtype (default: the config's); the "
                   "engine runs bf16 on GPU and this dtype on CPU")
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="default: cuda if present")
    p.add_argument("--bins", default="pow2", help="position bins: 'pow2' (0,1,2,4,...) or N equal-width bins; "
                                                  "both up to the longest response (default pow2)")
    p.add_argument("--layer-groups", type=int, default=0, metavar="N",
                   help="also measure the KV cache alone and N groups of layers alone (N+1 more rollouts per plan)")
    p.add_argument("--router-replay", choices=("auto", "on", "off"), default="auto",
                   help="mixture-of-experts models: the trainer replays the rollout's routing (auto: on for MoE; "
                        "on is an error for dense models)")
    p.add_argument("--max-batch", type=int, default=256, help="sequences the engine decodes at once (default 256)")
    p.add_argument("--fail-above", action="append", metavar="METRIC=VALUE",
                   help="exit 1 if any plan's METRIC exceeds VALUE (repeatable; NaN counts as exceeding)")
    p.add_argument("--out", help="output folder for drift.json, drift.png, drift.txt (default runs/drift-<time>)")


def _usage(message: str):
    return UsageError(message)


def _positive(name: str, value: int | None, minimum: int = 1) -> None:
    if value is not None and value < minimum:
        raise _usage(f"{name} must be >= {minimum}, got {value}")


def cmd_drift(args) -> int:
    import torch

    from trace_rl.audit import inputs
    from trace_rl.audit.drift import (
        DriftAudit,
        check_thresholds,
        drift_table,
        json_safe,
        parse_thresholds,
        resolve_plans,
    )
    from trace_rl.audit.plots import plot_drift_by_position
    from trace_rl.engine.base import SamplingParams
    from trace_rl.pipelines.assemble import resolve_device, stop_token_ids
    from trace_rl.plan import PLAN_PRESETS
    from trace_rl.tasks import build_task

    # -- every check before anything runs or is written --
    thresholds = parse_thresholds(args.fail_above)
    for name, value, low in (("--num-prompts", args.num_prompts, 1), ("--samples", args.samples, 1),
                             ("--max-new-tokens", args.max_new_tokens, 1), ("--max-batch", args.max_batch, 1),
                             ("--layer-groups", args.layer_groups, 0), ("--top-k", args.top_k, 0)):
        _positive(name, value, low)
    if args.bins != "pow2" and not (args.bins.isdigit() and int(args.bins) >= 1):
        raise _usage(f"--bins {args.bins!r}: expected 'pow2' or a number of bins >= 1")
    cfg = load_pipeline_config(args.config, None, [])
    if args.plans:
        plans = resolve_plans(args.plans, args.trainer)
    else:
        own = cfg.precision if args.trainer is None else cfg.precision.model_copy(update={"trainer": args.trainer})
        name = next((n for n in PLAN_PRESETS if PLAN_PRESETS[n] and own == own.preset(n)), own.label)
        plans = resolve_plans([name], args.trainer) if name in PLAN_PRESETS else [(name, own)]
    seed = cfg.seed if args.seed is None else args.seed
    device = resolve_device(args.device)
    dtype = inputs.DTYPES[args.dtype or cfg.model.dtype]
    model_spec = args.model or cfg.model.path or cfg.model.preset
    try:
        task = build_task(inputs.parse_task(args.task) if args.task else cfg.task)
        prompts = inputs.read_prompt_file(args.prompts)[: args.num_prompts] if args.prompts else None
    except UnicodeDecodeError as err:
        raise _usage(f"{'--prompts ' + args.prompts if args.prompts else 'task'}: not UTF-8 text ({err.reason} at "
                     f"byte {err.start}); save it as UTF-8") from None
    except (ValueError, OSError) as err:
        if isinstance(err, ConfigError):
            raise
        raise _usage(f"task: {err}") from None
    if args.prompts:
        task = None
    else:
        prompts = inputs.task_prompts(task, args.num_prompts, seed)
    out = Path(args.out) if args.out else Path("runs") / f"drift-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and not out.is_dir():
        raise _usage(f"--out {out}: exists and is not a folder")
    torch.manual_seed(seed)
    model, tokenizer = inputs.load_model(model_spec, device, dtype, seed)
    s = cfg.rollout.sampling
    stops = stop_token_ids(task, tokenizer) if task is not None else (
        (tokenizer.eos_token_id,) if getattr(tokenizer, "eos_token_id", None) is not None else ())
    try:
        sampling = SamplingParams(
            n=args.samples or cfg.loop.group_size, max_new_tokens=args.max_new_tokens or s.max_new_tokens,
            temperature=s.temperature if args.temperature is None else args.temperature,
            top_k=s.top_k if args.top_k is None else args.top_k, top_p=s.top_p if args.top_p is None else args.top_p,
            stop_token_ids=stops, ignore_stop=args.ignore_stop, seed=seed)
    except ValueError as err:
        raise _usage(f"sampling: {err}") from None
    prompt_td = inputs.encode_prompts(prompts, tokenizer)

    # -- measure --
    print(f"model {model_spec} ({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M params, {dtype}) on "
          f"{device}; {len(prompts)} prompts x {sampling.n} samples, <= {sampling.max_new_tokens} new tokens, "
          f"temperature {sampling.temperature}", flush=True)
    audit = DriftAudit(model, tokenizer, prompt_td, sampling, device, max_batch=args.max_batch,
                       bins=args.bins if args.bins == "pow2" else int(args.bins),
                       router_replay={"auto": None, "on": True, "off": False}[args.router_replay])
    _ = audit.replays      # a replay switch the model cannot honour fails here, before anything is written
    results = audit.run(plans, layer_groups=args.layer_groups, log=lambda m: print(m, flush=True))
    violations = check_thresholds(results, thresholds)
    table = drift_table(results)
    print(table)
    out.mkdir(parents=True, exist_ok=True)
    (out / "drift.txt").write_text(table + "\n")
    record = {"model": model_spec, "device": str(device), "dtype": str(dtype).removeprefix("torch."),
              "prompts": args.prompts or (task.config.to_dict() if task is not None else None),
              "num_prompts": len(prompts), "sampling": sampling.to_dict(), "seed": seed, "bins": args.bins,
              "plans": [r.to_dict() for r in results], "fail_above": thresholds, "violations": violations,
              "command": " ".join(["trace-rl", *sys.argv[1:]])}
    (out / "drift.json").write_text(json.dumps(json_safe(record), indent=2, default=str))
    plot_drift_by_position(results, out / "drift.png", f"{model_spec}: rollout vs trainer drift by position")
    print(f"wrote {out / 'drift.json'}, {out / 'drift.png'}")
    for line in violations:
        print(f"FAIL {line}", file=sys.stderr)
    return 1 if violations else 0


def add_compare_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="pipeline config (default: the embedded default)")
    p.add_argument("--presets", default=DEFAULT_COMPARE_PRESETS,
                   help=f"comma-separated pipeline presets (default {DEFAULT_COMPARE_PRESETS})")
    p.add_argument("--seeds", default="3", help="number of seeds (0..N-1) or a comma list, e.g. 0,7 (default 3)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config field for every run")
    p.add_argument("--out", help="output folder (default runs/compare-<time>); runs go to <out>/<preset>/seed<k>")
    p.add_argument("--rerun", action="store_true", help="rerun runs that already finished in --out")
    p.add_argument("--aggregate-only", action="store_true", help="only aggregate the runs already in --out")
    p.add_argument("--progress", action="store_true", help="show each run's progress bar")
    p.add_argument("--collapse-window", type=int, default=5, help="steps of the trailing reward mean (default 5)")
    p.add_argument("--collapse-fraction", type=float, default=0.5,
                   help="collapse when the trailing mean < this x its best so far (default 0.5)")
    p.add_argument("--collapse-min-peak", type=float, default=0.05,
                   help="only once the best trailing mean is at least this (default 0.05)")


def parse_seeds(text: str) -> list[int]:
    try:
        if "," in text:
            seeds = [int(s) for s in text.split(",") if s.strip()]
        else:
            seeds = list(range(int(text)))
    except ValueError:
        raise _usage(f"--seeds {text!r}: expected a count (3) or a comma list of seeds (0,7)") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise _usage(f"--seeds {text!r}: need at least one seed, each once")
    return seeds


def cmd_compare(args) -> int:
    from trace_rl.audit.compare import CollapseRule, run_compare, write_compare
    from trace_rl.pipelines import build
    from trace_rl.pipelines.presets import PIPELINE_PRESETS

    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    unknown = [p for p in presets if p not in PIPELINE_PRESETS]
    if not presets or unknown or len(set(presets)) != len(presets):
        raise _usage(f"--presets {args.presets!r}: each preset once, from: {', '.join(PIPELINE_PRESETS)}")
    seeds = parse_seeds(args.seeds)
    _positive("--collapse-window", args.collapse_window)
    if not 0 < args.collapse_fraction < 1:
        raise _usage(f"--collapse-fraction must be in (0, 1), got {args.collapse_fraction}")
    rule = CollapseRule(args.collapse_window, args.collapse_fraction, args.collapse_min_peak)
    if args.out and Path(args.out).exists() and not Path(args.out).is_dir():
        raise _usage(f"--out {args.out}: exists and is not a folder")
    if args.aggregate_only and not args.out:
        raise _usage("--aggregate-only needs --out (the folder of an earlier compare)")
    out = Path(args.out) if args.out else Path("runs") / f"compare-{time.strftime('%Y%m%d-%H%M%S')}"
    overrides = list(args.set or []) + ([] if args.progress else ["logging.progress=false"])
    configs = {p: {s: load_pipeline_config(args.config, p, [*overrides, f"seed={s}"]) for s in seeds}
               for p in presets}
    if not args.aggregate_only:
        for by_seed in configs.values():   # builds every object once per preset: bad input fails here
            build(next(iter(by_seed.values())), run_dir=out / "unused-validate-only")
        out.mkdir(parents=True, exist_ok=True)
        first = next(iter(next(iter(configs.values())).values()))
        print(f"compare: {len(presets)} presets x {len(seeds)} seeds, {first.loop.steps} steps each -> {out}",
              flush=True)
        run_compare(configs, out, rerun=args.rerun, log=lambda m: print(m, flush=True))
    elif not out.is_dir():
        raise _usage(f"--out {out}: no such folder to aggregate")
    sets = " ".join(args.set or [])
    result = write_compare(out, presets, seeds, rule, title=f"{args.config or 'embedded default'}"
                                                            f"{f' ({sets})' if sets else ''}: seeds {seeds}")
    print(result["table"])
    print(f"wrote {out / 'compare.json'}, {out / 'compare.md'}, {result['plot']}")
    return 0
