"""`trace-rl compare`: runs per (preset, seed) on a tiny model, the side-by-side table and plot; the collapse
rule and the mean ± std aggregation on hand-made run folders; exit 2 on bad input before writing."""

import json
import math
import statistics

import pytest

from trace_rl.audit.compare import CollapseRule, aggregate_runs, steps_to_collapse
from trace_rl.cli import main

SMALL = ["--set", "model.preset=tiny-llama", "--set", "loop.steps=2", "--set", "loop.prompts_per_step=2",
         "--set", "loop.group_size=2", "--set", "loop.eval_every=0", "--set", "loop.eval_prompts=2",
         "--set", "rollout.sampling.max_new_tokens=3", "--set", "logging.plot=false"]


def test_compare_runs_each_preset_and_seed_then_aggregates(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["compare", "--presets", "bf16,fp4-tis", "--seeds", "1", *SMALL, "--out", str(out)]) == 0
    for preset in ("bf16", "fp4-tis"):
        for seed in (0,):
            run = out / preset / f"seed{seed}"
            assert (run / "summary.json").is_file() and (run / "metrics.jsonl").is_file()
            assert f"seed: {seed}" in (run / "config.yaml").read_text()
    text = capsys.readouterr().out
    assert "| bf16 | 1 |" in text and "| fp4-tis | 1 |" in text
    assert (out / "compare.png").stat().st_size > 10_000 and (out / "compare.md").is_file()
    rows = {r["preset"]: r for r in json.loads((out / "compare.json").read_text())["rows"]}
    assert rows["fp4-tis"]["mismatch_k3_mean"] > 1e-6 > abs(rows["bf16"]["mismatch_k3_mean"])
    assert [r["steps"] for r in rows["bf16"]["runs"]] == [2]
    # a second call reuses the finished runs (no new metrics lines) and aggregates the same
    before = (out / "bf16" / "seed0" / "metrics.jsonl").read_text()
    assert main(["compare", "--presets", "bf16,fp4-tis", "--seeds", "1", *SMALL, "--out", str(out)]) == 0
    assert (out / "bf16" / "seed0" / "metrics.jsonl").read_text() == before
    assert "reused" in capsys.readouterr().out


def _train(rewards, **extra):
    return [{"kind": "train", "step": i + 1, "reward": r, "loss": 0.1, "grad_norm": 1.0, **extra}
            for i, r in enumerate(rewards)]


def test_steps_to_collapse_rule():
    rule = CollapseRule(window=3, fraction=0.5, min_peak=0.05)
    assert steps_to_collapse(_train([0.2, 0.4, 0.6, 0.6, 0.5, 0.1, 0.0, 0.0]), rule) == 7
    assert steps_to_collapse(_train([0.2, 0.4, 0.6, 0.6, 0.5, 0.4, 0.5]), rule) is None
    assert steps_to_collapse(_train([0.04, 0.0, 0.0, 0.01, 0.0, 0.0]), rule) is None   # never above min_peak
    bad = _train([0.5, 0.5, 0.5])
    bad[1]["grad_norm"] = math.inf
    assert steps_to_collapse(bad, rule) == 2


def _write_run(folder, rewards, evals, k3, diverged=None):
    folder.mkdir(parents=True)
    records = [{"kind": "eval", "step": 0, "eval_reward": evals[0], "eval_accuracy": evals[0]}]
    records += [dict(r, mismatch_k3=k3, rollout_tokens_per_s=100.0, step_seconds=1.0) for r in _train(rewards)]
    records += [{"kind": "eval", "step": len(rewards), "eval_reward": evals[1], "eval_accuracy": evals[1]}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    summary = {"steps": len(rewards)} | ({"diverged": diverged} if diverged else {})
    (folder / "summary.json").write_text(json.dumps(summary))


def test_aggregate_mean_std_and_diverged_run(tmp_path):
    _write_run(tmp_path / "fp4" / "seed0", [0.3, 0.4, 0.5], (0.2, 0.5), k3=0.01)
    _write_run(tmp_path / "fp4" / "seed1", [0.3, 0.2], (0.2, 0.1), k3=0.03, diverged="gradient norm is nan")
    rows, curves = aggregate_runs(tmp_path, ["fp4"], [0, 1], CollapseRule(window=2))
    (row,) = rows
    assert row["eval_reward_final"] == pytest.approx(0.3)
    assert row["eval_reward_final_std"] == pytest.approx(statistics.stdev([0.5, 0.1]))
    assert row["eval_reward_best"] == pytest.approx(0.35)
    assert row["mismatch_k3_mean"] == pytest.approx(0.02)
    assert row["collapsed"] == 1 and row["collapse_steps"] == [None, 3]   # stopped inside step 3
    assert curves["fp4"]["reward"]["steps"] == [1, 2, 3]
    assert math.isnan(curves["fp4"]["reward"]["runs"][1][2])


@pytest.mark.parametrize("argv,needle", [
    (["--presets", "bf16,fp5"], "fp5"),
    (["--seeds", "two"], "--seeds"),
    (["--set", "loop.stepz=1"], "loop.stepz"),
    (["--collapse-fraction", "2"], "--collapse-fraction"),
    (["--set", "model.path=/no/such/model"], "/no/such/model"),
])
def test_bad_input_exits_2_before_writing(argv, needle, tmp_path, capsys):
    assert main(["compare", *argv, "--out", str(tmp_path / "c")]) == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "c").exists()


def test_unfinished_and_nan_runs_are_named_not_averaged(tmp_path):
    from trace_rl.audit.compare import compare_table

    _write_run(tmp_path / "fp4" / "seed0", [0.3, 0.4, 0.5], (0.2, 0.5), k3=0.01)
    _write_run(tmp_path / "fp4" / "seed1", [0.3, 0.2], (0.2, 0.9), k3=0.03)
    (tmp_path / "fp4" / "seed1" / "summary.json").unlink()                 # killed before it finished
    _write_run(tmp_path / "fp4" / "seed2", [0.3, 0.2, 0.1], (0.2, 0.3), k3=math.nan)
    (row,) = aggregate_runs(tmp_path, ["fp4"], [0, 1, 2])[0]
    assert row["used"] == 2 and row["unfinished"] == [{"seed": 1, "steps": 2}]
    assert row["eval_reward_final"] == pytest.approx(0.4)                  # seeds 0 and 2, not 1's 0.9
    assert row["mismatch_k3_mean"] == pytest.approx(0.01)                  # seed 2's NaN left out...
    assert row["non_finite"] == {"mismatch_k3_mean": [2]}                  # ...and named
    line = compare_table([row]).splitlines()[-1]
    assert line.startswith("| fp4 | 2/3 |")
    assert "seed 1 unfinished (2 steps), not averaged; seed 2: NaN/inf mismatch_k3_mean" in line


def test_a_collapse_the_run_recorded_counts(tmp_path):
    """A run whose own rule fired (held-out accuracy, entropy: a "collapse" record) is collapsed there, even
    when the train reward alone would not say so."""
    folder = tmp_path / "fp4" / "seed0"
    _write_run(folder, [0.3, 0.4, 0.5, 0.5], (0.2, 0.5), k3=0.01)
    with (folder / "metrics.jsonl").open("a") as f:
        f.write(json.dumps({"kind": "collapse", "step": 3, "reason": "entropy", "detail": ""}) + "\n")
    (row,), _ = aggregate_runs(tmp_path, ["fp4"], [0], CollapseRule(window=2))
    assert row["collapsed"] == 1 and row["collapse_steps"] == [3]
