"""`trace-rl` command line (also `python -m trace_rl`).

Exit codes: 0 success; 1 a check failed (e.g. `drift --fail-above`); 2 invalid input (bad config,
unknown preset, missing file), reported before anything is written.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from trace_rl.cli_common import UsageError, load_pipeline_config, resolve_pipeline_config


def _resume_config(args):
    """(config, run directory) of `run --resume RUN_DIR`: RUN_DIR/config.yaml plus --set overrides of the
    fields a resumed run may change; every other argument and override is refused (nothing is ignored)."""
    from trace_rl.pipelines.checkpoint import RESUMABLE_FIELDS, CheckpointError, config_differences, find_checkpoint
    from trace_rl.pipelines.run_dir import check_run_dir

    given = [flag for flag, value in (("CONFIG", args.config), ("--preset", args.preset), ("--out", args.out),
                                      ("--no-default", args.no_default), ("--overwrite", args.overwrite)) if value]
    if given:
        raise UsageError(f"--resume {args.resume}: {', '.join(given)} cannot apply (a resumed run continues with "
                         f"its own config.yaml, in its own directory); drop {'it' if len(given) == 1 else 'them'}")
    run_dir = Path(args.resume)
    check_run_dir(run_dir, "resume")
    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise UsageError(f"--resume {run_dir}: no config.yaml there (not a trace-rl run directory)")
    base = load_pipeline_config(str(saved), None, [], no_default=True)          # already complete
    cfg = load_pipeline_config(str(saved), None, args.set, no_default=True)
    changed = config_differences(base.to_dict(), cfg.to_dict())
    refused = [k for k in changed if not any(k == f or k.startswith(f + ".") for f in RESUMABLE_FIELDS)]
    if refused:
        raise UsageError(f"--resume {run_dir}: --set {', '.join(refused)} would make it another run; a resumed run "
                         f"may change only {', '.join(RESUMABLE_FIELDS)} (start a new run for anything else)")
    try:
        step = int(find_checkpoint(run_dir).state["step"])
    except CheckpointError as err:
        raise UsageError(str(err)) from None
    if step >= cfg.loop.steps:
        raise UsageError(f"--resume {run_dir}: the run already finished (checkpoint at step {step}, loop.steps = "
                         f"{cfg.loop.steps}); to train further pass --set loop.steps=N with N > {step}")
    return cfg, run_dir


def _cmd_run(args) -> int:
    import shlex
    import time

    started = time.time()

    from trace_rl.pipelines import build
    from trace_rl.pipelines.pipeline import CorrectionsMaskedAll, RunInterrupted
    from trace_rl.pipelines.run_dir import check_run_dir
    from trace_rl.pipelines.run_log import summary_table

    mode = "resume" if args.resume else ("overwrite" if args.overwrite else "new")
    if args.time_limit is not None and not args.time_limit >= 0:
        raise UsageError(f"--time-limit {args.time_limit}: expected seconds >= 0")
    if args.resume:
        cfg, run_dir = _resume_config(args)
    else:
        cfg = load_pipeline_config(args.config, args.preset, args.set, no_default=args.no_default)
        run_dir = Path(args.out) if args.out else None
        if run_dir is not None:
            check_run_dir(run_dir, mode)        # cheap, before the model is built
    pipeline = build(cfg, run_dir)          # validates everything (device, model path) before writing
    if not getattr(pipeline, "is_driver", True):   # trainer rank > 0 under torchrun: rank 0 writes and prints
        pipeline.run(resume=bool(args.resume))
        return 0
    check_run_dir(pipeline.run_dir, mode)
    if args.time_limit is not None:       # counted from the start of this command (model loading included)
        pipeline.deadline = started + args.time_limit
    resume_cmd = f"trace-rl run --resume {shlex.quote(str(pipeline.run_dir))}"
    print(f"run directory: {pipeline.run_dir}")
    print(f"plan: {cfg.precision.label}  trainer: {cfg.precision.trainer}  corrections: "
          f"{', '.join(c.kind for c in cfg.corrections) or 'none'}  engine: {cfg.rollout.engine}", flush=True)
    try:
        summary = pipeline.run(resume=bool(args.resume), overwrite=bool(args.overwrite))
    except RunInterrupted as stop:
        print(f"trace-rl: {stop}", file=sys.stderr)
        if stop.saved is not None:
            print(f"resume with: {resume_cmd}")
        return 128 + stop.signum
    except KeyboardInterrupt:
        last = (pipeline.run_dir / "checkpoint" / "state.json").is_file()
        print("trace-rl: interrupted at once, without saving" + (f"; the last checkpoint stays: resume with: "
                                                                f"{resume_cmd}" if last else ""), file=sys.stderr)
        return 130
    except CorrectionsMaskedAll as err:
        print(f"trace-rl: error: {err}", file=sys.stderr)
        return 1
    except FloatingPointError as err:
        last = (pipeline.run_dir / "checkpoint" / "state.json").is_file()
        print(f"trace-rl: error: {err}" + (f"; the last good checkpoint stays (fix the cause, then: {resume_cmd})"
                                           if last else ""), file=sys.stderr)
        return 1
    print(summary_table(summary))
    print(f"plot: {summary.get('plot')}\nmetrics: {pipeline.run_dir / 'metrics.jsonl'}")
    return 0


def _cmd_validate(args) -> int:
    from trace_rl.pipelines import build
    from trace_rl.pipelines.preflight import preflight

    cfg, layers = resolve_pipeline_config(args.config, args.preset, args.set, no_default=args.no_default)
    report = preflight(cfg)         # every check `run` makes before its first step that needs no weights
    if args.build:
        build(cfg, run_dir="/nonexistent-validate-only", checked=report)   # loads the weights too; writes nothing
    print(f"{args.config or 'embedded default'}: valid ({cfg.precision.label}, {cfg.loop.steps} steps)")
    for note in report.notes:
        print(f"  {note}")
    if args.show:
        print(f"# resolved from: {layers}")
        print(cfg.to_yaml())
    return 0


def _cmd_presets(args) -> int:
    from trace_rl.plan import PRESET_ALIASES, PRESETS, PrecisionPlan

    for name, p in PRESETS.items():
        plan = PrecisionPlan(**p.plan)
        corr = ", ".join(f"{c['kind']}({', '.join(f'{k}={v}' for k, v in c['params'].items())})"
                         for c in p.corrections) or "none"
        print(f"{name:12s} {plan.label:18s} trainer={plan.trainer:8s} corrections={corr:22s} {p.about}")
    print("aliases: " + ", ".join(f"{a} = {b}" for a, b in PRESET_ALIASES.items()))
    print("the same names work in `run --preset`, `drift --plans`, `compare --presets` and PrecisionPlan.preset()")
    return 0


MAX_FORMAT_ELEMENTS = 1 << 26       # 64M float32 values (256 MB, plus a few working copies)


def _cmd_formats(args) -> int:
    from trace_rl.formats.report import error_table, format_table

    if args.rows < 1 or args.cols < 128 or args.cols % 128:
        raise UsageError(f"--rows {args.rows} --cols {args.cols}: need rows >= 1 and cols a positive multiple of 128 "
                         f"(fp8 block scaling uses 1x128 blocks; nvfp4/mxfp4 16/32), e.g. --rows 4096 --cols 4096")
    if args.rows * args.cols > MAX_FORMAT_ELEMENTS:
        raise UsageError(f"--rows {args.rows} --cols {args.cols}: {args.rows * args.cols:,} values is more than this "
                         f"table needs (at most {MAX_FORMAT_ELEMENTS:,}); e.g. --rows 4096 --cols 4096")
    if not 0 <= args.seed < 2**63:
        raise UsageError(f"--seed {args.seed}: must be in 0 .. 2**63 - 1")
    if args.json:
        _check_writable_file(args.json, "--json")
    results = error_table(args.rows, args.cols, args.seed)
    print(f"Quantization error of a {args.rows}x{args.cols} weight-like tensor (Gaussian, 8 outlier channels):")
    print(format_table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")
    return 0


def _check_writable_file(path: str, flag: str) -> None:
    target = Path(path)
    if target.is_dir():
        raise UsageError(f"{flag} {path}: is a folder; give a file name")
    parent = target.parent if str(target.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{flag} {path}: folder {parent} does not exist")


def _cmd_bench(args) -> int:
    from trace_rl.bench.rollout import run_rollout_bench, unmeasured

    try:
        report = run_rollout_bench(args)    # each measurement's own failure is caught and recorded inside
    except ValueError as err:               # its arguments, checked before anything runs or is written
        raise UsageError(f"bench rollout: {err}") from None
    failed = report.get("errors", [])
    if failed:
        print(f"trace-rl: bench: {len(failed)} measurement(s) failed (listed above as FAILED/error, and under "
              f"\"errors\" in the JSON); exit 1", file=sys.stderr)
        return 1
    why = unmeasured(report)
    if why:
        print(f"trace-rl: bench: {why}; exit 1", file=sys.stderr)
        return 1
    return 0


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", nargs="?", help="pipeline config (.yaml/.toml/.json); default: the embedded default")
    p.add_argument("--preset", help="apply a preset (precision plan + corrections); see `trace-rl presets`")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override a field, e.g. loop.steps=10 or corrections.0.params.C=3 (a number indexes a list)")
    p.add_argument("--no-default", action="store_true",
                   help="start from the field defaults instead of overlaying CONFIG on the embedded default")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-rl",
        description="RL for language models with low-precision (FP4/FP8) rollout and drift correction.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("run", help="run an RL pipeline (no CONFIG: the embedded default)",
                       description="Run GRPO-family RL from a config. Writes a run directory with config.yaml, "
                                   "metrics.jsonl, summary.json, curves.png and a checkpoint.")
    _add_config_args(p)
    p.add_argument("--out", help="run directory (default: <logging.dir>/<plan>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a run from its newest complete checkpoint (its own config.yaml; --set may change "
                        "loop.steps, trainer.lr and a few other fields: docs/pipelines.md)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace the run directory if it holds an earlier trace-rl run (default: refuse)")
    p.add_argument("--time-limit", type=float, metavar="SECONDS",
                   help="stop, with a checkpoint, before a step that would end more than SECONDS after this command "
                        "started (at least one step is made); exit 142; continue with --resume")
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("validate", help="check a config (exit 2 naming the bad field)")
    _add_config_args(p)
    p.add_argument("--build", action="store_true", help="also build every object (loads the model)")
    p.add_argument("--show", action="store_true", help="print the resolved config")
    p.set_defaults(func=_cmd_validate)

    from trace_rl.pipelines.export import add_export_args, cmd_export

    p = sub.add_parser("export", help="a run's checkpoint as an HF model folder (transformers, TRL, vLLM load it)",
                       description="Copy the checkpoint of a step (default: the newest) of RUN_DIR into OUT as a "
                                   "Hugging Face model folder: config.json, generation_config.json, "
                                   "model.safetensors, tokenizer files; no optimizer state.")
    add_export_args(p)
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("presets", help="list the presets (one namespace for run, drift, compare)")
    p.set_defaults(func=_cmd_presets)

    p = sub.add_parser("formats", help="quantize a model-sized tensor in every format and print the error table")
    p.add_argument("--rows", type=int, default=4096, help="tensor rows (default 4096)")
    p.add_argument("--cols", type=int, default=4096, help="tensor columns (default 4096)")
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument("--json", help="also write the results to this JSON file")
    p.set_defaults(func=_cmd_formats)

    p = sub.add_parser("bench", help="benchmarks (`trace-rl bench rollout --help`)")
    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    pr = bench_sub.add_parser("rollout", help="RL rollout throughput per precision plan")
    from trace_rl.bench.rollout import add_rollout_bench_args

    add_rollout_bench_args(pr)
    pr.set_defaults(func=_cmd_bench)

    from trace_rl.audit.commands import add_compare_args, add_drift_args, cmd_compare, cmd_drift

    p = sub.add_parser("drift", help="rollout vs trainer drift per precision plan, overall and by token position",
                       description="Generate with each rollout plan, rescore the same tokens with the trainer, "
                                   "report every drift metric (table, drift.json, drift.png). Exit 1 when a "
                                   "--fail-above threshold is crossed.")
    add_drift_args(p)
    p.set_defaults(func=cmd_drift)

    p = sub.add_parser("compare", help="one config under several presets and seeds, side by side",
                       description="Run a pipeline config per (preset, seed) into <out>/<preset>/seed<k>, then "
                                   "write compare.md, compare.json and compare.png (mean +- std over seeds).")
    add_compare_args(p)
    p.set_defaults(func=cmd_compare)
    return parser


def main(argv: list[str] | None = None) -> int:
    from trace_rl.config import ConfigError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, UsageError) as err:
        print(f"trace-rl: error: {err}", file=sys.stderr)
        return 2
    except BrokenPipeError:          # `trace-rl ... | head`: the reader left; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
