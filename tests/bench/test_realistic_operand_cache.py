"""`--realistic-operand-cache` / `--realistic-uncached` (bench/operand_cache.py, workloads.realistic_workload): the
flags' parsing and errors (each names its flag), and the realistic rows with the cache: attached BEFORE the page pool
is sized (`realistic_pages` sees the cache's bytes), only the cached run with `--realistic-uncached 0`. On CPU the
engine refuses the cache (the fp4 backend emulates): the row fails naming it; with `why_not` patched it runs."""

from __future__ import annotations

import argparse

import pytest

from trace_rl.bench import operand_cache as flag
from trace_rl.bench.rollout import add_rollout_bench_args, run_rollout_bench

pytestmark = pytest.mark.usefixtures("one_torch_thread")
PLANS = ("bf16", "w4a4-kv4", "w4a4-kv4-mx")
REAL = dict(flag=flag.REALISTIC_FLAG, plans_flag="--realistic-plans")


def test_parse_runs_and_uncached():
    parsed = flag.parse("w4a4-kv4,w4a4-kv4-mx=fp8", PLANS, **REAL)
    assert parsed == {"w4a4-kv4": {"bf16": None}, "w4a4-kv4-mx": {"fp8": None}}
    assert flag.runs_for(parsed, "w4a4-kv4", "gluon") == [False, True]
    assert flag.runs_for(parsed, "w4a4-kv4", "gluon", uncached=False) == [True]
    assert flag.runs_for(parsed, "w4a4-kv4-mx", "auto", uncached=False) == ["fp8"]
    assert flag.runs_for(parsed, "bf16", "auto", uncached=False) == [False]     # not named: still runs, uncached
    only_gluon = flag.parse("w4a4-kv4=gluon", PLANS, **REAL)
    assert flag.runs_for(only_gluon, "w4a4-kv4", "kernels", uncached=False) == [False]
    assert flag.parse_uncached(1, {}) is True and flag.parse_uncached(0, parsed) is False


@pytest.mark.parametrize("spec,match", [
    ("bf16", "--realistic-operand-cache: plan 'bf16' has 'bf16' weights"),
    ("w4a16", "--realistic-operand-cache: plan 'w4a16' .* is not one of --realistic-plans"),
    ("w4a4-kv4=fp8", "--realistic-operand-cache: 'w4a4-kv4=fp8': the FP8 operand cache holds mxfp4"),
    ("w4a4-kv4-mx=auto:fp16", "--realistic-operand-cache: .*cache kind 'fp16'")])
def test_parse_errors_name_the_flag(spec, match):
    with pytest.raises(ValueError, match=match):
        flag.parse(spec, PLANS, **REAL)


@pytest.mark.parametrize("value,parsed,match", [(2, {"w4a4-kv4": {"bf16": None}}, "--realistic-uncached 2: choose"),
                                                (0, {}, "--realistic-uncached 0 drops .* names none")])
def test_uncached_errors_name_the_flag(value, parsed, match):
    with pytest.raises(ValueError, match=match):
        flag.parse_uncached(value, parsed)


def _args(tmp_path, *extra):
    return add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--parts", "realistic", "--models", "tiny", "--realistic-plans", "bf16,w4a4-kv4", "--realistic-prompts", "1",
         "--group", "2", "--prompt-len", "5", "--realistic-max", "12", "--realistic-median", "6", "--device", "cpu",
         "--out", str(tmp_path / "out"), *extra])


@pytest.mark.parametrize("extra,match", [
    (["--realistic-operand-cache", "w4a4-kv4-mx"], "--realistic-operand-cache: plan 'w4a4-kv4-mx'"),
    (["--realistic-operand-cache", "bf16"], "--realistic-operand-cache: plan 'bf16'"),
    (["--realistic-uncached", "0"], "--realistic-uncached 0"),
    (["--realistic-operand-cache", "w4a4-kv4", "--realistic-uncached", "3"], "--realistic-uncached 3")])
def test_bench_rejects_bad_flags_before_running(tmp_path, extra, match):
    with pytest.raises(ValueError, match=match):
        run_rollout_bench(_args(tmp_path, *extra))
    assert not (tmp_path / "out").exists()          # rejected before anything is written


