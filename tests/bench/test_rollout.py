"""The rollout bench runs end to end on CPU with the tiny preset (every part but the GPU profile) and writes
its JSON and PNG."""

from __future__ import annotations

import argparse
import json

import pytest

from trace_rl.bench.rollout import add_rollout_bench_args, run_rollout_bench

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_bench_rollout_tiny_cpu(tmp_path):
    pytest.importorskip("transformers")
    args = add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--models", "tiny", "--grid", "2:9,17", "--plans", "bf16,w4a4-kv4", "--prompts", "2", "--group", "2",
         "--prompt-len", "5", "--response-lens", "24", "--iters", "2", "--e2e-tokens", "4",
         "--realistic-plans", "bf16", "--realistic-prompts", "2", "--realistic-max", "20", "--realistic-median", "10",
         "--hf-batch", "2", "--hf-new-tokens", "4", "--device", "cpu", "--out", str(tmp_path)])
    report = run_rollout_bench(args)
    assert not report["errors"], report["errors"]
    assert [(g["batch"], g["L"]) for g in report["grid"]] == [(2, 9), (2, 17)]
    for g in report["grid"]:
        assert g["engine_ms"] > 0 and g["baseline_ms"] > 0 and g["baseline_backend"] == "default"
        assert g["baseline_eager"]["ms"] > 0 and g["baseline_compiled"]["ms"] > 0   # both variants ran
        assert g["baseline_ms"] == min(g["baseline_eager"]["ms"], g["baseline_compiled"]["ms"])
        assert g["path"] == "torch.reference"
    assert {r["plan"] for r in report["results"]} == {"bf16", "w4a4-kv4"}
    for r in report["results"]:
        assert r["batch"] == 4 and r["tokens_per_s"] > 0 and len(r["steps"]) == 3
        # the plain step is timed beside the bf16 run (same batch, contexts and cache memory), not beside FP4
        assert (r["plain_baseline"] is not None) == (r["plan"] == "bf16")
    plain = next(r for r in report["results"] if r["plan"] == "bf16")
    assert all(s["baseline_ms"] > 0 for s in plain["steps"]) and plain["plain_baseline"]["decode_tokens_per_s"] > 0
    assert any(x.get("vs_plain_step_decode_tokens_per_s") for x in report["summary"])
    real = report["realistic"][0]
    assert real["lengths"]["honoured"] and real["rows"] == 4 and real["tokens"] > 0   # every drawn length met
    hf = report["hf"][0]
    assert hf["hf_tokens_per_s"] > 0 and not hf["hf_truncated"] and hf["hf_tokens_reached"] == 4   # no limit
    assert hf["speedup"] > 0 and hf["native_vs_hf_decode_same_tokens"] > 0
    assert hf["native_same_tokens_s"] == hf["native_s"]       # HF ran the whole workload: the same run
    assert json.loads((tmp_path / "rollout.json").read_text())["grid"]
    assert (tmp_path / "rollout.png").stat().st_size > 1000


def test_bench_rejects_unknown_baseline_variant(tmp_path):
    args = add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--baseline-variants", "eager,fast", "--out", str(tmp_path / "out")])
    with pytest.raises(ValueError, match="--baseline-variants"):
        run_rollout_bench(args)
    assert not (tmp_path / "out").exists()          # rejected before anything is written


def test_bench_rejects_unknown_part(tmp_path):
    args = add_rollout_bench_args(argparse.ArgumentParser()).parse_args(["--parts", "grid,nope", "--out",
                                                                         str(tmp_path)])
    with pytest.raises(ValueError, match="nope"):
        run_rollout_bench(args)


def test_bench_exits_1_when_a_measurement_fails(tmp_path, monkeypatch, capsys):
    """A failing configuration is recorded and the others still run, but the command does not exit 0."""
    from trace_rl.bench import workloads
    from trace_rl.cli import main

    def broken(args, name, plan, *rest):
        raise RuntimeError(f"simulated failure of {plan}")

    monkeypatch.setattr(workloads, "fixed_workload", broken)
    code = main(["bench", "rollout", "--parts", "fixed", "--models", "tiny", "--plans", "bf16", "--prompts", "2",
                 "--group", "2", "--prompt-len", "5", "--response-lens", "8", "--iters", "1", "--device", "cpu",
                 "--out", str(tmp_path)])
    assert code == 1
    assert "1 measurement(s) failed" in capsys.readouterr().err
    assert json.loads((tmp_path / "rollout.json").read_text())["errors"][0]["error"].endswith("failure of bf16")


