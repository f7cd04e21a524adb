"""A stability study's report from its raw records: one row per (plan, seed), one per plan, the pre-flight
drift audit against the outcome, and the curves.

Layout read (what `benchmarks/stability_study.py` and `trace-rl compare` write):

    <runs>/<plan>/seed<k>/metrics.jsonl    the run's records (train, eval, collapse, resume)
    <runs>/<plan>/seed<k>/summary.json     present when the run finished (or stopped at its collapse)
    <runs>/<plan>/seed<k>.json             optional: the driver's status (state, commands, attempts)
    <runs>/<plan>/preflight.json           optional: `trace-rl drift` on the policy before training

Definitions (docs/stability.md, "GPU study"):
- final / best held-out accuracy: the last / highest `eval_accuracy` of the run (its start included), at the
  plan's own rollout precision;
- ... at bf16: the same from `eval_ref_accuracy` (`loop.eval_reference`: the trainer's weights evaluated by a
  bf16 engine), which separates a quantized plan's less accurate inference from what its rollouts did to
  training; a run whose rollout is bf16 has its own evaluation there; '–' for a quantized run without it (one
  started before the study turned it on);
- collapse: the run's recorded collapse (`trace_rl.pipelines.collapse`), step and reason;
- wall time per step: the median `step_seconds` plus the evaluation time spread over the steps;
- degraded: collapsed, or final held-out accuracy below the reference plan's mean (bf16) by more than
  `max(0.05, 2 x the reference's seed std)`; "policy degraded" applies the same rule to the final accuracy at
  bf16 (when every run of the plan has it): whether training on the plan's rollouts made the policy worse,
  apart from what its quantized inference costs at evaluation;
- the pre-flight verdict predicted the outcome when (verdict is "fail") == degraded; for plans that apply a
  correction (TIS, masking, aligned or guided trainers) the rollout's drift is what the correction is for,
  so the column says "corrected" instead.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trace_rl.pipelines.run_log import read_history

CORRECTED_HINTS = ("tis", "geo", "mask", "reject", "aligned", "guided")


@dataclass
class RunResult:
    plan: str
    seed: int
    dir: str
    state: str                      # finished | stopped at collapse | interrupted | diverged | failed | pending
    steps: int
    target_steps: int | None
    start_accuracy: float
    final_accuracy: float
    best_accuracy: float
    collapse_step: int | None
    collapse_reason: str | None
    mean: dict[str, float]          # per-run means of the per-step metrics
    step_seconds: float             # median
    eval_seconds_per_step: float
    wall_seconds: float
    preflight: dict | None
    curves: dict[str, dict[int, float]] = field(default_factory=dict)
    by_position_k3: dict[str, float] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    ref_start_accuracy: float = math.nan     # held-out accuracy at bf16 (module doc); NaN: not measured
    ref_final_accuracy: float = math.nan
    ref_best_accuracy: float = math.nan

    @property
    def seconds_per_step(self) -> float:
        return self.step_seconds + self.eval_seconds_per_step


MEAN_KEYS = ("reward", "correct", "mismatch_k3", "abs_log_ratio_mean", "ess", "entropy", "grad_norm",
             "response_length", "response_at_cap", "frac_masked_tokens", "frac_rejected_seqs")
CURVE_KEYS = ("reward", "mismatch_k3", "entropy", "response_length", "grad_norm", "ess")


def _finite_mean(values) -> float:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.fmean(values) if values else math.nan


def _median(values) -> float:
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return statistics.median(values) if values else math.nan


def load_run(run_dir: Path, plan: str, seed: int) -> RunResult:
    history = read_history(run_dir)
    train = [r for r in history if r.get("kind") == "train"]
    evals = [r for r in history if r.get("kind") == "eval"]
    collapse = next((r for r in history if r.get("kind") == "collapse"), None)
    status_file = run_dir.with_suffix(".json")
    status = json.loads(status_file.read_text()) if status_file.is_file() else {}
    summary_file = run_dir / "summary.json"
    summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
    preflight_file = run_dir.parent / "preflight.json"
    target, bf16_rollout = None, False
    config = run_dir / "config.yaml"
    if config.is_file():
        import yaml

        data = yaml.safe_load(config.read_text()) or {}
        target = data.get("loop", {}).get("steps")
        precision = data.get("precision", {})
        bf16_rollout = all(precision.get(k, "bf16") == "bf16" for k in ("rollout_weights", "rollout_activations",
                                                                     "kv_cache"))
    if summary:
        state = "stopped at collapse" if summary.get("stopped") else "finished"
    else:
        state = status.get("state") or ("interrupted" if train else "pending")
    accs = [float(r["eval_accuracy"]) for r in evals]
    # at bf16: the reference evaluation when the run has one (from its first evaluation, else its start is
    # unknown), a bf16 rollout's own evaluation, else none
    refs = [float(r["eval_ref_accuracy"]) for r in evals if "eval_ref_accuracy" in r]
    if bf16_rollout and not refs:
        refs = accs
    ref_from_start = bool(evals) and ("eval_ref_accuracy" in evals[0] or bf16_rollout)
    mean = {k: _finite_mean(r.get(k) for r in train) for k in MEAN_KEYS}
    for key in sorted({k for r in train for k in r if k.startswith("correction/")}):
        mean[key] = _finite_mean(r.get(key) for r in train)
    spans = sorted({k.rsplit("/", 1)[1] for r in train for k in r if k.startswith("mismatch_by_position/k3/")},
                   key=lambda s: int(s.split("-")[0]))
    eval_s = sum(float(r.get("eval_seconds", 0.0)) + float(r.get("eval_ref_seconds", 0.0)) for r in evals)
    return RunResult(
        plan=plan, seed=seed, dir=str(run_dir), state=state, steps=len(train), target_steps=target,
        start_accuracy=accs[0] if accs else math.nan, final_accuracy=accs[-1] if accs else math.nan,
        best_accuracy=max(accs) if accs else math.nan,
        collapse_step=collapse["step"] if collapse else None,
        collapse_reason=collapse["reason"] if collapse else None, mean=mean,
        step_seconds=_median(r.get("step_seconds") for r in train[1:] or train),   # step 1 includes warm-up
        eval_seconds_per_step=eval_s / max(len(train), 1),
        wall_seconds=sum(float(r.get("step_seconds", 0.0)) for r in train) + eval_s,
        preflight=json.loads(preflight_file.read_text()) if preflight_file.is_file() else None,
        curves={**{k: {r["step"]: float(r[k]) for r in train if r.get(k) is not None} for k in CURVE_KEYS},
                "eval_accuracy": {r["step"]: float(r["eval_accuracy"]) for r in evals},
                "eval_ref_accuracy": {r["step"]: float(r["eval_ref_accuracy"]) for r in evals
                                      if "eval_ref_accuracy" in r}},
        by_position_k3={s: _finite_mean(r.get(f"mismatch_by_position/k3/{s}") for r in train) for s in spans},
        commands=status.get("commands", []),
        ref_start_accuracy=refs[0] if refs and ref_from_start else math.nan,
        ref_final_accuracy=refs[-1] if refs else math.nan, ref_best_accuracy=max(refs) if refs else math.nan)


def discover(runs: Path) -> list[tuple[str, int, Path]]:
    """(plan, seed, folder) of every <plan>/seed<k>/ under `runs`."""
    found = []
    for plan_dir in sorted(p for p in Path(runs).iterdir() if p.is_dir()):
        for run_dir in sorted(plan_dir.glob("seed*")):
            if run_dir.is_dir() and run_dir.name[4:].isdigit():
                found.append((plan_dir.name, int(run_dir.name[4:]), run_dir))
    return found


def load_runs(runs: Path, order: list[str] | None = None) -> list[RunResult]:
    results = [load_run(d, plan, seed) for plan, seed, d in discover(runs)]
    rank: dict[str, int] = {}
    for i, p in enumerate(order or []):            # a plan's first place counts (its second seed comes later)
        rank.setdefault(p, i)
    return sorted(results, key=lambda r: (rank.get(r.plan, len(rank)), r.plan, r.seed))


def _f(value, digits: int = 3) -> str:
    """A table cell: '–' for missing/NaN, small magnitudes in 2 significant digits (k3 of 1e-5 stays readable)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if not isinstance(value, float):
        return str(value)
    return f"{value:.2g}" if 0 < abs(value) < 1e-2 else f"{value:.{digits}f}"


