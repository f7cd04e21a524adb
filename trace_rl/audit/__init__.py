"""Drift audit and the stability study: `trace-rl drift` (rollout vs trainer mismatch per plan, overall and
by token position) and `trace-rl compare` (one config under several presets and seeds, side by side).

docs/drift.md and docs/stability.md describe both; the heavy imports happen inside the functions.
"""

from trace_rl.audit.compare import CollapseRule, aggregate_runs, run_compare, steps_to_collapse
from trace_rl.audit.drift import DriftAudit, PlanDrift, check_thresholds, parse_thresholds, resolve_plans

__all__ = ["CollapseRule", "DriftAudit", "PlanDrift", "aggregate_runs", "check_thresholds", "parse_thresholds",
           "resolve_plans", "run_compare", "steps_to_collapse"]
