"""A shortened run on CPU writes its outputs and logs metrics; resuming reproduces the uninterrupted run."""

import json
import math

from trace_rl.cli import main
from trace_rl.pipelines import build, default_config
from trace_rl.pipelines.run_log import read_history

TIMING = ("rollout_seconds", "step_seconds", "rollout_tokens_per_s")


def small(steps: int, **extra):
    return default_config().with_overrides({
        "loop.steps": steps, "loop.prompts_per_step": 4, "loop.group_size": 4, "loop.eval_every": 0,
        "loop.eval_prompts": 8, "logging.progress": False, "logging.plot": False, **extra})


def train_records(run_dir):
    return [{k: v for k, v in r.items() if k not in TIMING} for r in read_history(run_dir) if r["kind"] == "train"]


def test_short_run_writes_outputs(tmp_path, capsys):
    assert main(["run", "--set", "loop.steps=2", "--set", "loop.prompts_per_step=4", "--set", "loop.group_size=4",
                 "--set", "loop.eval_prompts=8", "--set", "logging.progress=false", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "held-out accuracy" in out and "curves.png" in out
    for name in ("config.yaml", "metrics.jsonl", "summary.json", "curves.png", "checkpoint/state.json"):
        assert (tmp_path / "r" / name).exists(), name
    history = read_history(tmp_path / "r")
    train = [r for r in history if r["kind"] == "train"]
    assert len(train) == 2 and all(math.isfinite(r["loss"]) for r in train)
    for key in ("mismatch_k3", "ess", "reward", "correct", "abs_log_ratio_max", "chi2_seq", "frac_masked_tokens"):
        assert key in train[0], key
    assert train[0]["mismatch_k3"] > 0            # FP4 rollout vs bf16 trainer: real drift
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["eval_accuracy_end"] is not None


def test_resume_reproduces_uninterrupted_metrics(tmp_path):
    full = build(small(4), run_dir=tmp_path / "full")
    full.run()
    part = build(small(2), run_dir=tmp_path / "part")
    part.run()
    resumed = build(small(4), run_dir=tmp_path / "part")
    resumed.run(resume=True)
    assert train_records(tmp_path / "part") == train_records(tmp_path / "full")
