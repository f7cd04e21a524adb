"""The study's time estimates (`status`, `--only-finishable`): a plan's measured step time where a run of it
has steps (or an earlier attempt's, kept in its status), else a conservative default: the larger of the a priori
EST_STEP_SECONDS and the slowest measured plan, times UNMEASURED_FACTOR of its trainer (guided: 2)."""

import json

import stability_status as ST
from stability_spec import EST_STEP_SECONDS, LAUNCH_SECONDS, Study


def make_study(tmp_path, step_seconds: dict[str, list[float]]):
    """A study of 150-step runs, seed 0 of bf16, fp4-tis, fp4-guided and kv-fp4; `step_seconds`: plan -> the
    step times its run logged."""
    study = Study(tmp_path, {"preset": "gpu", "order": ["bf16:0", "fp4-tis:0", "fp4-guided:0", "kv-fp4:0"],
                             "steps": 150, "set": {}})
    study.save()
    for plan, times in step_seconds.items():
        run = study.run_dir(plan, 0)
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"kind": "train", "step": i + 1, "step_seconds": t})
                                                   + "\n" for i, t in enumerate(times)))
    return study


def test_unmeasured_plans_are_estimated_conservatively(tmp_path):
    study = make_study(tmp_path / "a", {"bf16": [2.0, 2.0, 9.0], "fp4-tis": [5.0, 5.3, 5.6]})
    measured = ST.measured_step_seconds(study)
    assert measured == {"bf16": [2.0], "fp4-tis": [5.3]}
    assert ST.step_estimate(study, "bf16", measured) == 2.0 * 1.1
    assert ST.step_estimate(study, "fp4-guided", measured) == 5.3 * ST.UNMEASURED_FACTOR["guided"]
    assert ST.step_estimate(study, "kv-fp4", measured) == 5.3                    # the slowest measured plan
    assert ST.seconds_left(study, "fp4-guided", 0) == (150, 150 * 10.6 + LAUNCH_SECONDS)
    assert ST.seconds_left(study, "fp4-guided", 0, sharing=1.85)[1] == 150 * 10.6 * 1.85 + LAUNCH_SECONDS
    assert "fp4-guided       seed 0: pending         0/150 steps, ~27 min left (step time not measured: ~10.6 s)" \
        in ST.status_text(study)

    nothing = make_study(tmp_path / "b", {})                                     # nothing measured: the priors
    assert ST.step_estimate(nothing, "fp4-guided", {}) == EST_STEP_SECONDS["fp4-guided"] * 2
    assert ST.step_estimate(nothing, "kv-fp4", {}) == EST_STEP_SECONDS["kv-fp4"]


def test_a_failed_attempts_step_time_is_kept(tmp_path):
    """A restart from step 0 (--overwrite) drops the records; launch keeps their median in the run's status."""
    study = make_study(tmp_path, {"bf16": [2.0]})
    study.set_status("fp4-guided", 0, {"state": "oom-shared", "measured_step_seconds": 15.0})
    assert ST.measured_step_seconds(study)["fp4-guided"] == [15.0]
    assert ST.step_estimate(study, "fp4-guided", ST.measured_step_seconds(study)) == 15.0 * 1.1