def _pm(values: list[float]) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "–"
    mean = statistics.fmean(values)
    return f"{mean:.3f}" + (f" ± {statistics.stdev(values):.3f}" if len(values) > 1 else "")


def is_corrected(plan: str) -> bool:
    return any(h in plan for h in CORRECTED_HINTS)


def verdicts(results: list[RunResult], reference: str = "bf16") -> dict[str, dict]:
    """Per plan: degraded (see the module doc), the pre-flight verdict, and whether it predicted the outcome."""
    ref = [r.final_accuracy for r in results if r.plan == reference and not math.isnan(r.final_accuracy)]
    ref_mean = statistics.fmean(ref) if ref else math.nan
    margin = max(0.05, 2 * statistics.stdev(ref)) if len(ref) > 1 else 0.05
    out = {}
    for plan in dict.fromkeys(r.plan for r in results):
        runs = [r for r in results if r.plan == plan]
        finals = [r.final_accuracy for r in runs if not math.isnan(r.final_accuracy)]
        collapsed = any(r.collapse_step is not None for r in runs)
        below = bool(finals) and not math.isnan(ref_mean) and statistics.fmean(finals) < ref_mean - margin
        degraded = collapsed or below
        pre = next((r.preflight for r in runs if r.preflight), None)
        verdict = pre.get("verdict") if pre else None
        if verdict is None or plan == reference:
            predicted = "–"
        elif is_corrected(plan):
            predicted = "corrected"
        else:
            predicted = "yes" if (verdict == "fail") == degraded else "no"
        ref_finals = [r.ref_final_accuracy for r in runs]
        policy_degraded = None                  # unknown unless every run was also evaluated at bf16
        if ref_finals and not any(math.isnan(v) for v in ref_finals) and not math.isnan(ref_mean):
            policy_degraded = collapsed or statistics.fmean(ref_finals) < ref_mean - margin
        out[plan] = {"degraded": degraded, "policy_degraded": policy_degraded, "collapsed": collapsed,
                     "below_reference": below, "verdict": verdict, "predicted": predicted,
                     "reference_mean": ref_mean, "margin": margin}
    return out


