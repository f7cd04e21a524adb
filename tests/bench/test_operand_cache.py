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
    assert parsed == {"w4a4-kv4": {"bf16": ["gluon"]}, "w4a4-kv4-mx": {"bf16": None}}
    assert flag.runs_for(parsed, "w4a4-kv4", "gluon") == [False, True]
    assert flag.runs_for(parsed, "w4a4-kv4", "kernels") == [False]
    assert flag.runs_for(parsed, "w4a4-kv4-mx", "auto") == [False, True]
    assert flag.runs_for(parsed, "bf16", "auto") == [False]
    assert flag.parse("w4a4-kv4,w4a4-kv4=gluon", PLANS) == {"w4a4-kv4": {"bf16": None}}   # the plan-wide entry wins
    assert flag.parse("", PLANS) == {}


def test_fp8_kind():
    """PLAN=fp8 / PLAN=CHOICE:fp8 add an FP8-cache run after the bf16 one; PLAN=bf16 is the plain entry."""
    parsed = flag.parse("w4a4-kv4-mx,w4a4-kv4-mx=fp8,w4a4-kv4=gluon:bf16", PLANS)
    assert parsed == {"w4a4-kv4-mx": {"bf16": None, "fp8": None}, "w4a4-kv4": {"bf16": ["gluon"]}}
    assert flag.runs_for(parsed, "w4a4-kv4-mx", "auto") == [False, True, "fp8"]
    assert flag.runs_for(flag.parse("w4a4-kv4-mx=gluon:fp8", PLANS), "w4a4-kv4-mx", "gluon") == [False, "fp8"]
    assert flag.runs_for(flag.parse("w4a4-kv4-mx=gluon:fp8", PLANS), "w4a4-kv4-mx", "auto") == [False]
    assert (flag.label("fp8"), flag.label(True), flag.label(False)) == (" operand_cache=fp8", " operand_cache", "")
    with pytest.raises(ValueError, match="--operand-cache: 'w4a4-kv4=fp8': the FP8 operand cache holds mxfp4"):
        flag.parse("w4a4-kv4=fp8", PLANS)
    with pytest.raises(ValueError, match="cache kind 'fp16'"):
        flag.parse("w4a4-kv4-mx=auto:fp16", PLANS)


@pytest.mark.parametrize("spec,match", [("bf16", "'bf16' has 'bf16' weights"), ("w4a16", "not one of"),
                                        ("nope=gluon", "not one of")])
def test_parse_errors_name_the_flag(spec, match):
    with pytest.raises(ValueError, match=f"--operand-cache: .*{match}"):
        flag.parse(spec, PLANS)


def test_a_choice_the_plan_does_not_run_is_an_error():
    """`w4a4-kv4=glon` (or a choice outside the plan's --engine-attention list) would add no row: said, not skipped."""
    runs = {"w4a4-kv4": ["gluon", "kernels"]}
    choices_of = lambda plan: runs.get(plan, ["auto"])    # noqa: E731
    assert flag.parse("w4a4-kv4=kernels", PLANS, choices_of) == {"w4a4-kv4": {"bf16": ["kernels"]}}
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


def test_fixed_rows_with_the_fp8_cache(tmp_path, monkeypatch):
    """w4a4-kv4-mx without and with the FP8 cache (CPU: the engine's kernels-only check patched; the cache is written
    by the torch reference): the row says which kind ran and its real bytes (1 per weight element)."""
    pytest.importorskip("triton")
    from trace_rl.engine import operand_cache as engine_oc

    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device, kind="bf16": "")
    args = _args(tmp_path, "w4a4-kv4-mx=fp8")
    args.plans, args.engine_attention = "bf16,w4a4-kv4-mx", "auto"
    report = run_rollout_bench(args)
    assert not report["errors"], report["errors"]
    rows = [(r["plan"], r["operand_cache"], r["operand_cache_kind"]) for r in report["results"]]
    assert rows == [("bf16", False, None), ("w4a4-kv4-mx", False, None), ("w4a4-kv4-mx", True, "fp8")]
    fp8 = report["results"][2]
    assert fp8["paths"]["operand_cache_kind"] == "fp8" and fp8["paths"]["operand_cache_kinds"].get("fp8", 0) > 0
    assert fp8["paths"]["operand_cache_bytes"] == fp8["operand_cache_GB"] * 1e9 > 0
    assert any("w4a4-kv4-mx+oc8" in line for line in report["log"])
