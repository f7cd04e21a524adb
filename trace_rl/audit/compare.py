"""`run_compare`: one pipeline config under several presets and seeds, each run in its own folder
(<out>/<preset>/seed<k>), then one side-by-side table and plot over all of them.

Steps to collapse (`CollapseRule`, documented in docs/stability.md): the first step at which
  - the loss or the gradient norm is not finite, or the run stopped on a non-finite gradient; or
  - the trailing mean of the train reward over `window` steps falls below `fraction` x the best trailing
    mean seen so far, once that best is at least `min_peak` (so noise around a zero reward is no collapse); or
  - the run recorded a collapse while it ran (`loop.collapse`: held-out accuracy, entropy; a "collapse"
    record in metrics.jsonl, `trace_rl.pipelines.collapse`).
None: no collapse within the run.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DONE_FILE = "summary.json"


@dataclass(frozen=True)
class CollapseRule:
    window: int = 5
    fraction: float = 0.5
    min_peak: float = 0.05


def steps_to_collapse(train: list[dict], rule: CollapseRule = CollapseRule()) -> int | None:
    """The step at which a run collapsed (see the module doc), or None. `train` = its train records."""
    best, recent = -math.inf, []
    for r in train:
        if not all(math.isfinite(float(r.get(k, 0.0))) for k in ("loss", "grad_norm")):
            return r["step"]
        recent = (recent + [float(r["reward"])])[-rule.window:]
        if len(recent) < rule.window:
            continue
        trailing = sum(recent) / len(recent)
        if best >= rule.min_peak and trailing < rule.fraction * best:
            return r["step"]
        best = max(best, trailing)
    return None


def run_one(cfg, run_dir: Path, rerun: bool = False, log=print) -> dict:
    """Run one config into `run_dir` (reused when it holds a finished run and not `rerun`)."""
    from trace_rl.pipelines import build

    done = run_dir / DONE_FILE
    if done.is_file() and not rerun:
        log(f"{run_dir}: finished earlier, reused")
        return json.loads(done.read_text())
    pipeline = build(cfg, run_dir)
    t0 = time.perf_counter()
    try:
        summary = pipeline.run(overwrite=True)   # an unfinished earlier run there starts again from scratch
    except FloatingPointError as err:    # the pipeline stops before non-finite gradients corrupt the weights
        summary = {"diverged": str(err), "steps": pipeline.step, "wall_seconds": time.perf_counter() - t0}
    done.write_text(json.dumps(summary, indent=2, default=float))
    log(f"{run_dir}: {summary.get('steps')} steps in {summary['wall_seconds']:.0f}s"
        + (f", DIVERGED: {summary['diverged']}" if "diverged" in summary else ""))
    return summary


def run_compare(configs: dict[str, dict[int, object]], out_dir: Path, rerun: bool = False, log=print) -> None:
    """configs[preset][seed] = PipelineConfig. Seeds outer, presets inner: stopped early, the finished runs
    still cover every preset."""
    seeds = list(next(iter(configs.values())))
    for seed in seeds:
        for preset, by_seed in configs.items():
            run_one(by_seed[seed], out_dir / preset / f"seed{seed}", rerun, log)


MEAN_KEYS = ("eval_reward_final", "eval_reward_best", "eval_accuracy_final", "eval_accuracy_start",
             "train_reward_last5", "mismatch_k3_mean", "rollout_tokens_per_s", "step_seconds")


def _series(records: list[dict], key: str) -> dict[int, float]:
    return {r["step"]: float(r[key]) if r.get(key) is not None else math.nan for r in records if key in r}


def _stats(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and math.isfinite(v)]
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else math.nan


def aggregate_runs(out_dir: Path, presets: list[str], seeds: list[int],
                   rule: CollapseRule = CollapseRule()) -> tuple[list[dict], dict[str, dict]]:
    """(one row per preset with mean ± std over seeds, curves per preset for `plot_compare`)."""
    from trace_rl.pipelines.collapse import recorded_collapse
    from trace_rl.pipelines.run_log import read_history

    rows, curves = [], {}
    for preset in presets:
        runs = []
        for seed in seeds:
            run_dir = out_dir / preset / f"seed{seed}"
            history = read_history(run_dir)
            train = [r for r in history if r.get("kind") == "train"]
            evals = [r for r in history if r.get("kind") == "eval"]
            summary_file = run_dir / DONE_FILE
            summary = json.loads(summary_file.read_text()) if summary_file.is_file() else {}
            collapse = steps_to_collapse(train, rule)
            if collapse is None and "diverged" in summary:
                collapse = summary.get("steps", len(train)) + 1   # stopped inside the step after the last record
            recorded = recorded_collapse(history)     # the run's own rule (loop.collapse), when it fired
            if recorded is not None:
                collapse = recorded["step"] if collapse is None else min(collapse, recorded["step"])
            speeds = [r["rollout_tokens_per_s"] for r in train[1:] or train]   # step 1 includes warm-up
            runs.append({
                "seed": seed, "dir": str(run_dir), "finished": summary_file.is_file(), "steps": len(train),
                "eval_reward_final": evals[-1]["eval_reward"] if evals else math.nan,
                "eval_reward_best": max((r["eval_reward"] for r in evals), default=math.nan),
                "eval_accuracy_final": evals[-1]["eval_accuracy"] if evals else math.nan,
                "eval_accuracy_start": evals[0]["eval_accuracy"] if evals else math.nan,
                "train_reward_last5": statistics.fmean(r["reward"] for r in train[-5:]) if train else math.nan,
                "mismatch_k3_mean": statistics.fmean(r["mismatch_k3"] for r in train) if train else math.nan,
                "rollout_tokens_per_s": statistics.median(speeds) if speeds else math.nan,
                "step_seconds": statistics.median(r["step_seconds"] for r in train) if train else math.nan,
                "collapse_step": collapse, "diverged": summary.get("diverged"),
                "curves": {k: _series(train, k) for k in ("reward", "mismatch_k3")} | {
                    "eval_reward": _series(evals, "eval_reward")},
            })
        row = {"preset": preset, "seeds": len(runs), "runs": [{k: v for k, v in r.items() if k != "curves"}
                                                              for r in runs]}
        # means over the finished runs only, and per metric over the finite values only; what was left out
        # is named (the table's notes), never averaged in or dropped silently
        finished = [r for r in runs if r["finished"]]
        row["unfinished"] = [{"seed": r["seed"], "steps": r["steps"]} for r in runs if not r["finished"]]
        row["non_finite"] = {}
        for key in MEAN_KEYS:
            values = [r[key] for r in finished]
            bad = [r["seed"] for r in finished if r[key] is None or not math.isfinite(r[key])]
            if bad:
                row["non_finite"][key] = bad
            row[key], row[f"{key}_std"] = _stats(values)
        row["used"] = len(finished)
        row["collapsed"] = sum(r["collapse_step"] is not None for r in runs)
        row["collapse_steps"] = [r["collapse_step"] for r in runs]
        rows.append(row)
        curves[preset] = {"collapse_steps": row["collapse_steps"]}
        for key in ("reward", "mismatch_k3", "eval_reward"):
            steps = sorted({s for r in runs for s in r["curves"][key]})
            curves[preset][key] = {"steps": steps,
                                   "runs": [[r["curves"][key].get(s, math.nan) for s in steps] for r in runs]}
    return rows, curves


def _pm(mean: float, std: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" + ("" if math.isnan(std) else f" ± {std:.{digits}f}")


def row_notes(row: dict) -> str:
    """What a row's means leave out: unfinished runs, non-finite values (by seed)."""
    notes = [f"seed {u['seed']} unfinished ({u['steps']} steps), not averaged" for u in row.get("unfinished", [])]
    by_seed: dict[int, list[str]] = {}
    for key, seeds in row.get("non_finite", {}).items():
        for seed in seeds:
            by_seed.setdefault(seed, []).append(key)
    notes += [f"seed {seed}: NaN/inf {', '.join(keys)}, left out of those means" for seed, keys in by_seed.items()]
    return "; ".join(notes)


