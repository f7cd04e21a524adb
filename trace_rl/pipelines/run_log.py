"""Run outputs: metrics.jsonl, torchrl loggers (csv, TensorBoard, W&B, MLflow), a progress bar, the summary table
and curves.png."""

from __future__ import annotations

import json
import logging
import math
import sys
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("trace_rl")
PROGRESS_KEYS = (("reward", "reward"), ("acc", "correct"), ("k3", "mismatch_k3"))


class RunLog:
    def __init__(self, run_dir: Path, jsonl: bool = True, tensorboard: bool = False, progress: bool = True,
                 total_steps: int = 0, start_step: int = 0, loggers: tuple[str, ...] = (), wandb: dict | None = None,
                 mlflow: dict | None = None, masked_alarm: tuple[float, Callable[[dict], str]] | None = None):
        """`start_step` > 0: a resumed run (metrics.jsonl was truncated to that step; the loggers' records
        after it are dropped, see `trace_rl.pipelines.loggers`). `loggers`: torchrl loggers (csv,
        tensorboard, wandb, mlflow); `tensorboard=True` adds tensorboard. `masked_alarm`: (share, message of a
        record): a train record whose frac_masked_tokens reaches the share is warned about (log + bar)."""
        from trace_rl.pipelines.loggers import MetricLoggers

        self.run_dir = run_dir
        self.history: list[dict] = []
        self.start_step = start_step
        self.masked_alarm = masked_alarm
        names = tuple(dict.fromkeys([*loggers, *(["tensorboard"] if tensorboard else [])]))
        self.loggers = MetricLoggers(run_dir, names, start_step=start_step, wandb=wandb, mlflow=mlflow)
        self._jsonl = (run_dir / "metrics.jsonl").open("a") if jsonl else None
        self._bar = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total_steps, initial=start_step, desc="trace-rl", unit="step", dynamic_ncols=True)

    def log(self, record: dict) -> None:
        self.history.append(record)
        if self._jsonl:
            self._jsonl.write(json.dumps(record, default=float) + "\n")
            self._jsonl.flush()
        self.loggers.log(record)
        alarm = (self.masked_alarm is not None and record.get("kind") == "train"
                 and record.get("frac_masked_tokens", 0.0) >= self.masked_alarm[0])
        if alarm:
            message = self.masked_alarm[1](record)
            if self._bar is not None:        # above the bar (a bare stderr print would break its line)
                self._bar.write(f"trace-rl: warning: {message}", file=sys.stderr)
            if self._bar is None or log.hasHandlers():
                log.warning(message)
        if self._bar is not None and record.get("kind") == "train":
            self._bar.update(1)
            postfix = {short: f"{record[key]:.3g}" for short, key in PROGRESS_KEYS if key in record}
            if alarm:
                postfix["MASKED"] = f"{record['frac_masked_tokens']:.0%}"
            self._bar.set_postfix(postfix)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._jsonl:
            self._jsonl.close()
        self.loggers.close()


def _records(text: str, path: Path) -> list[dict]:
    """The records of a metrics.jsonl text. A last line without its newline is a record torn by a kill
    mid-write: it is left out. Any other unparsable line is an error naming it."""
    lines = text.split("\n")[:-1]    # the part after the last newline is "" or a torn record
    out = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{i}: not a JSON record ({err.msg}); the metrics file was edited or "
                             f"corrupted") from None
    return out