def test_bench_steps_part_tiny_cpu(tmp_path):
    """`--parts steps` (not a default part): one row per (plan, batch, attention choice, context); a choice the
    cache cannot take (gluon: tiny's head_dim 32, and no sm_90 here) is a skipped row saying why, never another
    path; the summary keys every cell's step times by plan/attention."""
    args = add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--parts", "steps", "--models", "tiny", "--step-plans", "w4a4-kv4,bf16", "--step-attention", "auto,gluon",
         "--step-grid", "2:9,17", "--iters", "1", "--device", "cpu", "--out", str(tmp_path)])
    report = run_rollout_bench(args)
    assert not report["errors"], report["errors"]
    ran = [(r["plan"], r["attention"], r["L"]) for r in report["steps"] if "step_ms" in r]
    assert ran == [("w4a4-kv4", "auto", 9), ("w4a4-kv4", "auto", 17), ("bf16", "auto", 9), ("bf16", "auto", 17)]
    skipped = [r for r in report["steps"] if "skipped" in r]
    assert [(r["plan"], r["attention"]) for r in skipped] == [("w4a4-kv4", "gluon"), ("bf16", "gluon")]
    assert "head_dim 128" in skipped[0]["skipped"] and "nvfp4 or mxfp4 KV caches only" in skipped[1]["skipped"]
    assert all(r["path"] == "torch.reference" and r["attention_times"] == {} for r in report["steps"] if "path" in r)
    cells = [x["steps"] for x in report["summary"] if "steps" in x]
    assert [(c["batch"], c["L"]) for c in cells] == [(2, 9), (2, 17)]
    assert set(cells[0]["step_ms"]) == {"w4a4-kv4/auto", "bf16/auto"}


STEPS_CLI = ["bench", "rollout", "--parts", "steps", "--models", "tiny", "--step-plans", "w4a4-kv4",
             "--step-grid", "2:9", "--iters", "1", "--device", "cpu"]


