"""The study report from hand-written records: per-run numbers, the reference margin, degraded runs and
whether the pre-flight verdict predicted them."""

import json
import math

import pytest

from trace_rl.audit.study_report import load_runs, plan_table, run_table, verdicts, write_report


def write_run(runs, plan, seed, accs, k3=0.01, collapse=None, verdict=None, entropy=0.5, ref=None, bf16=None):
    """`ref`: eval_ref_accuracy per evaluation (loop.eval_reference); `bf16`: write a config.yaml whose rollout is
    bf16 (True) or nvfp4 (False)."""
    folder = runs / plan / f"seed{seed}"
    folder.mkdir(parents=True)
    if bf16 is not None:
        fmt = "bf16" if bf16 else "nvfp4"
        (folder / "config.yaml").write_text(f"loop: {{steps: {len(accs) - 1}}}\nprecision: {{rollout_weights: {fmt}, "
                                            f"rollout_activations: {fmt}, kv_cache: {fmt}}}\n")
    records = []
    for i, acc in enumerate(accs):
        if i:
            records.append({"kind": "train", "step": i, "reward": acc, "mismatch_k3": k3, "entropy": entropy,
                            "abs_log_ratio_mean": 0.1, "ess": 0.9, "step_seconds": 2.0, "grad_norm": 1.0,
                            "mismatch_by_position/k3/0-1": k3, "correction/token_tis/frac_truncated": 0.25})
        records.append({"kind": "eval", "step": i, "eval_accuracy": acc, "eval_seconds": 4.0,
                        **({"eval_ref_accuracy": ref[i], "eval_ref_seconds": 1.0} if ref else {})})
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


def test_reference_accuracy_columns(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "bf16", 0, [0.6, 0.8, 0.9], bf16=True)                     # its own eval is at bf16
    write_run(runs, "fp4", 0, [0.3, 0.6, 0.7], bf16=False)                     # started before: none
    write_run(runs, "fp4", 1, [0.3, 0.5, 0.7], bf16=False, ref=[0.6, 0.85, 0.8])
    results = load_runs(runs, ["bf16", "fp4"])
    bf16, fp4_0, fp4_1 = results
    assert (bf16.ref_start_accuracy, bf16.ref_final_accuracy, bf16.ref_best_accuracy) == (0.6, 0.9, 0.9)
    assert math.isnan(fp4_0.ref_start_accuracy) and math.isnan(fp4_0.ref_best_accuracy)
    assert (fp4_1.ref_start_accuracy, fp4_1.ref_final_accuracy, fp4_1.ref_best_accuracy) == (0.6, 0.8, 0.85)
    assert fp4_1.seconds_per_step == pytest.approx(2.0 + 3 * (4.0 + 1.0) / 2)   # the bf16 eval's time counts
    table = run_table(results)
    assert "| at bf16: start → final | best at bf16 |" in table
    assert "| bf16 | 0 | interrupted | 2/2 | 0.600 → 0.900 | 0.900 | 0.600 → 0.900 | 0.900 |" in table
    assert "| fp4 | 0 | interrupted | 2/2 | 0.300 → 0.700 | 0.700 | – → – | – |" in table
    assert "| fp4 | 1 | interrupted | 2/2 | 0.300 → 0.700 | 0.700 | 0.600 → 0.800 | 0.850 |" in table
    assert "| fp4 | 2 | 0.700 ± 0.000 | 0.700 ± 0.000 | 0.800 |" in plan_table(results)
    judged = verdicts(results)
    assert judged["fp4"]["policy_degraded"] is None                           # seed 0 has no bf16 evaluation
    assert verdicts([bf16, fp4_1])["fp4"]["policy_degraded"] is True           # 0.8 < 0.9 - 0.05
    assert verdicts([bf16, fp4_1])["fp4"]["degraded"] is True                  # 0.7 < 0.85
    report = write_report(runs, tmp_path / "report")["markdown"]
    assert "Evaluated only at their own precision" in report and "fp4 seed 0." in report


def test_no_reference_columns_without_reference_evals(tmp_path):
    write_run(tmp_path / "runs", "bf16", 0, [0.6, 0.8], bf16=True)
    write_run(tmp_path / "runs", "fp4", 0, [0.3, 0.6], bf16=False)
    results = load_runs(tmp_path / "runs")
    assert "at bf16" not in run_table(results) and "at bf16" not in plan_table(results)


def test_order_with_second_seeds_keeps_each_plans_first_place(tmp_path):
    """The study's order names a plan again for its second seed: the plan's first place decides."""
    runs = tmp_path / "runs"
    for plan in ("bf16", "fp4", "fp4-tis"):
        write_run(runs, plan, 0, [0.3, 0.4])
    order = ["bf16", "fp4", "fp4-tis", "bf16", "fp4"]
    assert [r.plan for r in load_runs(runs, order)] == ["bf16", "fp4", "fp4-tis"]


def test_a_run_that_crashed_before_its_first_step_is_left_out_of_the_plan_table(tmp_path):
    runs = tmp_path / "runs"
    write_run(runs, "bf16", 0, [0.6, 0.9])
    write_run(runs, "fp4-guided", 0, [0.3])                   # evaluated at step 0, then crashed
    (runs / "fp4-guided" / "seed0" / "summary.json").unlink()
    report = write_report(runs, tmp_path / "report")["markdown"]
    per_plan, per_run = report.split("## Per run")
    assert "| fp4-guided |" not in per_plan and "| fp4-guided | 0 |" in per_run
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    assert "fp4-guided" not in data["plans"]