def _record_pool_sizing(monkeypatch):
    """realistic_pages wrapped: the operand-cache bytes the model holds when the pool is sized, per call."""
    from trace_rl.bench import workloads
    from trace_rl.engine import operand_cache as engine_oc

    seen = []
    real = workloads.realistic_pages

    def recording(args, model, *a, **kw):
        seen.append(engine_oc.model_bytes(model))
        return real(args, model, *a, **kw)

    monkeypatch.setattr(workloads, "realistic_pages", recording)
    return seen


def test_pool_is_sized_after_the_cache(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from trace_rl.engine import operand_cache as engine_oc

    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device, kind="bf16": "")
    seen = _record_pool_sizing(monkeypatch)
    report = run_rollout_bench(_args(tmp_path, "--realistic-operand-cache", "w4a4-kv4"))
    assert not report["errors"], report["errors"]
    rows = [(r["plan"], r["operand_cache"], r["operand_cache_kind"]) for r in report["realistic"]]
    assert rows == [("bf16", False, None), ("w4a4-kv4", False, None), ("w4a4-kv4", True, "bf16")]
    cached = report["realistic"][2]
    assert seen[:2] == [0, 0] and seen[2] > 0                   # the cache was there when the pool was sized
    assert seen[2] == cached["operand_cache_GB"] * 1e9
    assert cached["operand_cache_kinds"] == {"bf16": sum(cached["operand_cache_kinds"].values())}
    assert cached["lengths"]["honoured"] and cached["tokens"] == report["realistic"][1]["tokens"]
    assert any("w4a4-kv4+oc" in line and "operand cache" in line for line in report["log"])
    assert [x.get("operand_cache_kind") for x in report["summary"] if "realistic" in x] == [None, None, "bf16"]


def test_uncached_0_runs_only_the_cached_engine(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    from trace_rl.engine import operand_cache as engine_oc

    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device, kind="bf16": "")
    seen = _record_pool_sizing(monkeypatch)
    args = _args(tmp_path, "--realistic-plans", "w4a4-kv4-mx", "--realistic-operand-cache", "w4a4-kv4-mx=fp8",
                 "--realistic-uncached", "0")
    report = run_rollout_bench(args)
    assert not report["errors"], report["errors"]
    assert [(r["plan"], r["operand_cache_kind"]) for r in report["realistic"]] == [("w4a4-kv4-mx", "fp8")]
    assert len(seen) == 1 and seen[0] > 0 and report["realistic"][0]["operand_cache_kinds"].get("fp8", 0) > 0


def test_layer_cache_bytes_add_up_to_the_model(monkeypatch):
    """kv_budget subtracts a layer-cut model's missing layers' caches by layer 0's (`model_bytes(model, within=...)`):
    every layer's caches are the model's (the lm_head keeps none)."""
    pytest.importorskip("triton")
    import torch

    from trace_rl.bench.measure import build_rollout_model
    from trace_rl.engine import operand_cache as engine_oc
    from trace_rl.plan import PrecisionPlan

    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device, kind="bf16": "")
    plan = PrecisionPlan.preset("w4a4-kv4")
    model = build_rollout_model("tiny", plan, torch.device("cpu"), torch.float32, 0)
    assert engine_oc.model_bytes(model, "model.layers.0.") == 0
    total = engine_oc.attach_model(model, plan, "cpu")
    layers = len(model.model.layers)
    per_layer = engine_oc.model_bytes(model, "model.layers.0.")
    assert total > 0 and per_layer * layers == total == engine_oc.model_bytes(model)


def test_cache_refused_on_cpu_names_it(tmp_path):
    report = run_rollout_bench(_args(tmp_path, "--realistic-plans", "w4a4-kv4", "--realistic-operand-cache",
                                     "w4a4-kv4", "--realistic-uncached", "0"))
    assert report["realistic"] == []
    (err,) = report["errors"]
    assert "operand_cache" in err["part"] and "operand_cache: the operand cache feeds" in err["error"]
