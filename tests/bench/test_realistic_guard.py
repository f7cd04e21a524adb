"""The realistic workload's time guard (bench/realistic_guard.py, `--realistic-deadline`): the step model's sums on
hand-made probe numbers, the decision, the probe on a tiny engine on CPU (its counts kept out of the run's), a run
skipped by the guard (its row under "realistic_skipped", the CLI exits 1 saying so), and prime_decode on a pool
smaller than batch x pages per sequence (what the probe's largest batch meets)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from trace_rl.bench import realistic_guard as rg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_live_rows():
    """A sample of length n runs decode steps 1 .. n-1 (its first token is the prefill's)."""
    assert rg.live_rows(torch.tensor([3, 5, 5])).tolist() == [3, 3, 2, 2]
    assert rg.live_rows(torch.tensor([2])).tolist() == [1]


def test_step_between_the_probed_batches():
    step = {8: 2.0, 64: 4.0, 256: 10.0}
    assert [rg._step_at(step, b) for b in (1, 8, 36, 64, 160, 256, 512)] == [2.0, 2.0, 3.0, 4.0, 7.0, 10.0, 20.0]


def test_estimate_sums_the_run():
    """lengths 3, 5, 5 (p = 10): steps 1-4 at 3, 3, 2, 2 rows -> buckets 4, 4, 2, 2 at 4, 4, 2, 2 ms; the KV beyond
    the short context (11): rows x (10 + s - 11) = 0, 3, 4, 6 row-tokens at 0.01 ms; two (bucket, context bucket)
    keys at 0.5 s; a 0.2 s prefill."""
    probed = {"step_ms": {1: 1.0, 4: 4.0}, "kv_ms_per_row_token": 0.01, "short_context": 11, "key_s": 0.5,
              "prefill_s": 0.2}
    est = rg.estimate(probed, torch.tensor([3, 5, 5]), 10, [1, 2, 4], 512, pool_tokens=40)
    assert est["decode_steps"] == 4 and est["new_keys"] == 2
    assert est["decode_base_s"] == pytest.approx(12e-3) and est["decode_kv_s"] == pytest.approx(0.13e-3)
    assert est["estimate_s"] == pytest.approx(0.2 + 12e-3 + 0.13e-3 + 1.0)
    assert est["peak_tokens"] == 3 * 12 and est["pool_holds_all"] is True
    assert rg.estimate(probed, torch.tensor([3, 5, 5]), 10, [1, 2, 4], 512, pool_tokens=32)["pool_holds_all"] is False


def test_decide():
    assert rg.decide(100.0, 100 * rg.MARGIN + rg.TEARDOWN_S) == ""
    why = rg.decide(100.0, 50.0)
    assert why.startswith("estimated 100 s") and "does not fit the 50 s left" in why
    assert "0 s left" in rg.decide(1.0, -3.0)


def _args(tmp_path, deadline: float, *extra):
    import argparse

    from trace_rl.bench.rollout import add_rollout_bench_args

    return add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--parts", "realistic", "--models", "tiny", "--realistic-plans", "bf16", "--realistic-prompts", "2",
         "--group", "2", "--prompt-len", "5", "--realistic-max", "40", "--realistic-median", "20", "--device", "cpu",
         "--realistic-deadline", str(deadline), "--out", str(tmp_path), *extra])


def test_guarded_run_records_its_estimate_and_only_its_own_counts(tmp_path):
    from trace_rl.bench.rollout import run_rollout_bench

    report = run_rollout_bench(_args(tmp_path, time.time() + 600))
    assert not report["errors"] and not report["realistic_skipped"]
    (row,) = report["realistic"]
    est = row["estimate"]
    assert row["estimate_s"] == est["estimate_s"] > 0 and not est["skip"] and est["probe_s"] > 0
    assert set(est["probe"]["step_ms"]) == {2, 4} and est["probe"]["long_context"] == 45     # p + realistic max
    # the probe's prefills and steps are not the run's: one prefill of the 2 prompts, steps = the longest - 1
    assert row["prefill_tokens"] == 2 * 5 and row["decode_steps"] == row["lengths"]["max"] - 1
    assert row["lengths"]["honoured"]
    assert any("realistic time guard: estimated" in line and "runs" in line for line in report["log"])


def test_a_run_that_does_not_fit_is_skipped_and_the_cli_exits_1(tmp_path, capsys):
    from trace_rl.cli import main

    cli = ["bench", "rollout", "--parts", "realistic", "--models", "tiny", "--realistic-plans", "bf16",
           "--realistic-prompts", "2", "--group", "2", "--prompt-len", "5", "--realistic-max", "40",
           "--realistic-median", "20", "--device", "cpu", "--realistic-deadline", str(time.time() + 1),
           "--out", str(tmp_path)]
    assert main(cli) == 1
    err = capsys.readouterr().err
    assert "the time guard skipped every realistic run (1" in err and "does not fit" in err
    report = json.loads((tmp_path / "rollout.json").read_text())
    assert report["realistic"] == [] and not report["errors"]
    (skipped,) = report["realistic_skipped"]
    assert skipped["plan"] == "bf16" and skipped["estimate_s"] > 0 and "does not fit" in skipped["skipped"]
    assert [x for x in report["summary"] if "realistic" in x] == [
        {"realistic": "bf16", "skipped": skipped["skipped"], "estimate_s": skipped["estimate_s"]}]


def test_prime_decode_wraps_a_small_pool():
    """The realistic pool holds fewer than batch x pages per sequence: primed rows share pages, all inside the pool."""
    from trace_rl.bench.decode_grid import prime_decode, time_step
    from trace_rl.bench.measure import build_rollout_model
    from trace_rl.engine.native import NativeEngine
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan.preset("bf16")
    model = build_rollout_model("tiny", plan, torch.device("cpu"), torch.float32, 0)
    engine = NativeEngine(model, plan, max_batch=4, max_seq_len=64, block_size=16, device="cpu", kv_layout="pool",
                          num_pages=5)
    prime_decode(engine, 4, 40)
    assert int(engine.block_table[:4].max()) < engine.pool.num_pages == 5
    assert time_step(engine, 4, 40, iters=1, warmup=1) > 0