def test_bench_cli_steps_part_exits_0(tmp_path, capsys):
    """A run of the steps part alone that measured its cells exits 0 (it said "nothing was measured" and exited 1:
    the check did not count steps rows); the skipped choice beside them (gluon on CPU) does not make it 1."""
    from trace_rl.cli import main

    code = main(STEPS_CLI + ["--step-attention", "auto,gluon", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "nothing was measured" not in err
    rows = json.loads((tmp_path / "rollout.json").read_text())["steps"]
    assert [("step_ms" in r, "skipped" in r) for r in rows] == [(True, False), (False, True)]


def test_bench_cli_steps_part_all_skipped_exits_1(tmp_path, capsys):
    """Every steps cell skipped (gluon on CPU) is nothing measured: exit 1, saying the cells were skipped and why."""
    from trace_rl.cli import main

    assert main(STEPS_CLI + ["--step-attention", "gluon", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "nothing was measured: every steps cell was skipped (1" in err and "head_dim 128" in err


def test_bench_cli_steps_engine_failure_exits_1(tmp_path, monkeypatch, capsys):
    """An engine of the steps part failing is caught in its row (the other cells still run) and listed under
    "errors": the command exits 1, though another cell was measured."""
    from trace_rl.cli import main
    from trace_rl.engine import native

    real = native.NativeEngine

    def engine(*a, **kw):
        if kw.get("attention") == "reference":
            raise RuntimeError("simulated engine failure")
        return real(*a, **kw)

    monkeypatch.setattr(native, "NativeEngine", engine)
    assert main(STEPS_CLI + ["--step-attention", "reference,auto", "--out", str(tmp_path)]) == 1
    assert "1 measurement(s) failed" in capsys.readouterr().err
    report = json.loads((tmp_path / "rollout.json").read_text())
    assert [("step_ms" in r, "error" in r) for r in report["steps"]] == [(False, True), (True, False)]
    assert report["errors"] == [{"part": "steps model=tiny plan=w4a4-kv4 batch=2 attention=reference",
                                 "error": "RuntimeError: simulated engine failure"}]


def test_unmeasured():
    """What the CLI calls "nothing measured": no rows of any part, or steps rows that are all skipped (a batch that
    does not fit, as B=256 beside Qwen3-8B on the H200); a skip beside measured cells is not."""
    from trace_rl.bench.rollout import unmeasured

    empty = {k: [] for k in ("grid", "profile", "results", "realistic", "hf", "steps", "errors")}
    assert unmeasured(empty) == "nothing was measured (no model, part, plan or length selected)"
    measured = {"plan": "w4a4-kv4", "attention": "gluon", "batch": 100, "L": 8447, "step_ms": 22.9, "forward_ms": 22.7}
    skip = {"plan": "w4a4-kv4", "attention": "gluon", "batch": 256,
            "skipped": "253 sequences of 8448 tokens fit beside the weights, not 256"}
    assert unmeasured({**empty, "steps": [measured, skip]}) == ""
    assert unmeasured({**empty, "steps": [measured]}) == ""
    why = unmeasured({**empty, "steps": [skip]})
    assert why.startswith("nothing was measured: every steps cell was skipped (1") and "253 sequences" in why
    assert unmeasured({**empty, "grid": [{"batch": 1, "L": 9}]}) == ""
    assert unmeasured({**empty, "results": [{"tokens_per_s": 1.0}], "steps": [skip]}) == ""
    failed = {"model": "qwen3-8b", "plan": "w4a4-kv4", "error": "RuntimeError: CUDA out of memory"}
    why = unmeasured({**empty, "profile": [failed]})                   # run_profiles caught it into its row
    assert why.startswith("nothing was measured: every row failed (1") and "out of memory" in why
    assert unmeasured({**empty, "profile": [failed, {"plan": "bf16", "graph_step_ms": 9.0}]}) == ""


def test_bench_steps_rejects_unknown_attention(tmp_path):
    args = add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--parts", "steps", "--step-attention", "kernels,fast", "--out", str(tmp_path / "out")])
    with pytest.raises(ValueError, match="--step-attention"):
        run_rollout_bench(args)


def test_bench_engine_attention_reaches_the_fixed_and_realistic_engines(tmp_path, monkeypatch):
    """`--engine-attention`: each plan's engine is built with its choice where the cache takes it (CPU: 'reference'
    is forced; 'gluon' is refused: bf16 cache, tiny's head_dim 32, no sm_90), a refused one runs on auto and its
    row says why;
    a plan named twice runs once per choice; every row and summary line records what was asked and what ran."""
    from trace_rl.engine import native

    built = []

    class Recording(native.NativeEngine):
        def __init__(self, *a, **kw):
            built.append(kw.get("attention", "auto"))
            super().__init__(*a, **kw)

    monkeypatch.setattr(native, "NativeEngine", Recording)
    args = add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--parts", "fixed,realistic", "--models", "tiny", "--plans", "bf16,w4a4-kv4", "--engine-attention",
         "gluon,w4a4-kv4=reference,w4a4-kv4=gluon", "--fixed-baseline", "0", "--prompts", "2", "--group", "2",
         "--prompt-len", "5", "--response-lens", "8", "--iters", "1", "--e2e-tokens", "2",
         "--realistic-plans", "w4a4-kv4", "--realistic-prompts", "1", "--realistic-max", "8",
         "--realistic-median", "4", "--device", "cpu", "--out", str(tmp_path)])
    report = run_rollout_bench(args)
    assert not report["errors"], report["errors"]
    assert built == ["auto", "reference", "auto", "reference", "auto"]      # fixed x3, then realistic x2
    rows = [(r["plan"], r["attention_requested"], r["attention_forced"]) for r in report["results"]]
    assert rows == [("bf16", "gluon", None), ("w4a4-kv4", "reference", "reference"), ("w4a4-kv4", "gluon", None)]
    assert "nvfp4 or mxfp4 KV caches only" in report["results"][0]["attention_refused"]     # the default entry, on bf16
    for r in report["results"] + report["realistic"]:
        assert r["attention_used"] == ["torch.reference"]
        assert (r["attention_refused"] is not None) == (r["attention_requested"] == "gluon")
    assert "head_dim 128" in report["results"][2]["attention_refused"]
    assert any("attention='gluon' not forced" in line for line in report["log"])
    assert [(r["attention_forced"], r["attention_requested"]) for r in report["realistic"]] == [
        ("reference", "reference"), (None, "gluon")]
    fixed = [x for x in report["summary"] if x.get("plan") == "w4a4-kv4"]
    assert [x["attention_requested"] for x in fixed] == ["reference", "gluon"]
    assert all(x["vs_bf16_tokens_per_s"] > 0 and x["bf16_attention_used"] == ["torch.reference"] for x in fixed)
    assert [x["attention_forced"] for x in report["summary"] if "realistic" in x] == ["reference", None]
    assert json.loads((tmp_path / "rollout.json").read_text())["args"]["engine_attention"].endswith("=gluon")


def test_bench_rejects_unknown_engine_attention(tmp_path):
    for spec in ("fast", "w4a4-kv4=fast", "nope=gluon"):
        args = add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
            ["--parts", "fixed", "--engine-attention", spec, "--out", str(tmp_path / "out")])
        with pytest.raises(ValueError, match="--engine-attention"):
            run_rollout_bench(args)
    assert not (tmp_path / "out").exists()          # rejected before anything is written


def test_forced_stop_head_never_draws_the_stop_token_before_its_length():
    """The realistic workload's head: the stop token's logit is -inf in the prefill (a sample's first token: every
    drawn length is >= 16; a small vocabulary drew it there at 512 samples) and in a step before the sample's drawn
    length, 1e4 at it."""
    import types

    import torch

    from trace_rl.bench.workloads import ForcedStop

    head = torch.nn.Linear(4, 8)
    engine = types.SimpleNamespace(ngen=torch.tensor([0, 4, 9]), slot_row=torch.tensor([2, 0, 1]))
    targets = torch.tensor([5, 10, 2, 1 << 40])
    ref: list = []
    forced = ForcedStop(head, ref, targets, stop_id=3)
    with torch.no_grad():
        assert (forced(torch.randn(6, 4))[:, 3] == float("-inf")).all()           # prefill: packed tokens
        ref.append(engine)
        step = forced(torch.randn(3, 1, 4))[:, 0, 3]
    # slot 0: row 2, 1 token, due at 2; slot 1: row 0, 5th token due at 5; slot 2: row 1, 10th token due at 10
    assert step.tolist() == [float("-inf"), 1e4, 1e4]