def _head(*columns: str) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def has_reference(results: list[RunResult]) -> bool:
    """Whether any quantized run was also evaluated at bf16 (the tables' bf16 columns)."""
    return any(r.curves.get("eval_ref_accuracy") for r in results)


def run_table(results: list[RunResult]) -> str:
    ref = has_reference(results)
    lines = _head("plan", "seed", "state", "steps", "held-out acc: start → final", "best",
                  *(["at bf16: start → final", "best at bf16"] if ref else []), "collapse (step, rule)",
                  "mean k3", "mean \\|log ρ\\|", "mean ess", "masked / truncated", "s/step", "wall s")
    for r in results:
        cut = [v for k, v in r.mean.items() if k.endswith("/frac_truncated")]
        masked = r.mean.get("frac_masked_tokens", math.nan)
        steps = f"{r.steps}/{r.target_steps}" if r.target_steps else str(r.steps)
        collapse = f"{r.collapse_step} ({r.collapse_reason})" if r.collapse_step is not None else "–"
        lines.append(f"| {r.plan} | {r.seed} | {r.state} | {steps} | {_f(r.start_accuracy)} → {_f(r.final_accuracy)} "
                     f"| {_f(r.best_accuracy)} "
                     + (f"| {_f(r.ref_start_accuracy)} → {_f(r.ref_final_accuracy)} | {_f(r.ref_best_accuracy)} "
                        if ref else "")
                     + f"| {collapse} | {_f(r.mean['mismatch_k3'])} "
                     f"| {_f(r.mean['abs_log_ratio_mean'])} | {_f(r.mean['ess'])} "
                     f"| {_f(masked)} / {_f(max(cut) if cut else 0.0)} | {_f(r.seconds_per_step, 2)} "
                     f"| {_f(r.wall_seconds, 0)} |")
    return "\n".join(lines)


def plan_table(results: list[RunResult], reference: str = "bf16") -> str:
    judged = verdicts(results, reference)
    ref = has_reference(results)
    lines = _head("plan", "seeds", "final held-out acc", "best", *(["final at bf16"] if ref else []),
                  "collapsed (steps)", "mean k3", "pre-flight k3", "verdict", "degraded",
                  *(["policy degraded (at bf16)"] if ref else []), "verdict predicted it", "s/step")
    for plan, v in judged.items():
        runs = [r for r in results if r.plan == plan]
        steps = [r.collapse_step for r in runs if r.collapse_step is not None]
        pre = next((r.preflight for r in runs if r.preflight), None)
        at = f" ({', '.join(map(str, steps))})" if steps else ""
        lines.append(
            f"| {plan} | {len(runs)} | {_pm([r.final_accuracy for r in runs])} "
            f"| {_pm([r.best_accuracy for r in runs])} "
            + (f"| {_pm([r.ref_final_accuracy for r in runs])} " if ref else "")
            + f"| {len(steps)}/{len(runs)}{at} "
            f"| {_f(_finite_mean(r.mean['mismatch_k3'] for r in runs))} "
            f"| {_f(pre.get('mismatch_k3')) if pre else '–'} | {v['verdict'] or '–'} "
            f"| {'yes' if v['degraded'] else 'no'} "
            + (f"| {'–' if v['policy_degraded'] is None else ('yes' if v['policy_degraded'] else 'no')} "
               if ref else "")
            + f"| {v['predicted']} "
            f"| {_f(_median(r.seconds_per_step for r in runs), 2)} |")
    return "\n".join(lines)


