"""The study report from hand-written records: per-run numbers, the reference margin, degraded runs and
whether the pre-flight verdict predicted them."""

import json
import math

import pytest

from trace_rl.audit.study_report import load_runs, plan_table, run_table, verdicts, write_report


def write_run(runs, plan, seed, accs, k3=0.01, collapse=None, verdict=None, entropy=0.5):
    folder = runs / plan / f"seed{seed}"
    folder.mkdir(parents=True)
    records = []
    for i, acc in enumerate(accs):
        if i:
            records.append({"kind": "train", "step": i, "reward": acc, "mismatch_k3": k3, "entropy": entropy,
                            "abs_log_ratio_mean": 0.1, "ess": 0.9, "step_seconds": 2.0, "grad_norm": 1.0,
                            "mismatch_by_position/k3/0-1": k3, "correction/token_tis/frac_truncated": 0.25})
        records.append({"kind": "eval", "step": i, "eval_accuracy": acc, "eval_seconds": 4.0})
    if collapse:
        records.append({"kind": "collapse", "step": collapse, "reason": "accuracy", "detail": ""})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "summary.json").write_text("{}")
    if verdict:
        (runs / plan / "preflight.json").write_text(json.dumps({"verdict": verdict, "mismatch_k3": k3}))


def test_verdicts_against_the_bf16_reference(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "bf16", 0, [0.30, 0.40, 0.50], verdict="pass")
    write_run(runs, "bf16", 1, [0.30, 0.42, 0.46], verdict="pass")
    write_run(runs, "fp8", 0, [0.30, 0.40, 0.47], verdict="pass")                 # within the margin
    write_run(runs, "fp4", 0, [0.30, 0.20, 0.10], k3=0.03, collapse=2, verdict="fail")
    write_run(runs, "fp4-tis", 0, [0.30, 0.40, 0.48], k3=0.03, verdict="fail")
    write_run(runs, "kv-fp4", 0, [0.30, 0.40, 0.48], k3=0.02, verdict="fail")    # fail, yet not degraded
    results = load_runs(runs, ["bf16", "fp8", "fp4", "fp4-tis", "kv-fp4"])
    assert [(r.plan, r.seed) for r in results][:3] == [("bf16", 0), ("bf16", 1), ("fp8", 0)]
    fp4 = next(r for r in results if r.plan == "fp4")
    assert (fp4.start_accuracy, fp4.final_accuracy, fp4.best_accuracy) == (0.30, 0.10, 0.30)
    assert fp4.collapse_step == 2 and fp4.seconds_per_step == pytest.approx(2.0 + 3 * 4.0 / 2)
    judged = verdicts(results)
    assert judged["bf16"]["reference_mean"] == pytest.approx(0.48)
    assert judged["bf16"]["margin"] == pytest.approx(2 * math.sqrt(0.02 ** 2 * 2))   # 2 x std(0.50, 0.46) > 0.05
    assert not judged["fp8"]["degraded"]
    assert judged["fp8"]["predicted"] == "yes"                                    # pass and not degraded
    assert judged["fp4"]["degraded"] and judged["fp4"]["predicted"] == "yes"      # fail and degraded
    assert judged["fp4-tis"]["predicted"] == "corrected"
    assert judged["kv-fp4"]["predicted"] == "no"
    table = plan_table(results)
    assert "| fp4 | 1 | 0.100 | 0.300 | 1/1 (2) |" in table
    assert "0.250" in run_table(results)                                          # TIS truncated a quarter


def test_write_report_files(tmp_path):
    write_run(tmp_path / "runs", "bf16", 0, [0.3, float("nan"), 0.4])
    out = write_report(tmp_path / "runs", tmp_path / "report", title="t")
    assert out["runs"] == 1 and (tmp_path / "report" / "curves.png").is_file()
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert data["runs"][0]["plan"] == "bf16" and math.isnan(load_runs(tmp_path / "runs")[0].curves[
        "eval_accuracy"][1])
