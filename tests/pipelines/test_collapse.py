"""Collapse detection: each rule on hand-made records, then in a run (recorded in metrics.jsonl, in the summary,
rebuilt on resume, `stop` ends the run); the per-step logging the stability study reads; `--time-limit`."""

import json
import math

from trace_rl.cli import main
from trace_rl.pipelines import build
from trace_rl.pipelines.collapse import CollapseMonitor, CollapseSection, recorded_collapse
from trace_rl.pipelines.run_log import read_history

from .test_run import small


def evals(*accs, start=0, every=10):
    return [{"kind": "eval", "step": start + i * every, "eval_accuracy": a} for i, a in enumerate(accs)]


def trains(*entropies, **extra):
    return [{"kind": "train", "step": i + 1, "loss": 0.1, "grad_norm": 1.0, "entropy": e, **extra}
            for i, e in enumerate(entropies)]


def first_collapse(records, **rule):
    m = CollapseMonitor(CollapseSection(**rule))
    fired = [e for e in map(m.update, records) if e is not None]
    assert len(fired) <= 1                         # logged once
    return fired[0] if fired else None


def test_accuracy_below_half_its_best_for_two_evaluations():
    hit = first_collapse(evals(0.30, 0.40, 0.15, 0.25, 0.19, 0.10))   # 0.15 < .2 once, then 0.19, 0.10 twice
    assert hit["step"] == 50 and hit["reason"] == "accuracy" and "steps 40, 50" in hit["detail"]
    assert first_collapse(evals(0.30, 0.14, 0.25, 0.14)) is None       # never twice in a row
    assert first_collapse(evals(0.30, 0.14, 0.14), patience=3) is None
    assert first_collapse(evals(0.30, 0.14), patience=1)["step"] == 10


def test_accuracy_rule_needs_a_best_worth_losing():
    assert first_collapse(evals(0.04, 0.0, 0.0, 0.0)) is None          # never reached min_accuracy 0.05
    assert first_collapse(evals(0.04, 0.0, 0.0), min_accuracy=0.01)["step"] == 20


def test_entropy_blowup_and_non_finite_values():
    hit = first_collapse(trains(0.2, 0.2, 0.3, 0.7), entropy_window=2)  # last two 0.5 vs first two 0.2: 2.5x
    assert hit is None
    hit = first_collapse(trains(0.2, 0.2, 0.6, 0.7), entropy_window=2)  # 0.65 > 3 x 0.2
    assert hit["step"] == 4 and hit["reason"] == "entropy"
    assert first_collapse(trains(0.2, 0.2, 0.6, 0.7), entropy_window=2, entropy_blowup=None) is None
    hit = first_collapse(trains(0.2, math.nan))
    assert hit["step"] == 2 and hit["reason"] == "non-finite" and "entropy = nan" in hit["detail"]
    assert first_collapse(trains(0.2, 0.2, loss=math.inf))["step"] == 1
    assert first_collapse(trains(0.2, math.nan), enabled=False) is None
    m = CollapseMonitor()
    assert m.non_finite(7, "gradient norm is nan")["step"] == 7 and m.non_finite(8, "again") is None


def test_replay_rebuilds_the_state_of_a_resumed_run():
    records = evals(0.30) + evals(0.1, start=10)
    m = CollapseMonitor()
    m.replay(records)                               # one collapsed evaluation so far
    assert m.update(evals(0.1, start=20)[0])["step"] == 20
    done = CollapseMonitor()
    done.replay([*records, {"kind": "collapse", "step": 10, "reason": "accuracy", "detail": ""}])
    assert done.collapse["step"] == 10 and done.update(evals(0.0, start=20)[0]) is None


FORCE_ENTROPY = {"loop.collapse.entropy_window": 1, "loop.collapse.entropy_blowup": 1e-9}  # any entropy > 0 fires


def test_a_run_records_its_collapse_and_stop_ends_it(tmp_path):
    summary = build(small(4, **FORCE_ENTROPY, **{"loop.collapse.stop": True}), run_dir=tmp_path / "run").run()
    history = read_history(tmp_path / "run")
    hit = recorded_collapse(history)
    assert hit["step"] == 2 and hit["reason"] == "entropy"
    assert [r["step"] for r in history if r["kind"] == "train"] == [1, 2]          # stopped at the collapse
    assert summary["collapse_step"] == 2 and "collapse at step 2" in summary["stopped"]
    assert (tmp_path / "run" / "checkpoint" / "state.json").is_file()
    assert history[-1]["kind"] == "eval" and history[-1]["step"] == 2              # the final evaluation


def test_per_step_logging_the_study_reads(tmp_path):
    build(small(1, **{"loop.eval_every": 1}), run_dir=tmp_path / "run").run()   # default: fp4 + token TIS
    history = read_history(tmp_path / "run")
    (train,) = [r for r in history if r["kind"] == "train"]
    for key in ("eval_accuracy", "reward", "response_length", "response_at_cap", "entropy", "grad_norm",
                "mismatch_k3", "abs_log_ratio_mean", "ess", "frac_masked_tokens",
                "correction/token_tis/frac_masked", "correction/token_tis/frac_truncated",
                "mismatch_by_position/k3/0-1", "mismatch_by_position/abs_log_ratio/0-1",
                "mismatch_by_position/ess/0-1"):
        assert key in train or any(key in r for r in history if r["kind"] == "eval"), key
    assert 0.0 <= train["response_at_cap"] <= 1.0
    assert all(r["eval_seconds"] >= 0 for r in history if r["kind"] == "eval")
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["collapse_step"] is None and summary["step_seconds_median"] > 0


def cli(out, *args):
    return main(["run", "--set", "loop.steps=3", "--set", "loop.prompts_per_step=4", "--set", "loop.group_size=4",
                 "--set", "loop.eval_prompts=8", "--set", "logging.progress=false", "--set", "logging.plot=false",
                 "--set", "loop.eval_every=0", *args, "--out", str(out)])


def test_time_limit_stops_with_a_checkpoint_and_resume_finishes(tmp_path, capsys):
    out = tmp_path / "run"
    assert cli(out, "--time-limit", "0") == 142            # one step (progress), then the limit: 128 + SIGALRM
    err = capsys.readouterr().err
    assert "time limit" in err and "stopped after step 1" in err
    state = json.loads((out / "checkpoint" / "state.json").read_text())
    assert state["step"] == 1 and not (out / "summary.json").exists()
    assert main(["run", "--resume", str(out), "--time-limit", "600"]) == 0
    assert [r["step"] for r in read_history(out) if r["kind"] == "train"] == [1, 2, 3]
    assert main(["run", "--out", str(tmp_path / "x"), "--time-limit", "-1"]) == 2