def plot_study(results: list[RunResult], path: Path, title: str = "") -> Path:
    """Held-out accuracy, train reward, mismatch k3 (log), entropy, response length, grad norm over steps (one
    line per run: colour = plan, dashes = seed, x = collapse), and k3 by response position per plan."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("eval_accuracy", "held-out accuracy (greedy)", False), ("reward", "train reward", False),
              ("mismatch_k3", "mismatch k3", True), ("entropy", "entropy", False),
              ("response_length", "response length", False), ("grad_norm", "grad norm", True)]
    fig, axes = plt.subplots(2, 4, figsize=(20, 8))
    plans = list(dict.fromkeys(r.plan for r in results))
    colors = {p: plt.cm.tab10(i % 10) for i, p in enumerate(plans)}
    for ax, (key, name, log) in zip(axes.flat, panels):
        for r in results:
            series = r.curves.get(key, {})
            if not series:
                continue
            steps = sorted(series)
            values = [series[s] for s in steps]
            ax.plot(steps, values, color=colors[r.plan], ls="-" if r.seed % 2 == 0 else "--",
                    marker="o" if key == "eval_accuracy" else None, ms=3,
                    label=f"{r.plan} s{r.seed}")
            ref = r.curves.get("eval_ref_accuracy") if key == "eval_accuracy" else None
            if ref:                        # the same weights evaluated at bf16 (loop.eval_reference): dotted
                ax.plot(sorted(ref), [ref[s] for s in sorted(ref)], color=colors[r.plan], ls=":", marker="s", ms=2)
            if r.collapse_step is not None and r.collapse_step in series:
                ax.plot([r.collapse_step], [series[r.collapse_step]], "x", color=colors[r.plan], ms=10, mew=2)
        if log and any(v > 0 for line in ax.get_lines() for v in line.get_ydata()):
            ax.set_yscale("log")
        ax.set_title(name + (" (dotted: at bf16)" if key == "eval_accuracy" and has_reference(results) else ""))
        ax.set_xlabel("step")
    ax = axes.flat[6]
    for plan in plans:
        runs = [r for r in results if r.plan == plan and r.by_position_k3]
        spans = sorted({s for r in runs for s in r.by_position_k3}, key=lambda s: int(s.split("-")[0]))
        if spans:
            ys = [_finite_mean(r.by_position_k3.get(s) for r in runs) for s in spans]
            ax.plot(range(len(spans)), ys, "o-", color=colors[plan], label=plan)
            ax.set_xticks(range(len(spans)), spans, rotation=60, fontsize=7)
    if any(v > 0 for line in ax.get_lines() for v in line.get_ydata()):
        ax.set_yscale("log")
    ax.set_title("k3 by response position (run means)")
    axes.flat[7].axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if handles:
        axes.flat[7].legend(handles, labels, loc="center", fontsize=8, ncol=2)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return Path(path)


def write_report(runs: Path, out: Path, title: str = "", order: list[str] | None = None,
                 reference: str = "bf16") -> dict:
    """report.md (tables), report.json (every number), curves.png, from the runs under `runs`."""
    from trace_rl.audit.drift import json_safe

    results = load_runs(Path(runs), order)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = [r for r in results if r.steps > 0]      # a run that crashed before its first step says nothing
    md = [f"# {title or 'Stability study'}", "", "## Per plan (mean ± std over seeds; runs with >= 1 step)", "",
          plan_table(started, reference), "", "## Per run", "", run_table(results), ""]
    if has_reference(results):
        lacking = [f"{r.plan} seed {r.seed}" for r in results
                   if r.curves.get("eval_accuracy") and math.isnan(r.ref_final_accuracy)]
        md[-1:-1] = ["", "\"at bf16\": the same policy's held-out accuracy through a bf16 engine (loop.eval_reference; "
                     "a bf16 run's own evaluation); the other accuracies are at the plan's rollout precision."
                     + (f" Evaluated only at their own precision ('–': run without loop.eval_reference): "
                        f"{', '.join(lacking)}." if lacking else "")]
    commands = [(r.plan, r.seed, c) for r in results for c in r.commands]
    if commands:
        md += ["## Commands", "", *[f"- {p} seed {s}: `{c}`" for p, s, c in commands], ""]
    (out / "report.md").write_text("\n".join(md))
    (out / "report.json").write_text(json.dumps(json_safe({
        "runs": [{k: v for k, v in asdict(r).items() if k != "curves"} for r in results],
        "plans": verdicts(started, reference)}), indent=1))
    plot = plot_study(results, out / "curves.png", title) if results else None
    return {"runs": len(results), "markdown": "\n".join(md), "plot": str(plot) if plot else None}


__all__ = ["RunResult", "has_reference", "load_runs", "plan_table", "plot_study", "run_table", "verdicts",
           "write_report"]
