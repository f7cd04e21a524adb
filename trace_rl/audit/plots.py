"""PNG plots of the audit (matplotlib, Agg): drift by response position per plan, and compare curves."""

from __future__ import annotations

import math
from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _span(edges: list[int], i: int) -> str:
    return f"{edges[i]}" if edges[i + 1] - edges[i] == 1 else f"{edges[i]}-{edges[i + 1] - 1}"


def plot_drift_by_position(results, path: Path, title: str = "") -> Path:
    """Mean |log ρ| and k3 by response-position bin, one line per plan (log y; a plan with no drift at all
    is drawn at the bottom of the axis and says so in its legend)."""
    plt = _pyplot()
    edges = results[0].by_position.edges
    x = list(range(len(edges) - 1))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    for ax, key, label in ((axes[0], "abs_log_ratio", "mean |log ρ| (rollout vs trainer)"),
                           (axes[1], "k3", "mismatch k3 (KL estimate)")):
        floor = min((v for r in results for v in getattr(r.by_position, key) if v > 0 and math.isfinite(v)),
                    default=1e-8) / 10
        for r in results:
            y = getattr(r.by_position, key)
            zero = all(v == 0 for v in y if math.isfinite(v))
            shown = [max(v, floor) if math.isfinite(v) else math.nan for v in y]
            ax.plot(x, shown, "o-", ms=3, label=f"{r.name} ({r.plan.label}, trainer {r.plan.trainer})"
                                                 + (": 0 everywhere" if zero else ""))
        ax.set_yscale("log")
        ax.set_xticks(x, [_span(edges, i) for i in x], rotation=45 if len(x) > 8 else 0, fontsize=8)
        ax.set_xlabel("response token position (bin)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    ncol = min(len(labels), 3)
    fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.04 + 0.045 * math.ceil(len(labels) / ncol), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_compare(curves: dict[str, dict], path: Path, title: str = "") -> Path:
    """Train reward, mismatch_k3 and held-out reward over steps: one line per preset (mean over seeds),
    the band between the seeds' min and max shaded; an x marks a seed's collapse step."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    panels = (("reward", "train reward"), ("mismatch_k3", "mismatch_k3 (log)"), ("eval_reward", "held-out reward"))
    for ax, (key, label) in zip(axes, panels):
        for i, (preset, c) in enumerate(curves.items()):
            color = f"C{i}"
            steps, runs = c[key]["steps"], c[key]["runs"]
            if not steps:
                continue
            cols = [[run[j] for run in runs if j < len(run) and math.isfinite(run[j])] for j in range(len(steps))]
            mean = [sum(v) / len(v) if v else math.nan for v in cols]
            lo = [min(v) if v else math.nan for v in cols]
            hi = [max(v) if v else math.nan for v in cols]
            ax.plot(steps, mean, "-" if key != "eval_reward" else "o-", color=color, ms=3,
                    label=f"{preset} ({len(runs)} seeds)")
            ax.fill_between(steps, lo, hi, color=color, alpha=0.15, linewidth=0)
            if key == "reward":
                for step in c.get("collapse_steps", []):
                    if step is not None:
                        ax.plot([step], [0], "x", color=color, ms=8)
        if key == "mismatch_k3":
            ax.set_yscale("log")
        ax.set_xlabel("step")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_drift_json(json_path: Path, path: Path, title: str = "") -> Path:
    """Redraw `plot_drift_by_position` from a drift.json (`trace-rl drift` output)."""
    import json
    from types import SimpleNamespace

    from trace_rl.correction.metrics import PositionMismatch
    from trace_rl.plan import PrecisionPlan

    def nan(values):   # JSON holds NaN as null
        return [math.nan if v is None else v for v in values]

    record = json.loads(Path(json_path).read_text())
    results = [SimpleNamespace(name=p["name"], plan=PrecisionPlan.parse(p["plan"]), by_position=PositionMismatch(
        edges=p["by_position"]["edges"], count=p["by_position"]["count"],
        abs_log_ratio=nan(p["by_position"]["abs_log_ratio"]), k1=nan(p["by_position"]["k1"]),
        k3=nan(p["by_position"]["k3"]))) for p in record["plans"]]
    title = title or f"{record['model']}: rollout vs trainer drift by position"
    return plot_drift_by_position(results, Path(path), title)