def read_history(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    return _records(path.read_text(), path) if path.exists() else []


def truncate_metrics(run_dir: Path, step: int) -> int:
    """Before a resumed run continues from a checkpoint at `step`: keep the records up to that step, drop
    those logged after it (the resumed run logs them again) and a torn last line. Rewritten atomically.
    Returns the number of records dropped."""
    from trace_rl.pipelines.run_dir import write_text_atomic

    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return 0
    text = path.read_text()
    records = _records(text, path)
    keep = [r for r in records if int(r.get("step", 0)) <= step]
    if len(keep) != len(records) or (text and not text.endswith("\n")):
        write_text_atomic(path, "".join(json.dumps(r, default=float) + "\n" for r in keep))
    return len(records) - len(keep)


def plot_curves(history: list[dict], path: Path, title: str = "") -> Path:
    """reward/accuracy, mismatch_k3 and ess over steps (eval accuracy as markers)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in history if r.get("kind") == "train"]
    evals = [r for r in history if r.get("kind") == "eval"]
    steps = [r["step"] for r in train]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    ax = axes[0]
    ax.plot(steps, [r.get("reward", math.nan) for r in train], label="train reward")
    ax.plot(steps, [r.get("correct", math.nan) for r in train], label="train accuracy")
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_accuracy"] for r in evals], "o-", label="held-out accuracy")
    ax.set_xlabel("step")
    ax.legend()
    ax.set_title("reward / accuracy")
    for ax, key in zip(axes[1:], ("mismatch_k3", "ess")):
        ax.plot(steps, [r.get(key, math.nan) for r in train])
        ax.set_xlabel("step")
        ax.set_title(key)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summarize(history: list[dict], wall_seconds: float) -> dict:
    train = [r for r in history if r.get("kind") == "train"]
    evals = [r for r in history if r.get("kind") == "eval"]
    collapse = next((r for r in history if r.get("kind") == "collapse"), None)
    refs = [r["eval_ref_accuracy"] for r in evals if "eval_ref_accuracy" in r]     # loop.eval_reference
    reference = {"eval_ref_accuracy_start": refs[0], "eval_ref_accuracy_end": refs[-1],
                 "eval_ref_accuracy_best": max(refs)} if refs else {}
    return {
        "steps": len(train),
        "eval_accuracy_start": evals[0]["eval_accuracy"] if evals else None,
        "eval_accuracy_end": evals[-1]["eval_accuracy"] if evals else None,
        "eval_accuracy_best": max((r["eval_accuracy"] for r in evals), default=None),
        **reference,
        "reward_first": _mean([r["reward"] for r in train[:5]]) if train else None,
        "reward_last": _mean([r["reward"] for r in train[-5:]]) if train else None,
        "mismatch_k3_mean": _mean([r["mismatch_k3"] for r in train]) if train else None,
        "ess_mean": _mean([r["ess"] for r in train]) if train else None,
        "rollout_tokens_per_s": _mean([r["rollout_tokens_per_s"] for r in train]) if train else None,
        "step_seconds_median": sorted(r["step_seconds"] for r in train)[len(train) // 2] if train else None,
        "collapse_step": collapse["step"] if collapse else None,
        "collapse_reason": f"{collapse['reason']}: {collapse['detail']}" if collapse else None,
        "wall_seconds": wall_seconds,
    }


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def summary_table(summary: dict) -> str:
    rows = [
        ("held-out accuracy (start)", summary.get("eval_accuracy_start")),
        ("held-out accuracy (end)", summary.get("eval_accuracy_end")),
        *([("held-out accuracy at bf16 (start)", summary["eval_ref_accuracy_start"]),
           ("held-out accuracy at bf16 (end)", summary["eval_ref_accuracy_end"])]
          if "eval_ref_accuracy_start" in summary else []),     # loop.eval_reference
        ("train reward (first 5 steps)", summary.get("reward_first")),
        ("train reward (last 5 steps)", summary.get("reward_last")),
        ("mean mismatch_k3", summary.get("mismatch_k3_mean")),
        ("mean ess", summary.get("ess_mean")),
        ("rollout tokens/s", summary.get("rollout_tokens_per_s")),
        ("wall time (s)", summary.get("wall_seconds")),
    ]
    width = max(len(name) for name, _ in rows)
    lines = [f"{'metric':{width}s}  value", "-" * (width + 12)]
    for name, value in rows:
        text = "–" if value is None else (f"{value:.4g}" if isinstance(value, float) else str(value))
        lines.append(f"{name:{width}s}  {text}")
    return "\n".join(lines)
