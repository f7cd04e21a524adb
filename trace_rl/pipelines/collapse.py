"""Collapse detection: when a run counts as collapsed, decided while it runs and written to metrics.jsonl.

A run collapses at the first step at which one of these holds (`loop.collapse`, every threshold a field):

- **non-finite**: a train record's loss, gradient norm or entropy is NaN/Inf, or the step stopped on a
  non-finite gradient or update (the pipeline refuses to apply it: `FloatingPointError`);
- **held-out accuracy**: for `patience` evaluations in a row, held-out accuracy is below
  `accuracy_fraction` x the best held-out accuracy of the run so far (its start included), once that best
  is at least `min_accuracy` (so a policy that never solved anything cannot "collapse" by noise);
- **entropy blow-up** (`entropy_blowup` set): the mean token entropy over the last `entropy_window` train
  steps exceeds `entropy_blowup` x its mean over the run's first `entropy_window` steps: the policy turned
  to noise (what a rollout/trainer mismatch collapse looks like: entropy up, length to the cap, reward down).

The first collapse is logged once, as `{"kind": "collapse", "step": s, "reason": ..., "rule": ...}`, and the
run's summary carries `collapse_step` / `collapse_reason`. With `stop: true` the run ends there (checkpoint
saved, final evaluation, summary), which saves the rest of a budget. The monitor's state is a pure function
of the records, so a resumed run rebuilds it from metrics.jsonl (`replay`).
"""

from __future__ import annotations

import math

from pydantic import Field

from trace_rl.config import TraceConfig


class CollapseSection(TraceConfig):
    """When a run counts as collapsed (`trace_rl.pipelines.collapse`); recorded in metrics.jsonl."""

    enabled: bool = Field(True, description="Watch the run for collapse and record the first one.")
    accuracy_fraction: float = Field(
        0.5, gt=0.0, le=1.0, description="Held-out accuracy below this x its best so far counts as a collapsed "
                                         "evaluation.")
    patience: int = Field(2, ge=1, description="Collapsed evaluations in a row that make a collapse.")
    min_accuracy: float = Field(
        0.05, ge=0.0, le=1.0, description="The accuracy rule applies once the run's best held-out accuracy is at "
                                          "least this.")
    entropy_window: int = Field(5, ge=1, description="Train steps averaged by the entropy rule (first and last).")
    entropy_blowup: float | None = Field(
        3.0, gt=0.0, description="Collapse when the trailing mean entropy exceeds this x the mean of the first "
                                 "entropy_window steps (None: no entropy rule).")
    stop: bool = Field(False, description="End the run at the collapse (checkpoint, final evaluation, summary).")


def _finite(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and math.isfinite(float(value)))


class CollapseMonitor:
    """Feed it every record (`update`); it returns a collapse record the first time the rule fires."""

    def __init__(self, rule: CollapseSection | None = None):
        self.rule = rule or CollapseSection()
        self.collapse: dict | None = None
        self._best = -math.inf
        self._below: list[int] = []          # steps of the current run of collapsed evaluations
        self._entropy: list[float] = []

    def replay(self, history: list[dict]) -> None:
        """Rebuild the state from a run's records (a resumed run); a logged collapse is taken as it is."""
        for record in history:
            if record.get("kind") == "collapse":
                self.collapse = record
            elif self.collapse is None:
                self.update(record)

    def non_finite(self, step: int, detail: str) -> dict | None:
        """A step stopped on a non-finite gradient or update (the record of that step is never logged)."""
        return self._fire(step, "non-finite", detail)

    def update(self, record: dict) -> dict | None:
        if not self.rule.enabled or self.collapse is not None:
            return None
        kind, step = record.get("kind"), record.get("step", 0)
        if kind == "train":
            bad = [k for k in ("loss", "grad_norm", "entropy") if not _finite(record.get(k))]
            if bad:
                return self._fire(step, "non-finite", f"{', '.join(f'{k} = {record[k]}' for k in bad)}")
            return self._entropy_rule(step, record.get("entropy"))
        if kind == "eval" and record.get("eval_accuracy") is not None:
            return self._accuracy_rule(step, float(record["eval_accuracy"]))
        return None

    def _accuracy_rule(self, step: int, acc: float) -> dict | None:
        r = self.rule
        best = self._best
        if best >= r.min_accuracy and acc < r.accuracy_fraction * best:
            self._below.append(step)
        else:
            self._below = []
        self._best = max(best, acc)
        if len(self._below) >= r.patience:
            return self._fire(step, "accuracy", f"held-out accuracy {acc:.3g} < {r.accuracy_fraction:g} x best "
                                                f"{best:.3g} at {len(self._below)} evaluations in a row (steps "
                                                f"{', '.join(map(str, self._below))})")
        return None

    def _entropy_rule(self, step: int, entropy) -> dict | None:
        r = self.rule
        if r.entropy_blowup is None or entropy is None:
            return None
        self._entropy.append(float(entropy))
        w = r.entropy_window
        if len(self._entropy) < 2 * w:      # the first window is the baseline; compare a disjoint later window
            return None
        start = sum(self._entropy[:w]) / w
        trailing = sum(self._entropy[-w:]) / w
        if trailing > r.entropy_blowup * start:
            return self._fire(step, "entropy", f"mean entropy of the last {w} steps {trailing:.3g} > "
                                               f"{r.entropy_blowup:g} x {start:.3g} (mean of the first {w})")
        return None

    def _fire(self, step: int, reason: str, detail: str) -> dict | None:
        if not self.rule.enabled or self.collapse is not None:
            return None
        self.collapse = {"kind": "collapse", "step": step, "reason": reason, "detail": detail,
                         "rule": self.rule.to_dict()}
        return self.collapse


def recorded_collapse(history: list[dict]) -> dict | None:
    """The collapse record of a run's history (None: it did not collapse, or ran without the monitor)."""
    return next((r for r in history if r.get("kind") == "collapse"), None)


__all__ = ["CollapseMonitor", "CollapseSection", "recorded_collapse"]
