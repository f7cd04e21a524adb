"""What the stability study has done and what is left (`stability_study.py status`: the projection in device
calls and sessions) and its report (`stability_study.py report`: tables, curves, raw records).

Imported by stability_study.py after it has put benchmarks/ and scripts/ on sys.path."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from stability_restore import study_from_bundle
from stability_spec import EST_STEP_SECONDS, LAUNCH_SECONDS, TERMINAL, Study, plan_trainer

# A plan with no measured step yet is estimated conservatively: the larger of its a priori time and the slowest
# measured plan's (a run's median step, possibly beside another run), times a factor of its trainer. Guided: on
# the H200 (2026-12-02) its first attempts took ~15 s per step beside another run (fp4-aligned: ~2.9 s), i.e.
# ~8 s alone by SHARING_SLOWDOWN, where EST_STEP_SECONDS says 3.5 s; guided runs alone (stability_schedule.py),
# and x2 the slowest measured plan (5.3 s: fp4-tis beside another) = 10.6 s leaves a third to spare.
UNMEASURED_FACTOR = {"guided": 2.0}


def status_text(study: Study) -> str:
    info = study.policy_info()
    lines = [f"policy: {'none yet' if info is None else ('done' if info['done'] else 'SFT unfinished')}"
             + ("" if info is None else f" (step {info['step']}, held-out accuracy {info['accuracy']})")]
    remaining, measured = 0.0, measured_step_seconds(study)
    for plan, seed in study.order():
        s = study.status(plan, seed)
        history = _train_records(study.run_dir(plan, seed))
        left, cost = seconds_left(study, plan, seed, measured)
        remaining += cost
        guess = "" if plan in measured else f" (step time not measured: ~{step_estimate(study, plan, measured):.1f} s)"
        lines.append(f"  {plan:16s} seed {seed}: {s['state']:12s} {len(history):4d}/{study.spec['steps']} steps"
                     + (f", ~{cost / 60:.0f} min left{guess}" if left else ""))
    usable = 540.0 - 30.0
    calls = math.ceil(remaining / usable) if remaining else 0
    lines.append(f"left: ~{remaining / 60:.0f} device-minutes = ~{calls} calls of 600 s (~{math.ceil(calls / 2.5)} "
                 f"sessions of 30 min at ~2.5 calls each); step times measured for: {', '.join(measured) or 'none'}")
    return "\n".join(lines)


def step_seconds(run_dir: Path) -> float | None:
    """The median step seconds of a run's records (None before its first step)."""
    history = _train_records(run_dir)
    return sorted(r["step_seconds"] for r in history)[len(history) // 2] if history else None


def measured_step_seconds(study: Study) -> dict[str, list[float]]:
    """{plan: median step seconds of each of its runs that has steps}: the runs' own measurements (a run's
    records, else what its status kept of an earlier attempt's, whose records a restart dropped)."""
    measured: dict[str, list[float]] = {}
    for plan, seed in study.order():
        median = step_seconds(study.run_dir(plan, seed))
        if median is None:
            median = study.status(plan, seed).get("measured_step_seconds")
        if median is not None:
            measured.setdefault(plan, []).append(median)
    return measured


def step_estimate(study: Study, plan: str, measured: dict[str, list[float]]) -> float:
    """Seconds per step of a plan: its measured mean (+10%); not measured: the larger of EST_STEP_SECONDS and
    the slowest measured plan, times UNMEASURED_FACTOR of its trainer (conservative: see there)."""
    if plan in measured:
        return sum(measured[plan]) / len(measured[plan]) * 1.1
    prior = EST_STEP_SECONDS.get(plan.removesuffix("-lr3x"), 7.0)
    slowest = max((max(v) for v in measured.values()), default=prior)
    return max(prior, slowest) * UNMEASURED_FACTOR.get(plan_trainer(study, plan), 1.0)


def seconds_left(study: Study, plan: str, seed: int, measured: dict[str, list[float]] | None = None,
                 sharing: float = 1.0) -> tuple[int, float]:
    """(steps left, estimated seconds to finish) of one run: `step_estimate` times `sharing` (how much slower
    a step runs beside other runs on the GPU: 1.85 for two runs on the H200, 2026-12-01: 5.9 s against 3.19 s
    per fp4 step), plus a launch."""
    measured = measured_step_seconds(study) if measured is None else measured
    if study.status(plan, seed)["state"] in TERMINAL:
        return 0, 0.0
    left = study.spec["steps"] - _resumable_steps(study.run_dir(plan, seed))
    return left, left * sharing * step_estimate(study, plan, measured) + (LAUNCH_SECONDS if left else 0.0)


def _resumable_steps(run_dir: Path) -> int:
    """Steps a run keeps when it continues here: its checkpoint's step (0 without one: it starts again)."""
    from trace_rl.pipelines.checkpoint import CheckpointError, find_checkpoint

    try:
        return int(find_checkpoint(run_dir).state["step"])
    except CheckpointError:
        return 0


def _train_records(run_dir: Path) -> list[dict]:
    from trace_rl.pipelines.run_log import read_history

    return [r for r in read_history(run_dir) if r.get("kind") == "train"] if run_dir.is_dir() else []


def cmd_status(args) -> int:
    study = Study.load(Path(args.work)) if args.work else study_from_bundle(Path(args.bundle), Path(args.tmp))
    print(status_text(study))
    return 0


def cmd_report(args) -> int:
    from trace_rl.audit.study_report import write_report

    study = Study.load(Path(args.work)) if args.work else study_from_bundle(Path(args.bundle), Path(args.tmp))
    result = write_report(study.runs, Path(args.docs), title=args.title, order=[p for p, _ in study.order()])
    if args.raw:
        raw = Path(args.raw)
        raw.mkdir(parents=True, exist_ok=True)
        for plan, seed in study.order():
            d = study.run_dir(plan, seed)
            if (d / "metrics.jsonl").is_file():
                shutil.copy(d / "metrics.jsonl", raw / f"{plan}-seed{seed}.jsonl")
            # the config file each run's command names: it lives only in the bundle's tarball otherwise
            config = study.work / "configs" / f"{plan}-seed{seed}.yaml"
            if config.is_file():
                shutil.copy(config, raw / f"{plan}-seed{seed}.yaml")
            if (study.runs / plan / "preflight.json").is_file():
                shutil.copy(study.runs / plan / "preflight.json", raw / f"{plan}-preflight.json")
        for name in ("calls.jsonl", "sft/sft.jsonl", "study.json"):
            if (study.work / name).is_file():
                shutil.copy(study.work / name, raw / name.replace("/", "-"))
    print(result["markdown"])
    print(f"wrote {args.docs}/report.md, report.json, curves.png"
          + (f"; raw records in {args.raw}" if args.raw else ""))
    return 0
