"""loop.eval_reference: a quantized run also evaluates its held-out prompts at bf16 (a second native engine loaded
with the trainer's weights at each evaluation); off, or with a bf16 rollout, nothing more is evaluated."""

import json

import pytest

from trace_rl.cli import main
from trace_rl.config import ConfigError
from trace_rl.pipelines import build, default_config
from trace_rl.pipelines.run_log import read_history

BF16_PLAN = {"precision.rollout_weights": "bf16", "precision.rollout_activations": "bf16",
             "precision.kv_cache": "bf16", "precision.trainer": "bf16"}
REF_KEYS = ("eval_ref_accuracy", "eval_ref_reward", "eval_ref_format_ok", "eval_ref_seconds")


def small(steps: int = 1, **extra):
    # max_batch = eval_prompts: the reference engine's slots (min of the two) match a bf16 run's engine
    return default_config().with_overrides({
        "loop.steps": steps, "loop.prompts_per_step": 4, "loop.group_size": 4, "loop.eval_every": 0,
        "loop.eval_prompts": 16, "rollout.max_batch": 16, "logging.progress": False, "logging.plot": False,
        **extra})


def train_records(run_dir):
    timing = ("rollout_seconds", "step_seconds", "rollout_tokens_per_s")
    return [{k: v for k, v in r.items() if k not in timing} for r in read_history(run_dir) if r["kind"] == "train"]


def scores(record: dict, prefix: str) -> tuple:
    return tuple(record[f"{prefix}{k}"] for k in ("accuracy", "reward", "format_ok"))


def counted(engine) -> list:
    calls = []
    generate = engine.generate
    engine.generate = lambda *a, **k: calls.append(1) or generate(*a, **k)
    return calls


def test_fp4_run_also_evaluates_at_bf16_like_a_bf16_plan(tmp_path):
    fp4 = build(small(**{"loop.eval_reference": True}), run_dir=tmp_path / "fp4")
    assert fp4.config.precision.is_quantized and fp4.reference_engine is not None
    assert fp4.reference_engine.plan.label == "bf16"
    bf16 = build(small(**BF16_PLAN), run_dir=tmp_path / "bf16")
    assert bf16.reference_engine is None
    for step in range(2):         # at the start, then after an update (the reference engine syncs at eval time)
        if step:
            fp4.train_step()
            bf16.model.load_state_dict(fp4.model.state_dict())
            bf16.sync_weights()
        record = fp4.evaluate()
        plain = bf16.evaluate()
        assert all(k in record for k in REF_KEYS) and not any(k in plain for k in REF_KEYS)
        assert scores(record, "eval_ref_") == scores(plain, "eval_")
        assert record["eval_ref_accuracy"] > 0        # the SFT'd default policy solves some: not a vacuous match
        assert record["eval_ref_seconds"] > 0
    assert fp4.engine.policy_version == 1 and fp4.reference_engine.policy_version == 1


def test_run_logs_both_accuracies_and_training_is_unchanged(tmp_path):
    summary = build(small(3, **{"loop.eval_reference": True, "loop.eval_every": 1}), run_dir=tmp_path / "r").run()
    build(small(3, **{"loop.eval_every": 1}), run_dir=tmp_path / "off").run()
    evals = [r for r in read_history(tmp_path / "r") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [0, 1, 2, 3]
    assert all("eval_accuracy" in r and "eval_ref_accuracy" in r for r in evals)
    assert summary["eval_ref_accuracy_start"] == evals[0]["eval_ref_accuracy"]
    assert summary["eval_ref_accuracy_end"] == evals[-1]["eval_ref_accuracy"]
    assert summary["eval_ref_accuracy_best"] == max(r["eval_ref_accuracy"] for r in evals)
    # the reference evaluation changes no training record (nor the plan-precision evaluations)
    off = [r for r in read_history(tmp_path / "off") if r["kind"] == "eval"]
    assert [scores(r, "eval_") for r in evals] == [scores(r, "eval_") for r in off]
    assert train_records(tmp_path / "r") == train_records(tmp_path / "off")


@pytest.mark.parametrize("case", ["off", "bf16"])
def test_off_or_bf16_rollout_evaluates_once(tmp_path, case):
    extra = {} if case == "off" else {**BF16_PLAN, "loop.eval_reference": True}
    pipeline = build(small(**extra), run_dir=tmp_path / "r")
    assert pipeline.reference_engine is None
    calls = counted(pipeline.engine)
    summary = pipeline.run()
    evals = [r for r in read_history(tmp_path / "r") if r["kind"] == "eval"]
    assert len(evals) == 2 and len(calls) == 1 + 2    # one rollout step + two held-out evaluations
    assert not any(k.startswith("eval_ref") for r in evals for k in r)
    assert not any(k.startswith("eval_ref") for k in summary)


def test_resume_may_turn_it_on(tmp_path):
    build(small(1), run_dir=tmp_path / "r").run()
    resumed = build(small(2, **{"loop.eval_reference": True}), run_dir=tmp_path / "r")
    resumed.run(resume=True)
    history = read_history(tmp_path / "r")
    resume = next(r for r in history if r["kind"] == "resume")
    assert resume["changed"]["loop.eval_reference"] == [False, True]
    evals = [r for r in history if r["kind"] == "eval"]
    assert "eval_ref_accuracy" not in evals[0] and "eval_ref_accuracy" in evals[-1]


def test_bad_value_and_distributed_are_refused_naming_the_field(tmp_path, capsys):
    assert main(["validate", "--set", "loop.eval_reference=maybe"]) == 2
    assert "loop.eval_reference" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="loop.eval_reference"):
        small(**{"loop.eval_reference": True, "distributed.rollout_workers": 1})
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"loop": {"eval_reference": True}, "distributed": {"trainer_gpus": 2}}))
    assert main(["validate", str(cfg)]) == 2
    assert "loop.eval_reference" in capsys.readouterr().err