def compare_table(rows: list[dict]) -> str:
    """Markdown: one row per preset, mean ± std over its finished seeds (the seeds column says "used/all"
    when some are not; notes name what was left out)."""
    head = ("| preset | seeds | held-out reward: final | best | held-out acc: start → final | train reward (last 5) "
            "| collapsed (step) | mean mismatch_k3 | rollout tokens/s | s/step | notes |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        collapsed = f"{r['collapsed']}/{r['seeds']}" + (
            f" ({', '.join(str(s) for s in r['collapse_steps'] if s is not None)})" if r["collapsed"] else "")
        k3 = "–" if math.isnan(r["mismatch_k3_mean"]) else f"{r['mismatch_k3_mean']:.3g}"
        used = r.get("used", r["seeds"])
        seeds = str(r["seeds"]) if used == r["seeds"] else f"{used}/{r['seeds']}"
        lines.append(
            f"| {r['preset']} | {seeds} | {_pm(r['eval_reward_final'], r['eval_reward_final_std'])} "
            f"| {_pm(r['eval_reward_best'], r['eval_reward_best_std'])} "
            f"| {_pm(r['eval_accuracy_start'], r['eval_accuracy_start_std'])} → "
            f"{_pm(r['eval_accuracy_final'], r['eval_accuracy_final_std'])} "
            f"| {_pm(r['train_reward_last5'], r['train_reward_last5_std'])} | {collapsed} | {k3} "
            f"| {_pm(r['rollout_tokens_per_s'], r['rollout_tokens_per_s_std'], 0)} "
            f"| {_pm(r['step_seconds'], math.nan, 1)} | {row_notes(r) or '–'} |")
    return "\n".join(lines)


def write_compare(out_dir: Path, presets: list[str], seeds: list[int], rule: CollapseRule, title: str = "") -> dict:
    """Aggregate the runs under `out_dir` into compare.json, compare.md and compare.png."""
    from trace_rl.audit.drift import json_safe
    from trace_rl.audit.plots import plot_compare

    rows, curves = aggregate_runs(out_dir, presets, seeds, rule)
    table = compare_table(rows)
    (out_dir / "compare.md").write_text(table + "\n")
    (out_dir / "compare.json").write_text(json.dumps(json_safe({
        "presets": presets, "seeds": seeds, "collapse_rule": asdict(rule), "rows": rows, "curves": curves}),
        indent=2))
    plot = plot_compare(curves, out_dir / "compare.png", title)
    return {"rows": rows, "table": table, "plot": str(plot)}
