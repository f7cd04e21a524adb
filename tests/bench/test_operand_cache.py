"""`--operand-cache` (bench/operand_cache.py): which fixed-workload runs repeat with the engine's operand cache, the
flag's errors, and the rows (operand_cache, operand_cache_GB, batch, label '+oc'). On CPU the engine refuses the cache
(the fp4 backend emulates): the row fails naming it; with `why_not` patched the run goes through."""

from __future__ import annotations

import argparse

import pytest

from trace_rl.bench import operand_cache as flag
from trace_rl.bench.rollout import add_rollout_bench_args, run_rollout_bench

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PLANS = ("bf16", "w4a4-kv4", "w4a4-kv4-mx")


def test_parse_and_runs():
    parsed = flag.parse("w4a4-kv4=gluon,w4a4-kv4-mx", PLANS)
    assert parsed == {"w4a4-kv4": ["gluon"], "w4a4-kv4-mx": None}
    assert flag.runs_for(parsed, "w4a4-kv4", "gluon") == [False, True]
    assert flag.runs_for(parsed, "w4a4-kv4", "kernels") == [False]
    assert flag.runs_for(parsed, "w4a4-kv4-mx", "auto") == [False, True]
    assert flag.runs_for(parsed, "bf16", "auto") == [False]
    assert flag.parse("w4a4-kv4,w4a4-kv4=gluon", PLANS) == {"w4a4-kv4": None}    # the plan-wide entry wins
    assert flag.parse("", PLANS) == {}


@pytest.mark.parametrize("spec,match", [("bf16", "'bf16' has 'bf16' weights"), ("w4a16", "not one of"),
                                        ("nope=gluon", "not one of")])
def test_parse_errors_name_the_flag(spec, match):
    with pytest.raises(ValueError, match=f"--operand-cache: .*{match}"):
        flag.parse(spec, PLANS)


def test_a_choice_the_plan_does_not_run_is_an_error():
    """`w4a4-kv4=glon` (or a choice outside the plan's --engine-attention list) would add no row: said, not skipped."""
    runs = {"w4a4-kv4": ["gluon", "kernels"]}
    choices_of = lambda plan: runs.get(plan, ["auto"])    # noqa: E731
    assert flag.parse("w4a4-kv4=kernels", PLANS, choices_of) == {"w4a4-kv4": ["kernels"]}
    with pytest.raises(ValueError, match="--operand-cache: 'w4a4-kv4=glon': w4a4-kv4 runs with attention gluon, "
                                         "kernels"):
        flag.parse("w4a4-kv4=glon", PLANS, choices_of)


def _args(tmp_path, spec):
    return add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--parts", "fixed", "--models", "tiny", "--plans", "bf16,w4a4-kv4", "--engine-attention",
         "w4a4-kv4=reference", "--operand-cache", spec, "--fixed-baseline", "0", "--prompts", "2", "--group", "2",
         "--prompt-len", "5", "--response-lens", "8", "--iters", "1", "--e2e-tokens", "2", "--device", "cpu",
         "--out", str(tmp_path)])


def test_fixed_rows_with_and_without_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from trace_rl.engine import operand_cache as engine_oc

    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device: "")
    report = run_rollout_bench(_args(tmp_path, "w4a4-kv4"))
    assert not report["errors"], report["errors"]
    rows = [(r["plan"], r["operand_cache"], r["operand_cache_GB"] > 0) for r in report["results"]]
    assert rows == [("bf16", False, False), ("w4a4-kv4", False, False), ("w4a4-kv4", True, True)]
    cached = report["results"][2]
    assert cached["paths"]["operand_cache"]
    assert cached["paths"]["operand_cache_bytes"] == cached["operand_cache_GB"] * 1e9
    assert any("w4a4-kv4/reference+oc" in line for line in report["log"])
    lines = [x for x in report["summary"] if x.get("plan") == "w4a4-kv4"]
    assert [(x["operand_cache"], x["batch"]) for x in lines] == [(False, 4), (True, 4)]


def test_cache_refused_on_cpu_names_it(tmp_path):
    report = run_rollout_bench(_args(tmp_path, "w4a4-kv4"))
    assert len(report["results"]) == 2
    (err,) = report["errors"]
    assert "operand_cache" in err["part"] and "operand_cache: the operand cache feeds" in err["error"]
