"""The `hf` part: HF's decode clock (rate arithmetic, the wall-time stop, never before token 2), and the part end to
end on CPU with the tiny preset, HF cut short by its time limit and the native engine timed over the same tokens."""

from __future__ import annotations

import argparse

import pytest
import torch

from trace_rl.bench.hf import DecodeClock, decode_rate, ratio
from trace_rl.bench.rollout import add_rollout_bench_args, run_rollout_bench

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class FakeTime:
    def __init__(self):
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def ids(batch: int, width: int) -> torch.Tensor:
    return torch.zeros(batch, width, dtype=torch.long)


def test_decode_rate_counts_the_decode_steps_after_token_1():
    assert decode_rate(16, 11, 2.0, 7.0) == 16 * 10 / 5.0          # tokens 2..11 of 16 rows in 5 s
    assert decode_rate(16, 1, 2.0, 7.0) is None                    # no decode step yet
    assert decode_rate(16, 5, None, 7.0) is None and decode_rate(16, 5, 7.0, 7.0) is None
    assert ratio(200.0, 10.0) == 20.0 and ratio(None, 10.0) is None and ratio(5.0, None) is None


def test_clock_stops_at_its_limit_and_times_tokens_2_to_n():
    now, lines = FakeTime(), []
    clock = DecodeClock(prompt_width=4, new_tokens=100, limit_s=10.0, device="cpu", log=lines.append, every=3,
                        now=now)
    now.t += 1.5                                    # the prefill
    assert not clock(ids(2, 5), None).any()         # token 1
    for n in range(2, 8):                           # 2 s per token: the limit passes at token 6 (11.5 s > 10)
        now.t += 2.0
        stop = clock(ids(2, 4 + n), None)
        assert stop.shape == (2,) and stop.dtype == torch.bool
        if stop.all():
            break
    assert n == 6 and clock.stopped_at == 6
    r = clock.result(batch=2)
    assert r["hf_truncated"] and r["hf_tokens_reached"] == 6 and r["hf_time_limit_s"] == 10.0
    assert r["hf_token1_s"] == 1.5 and r["hf_last_token_s"] == 11.5 and r["hf_last_token_synced"]
    assert r["hf_decode_s"] == 10.0 and r["hf_decode_tokens_per_s"] == 2 * 5 / 10.0
    assert r["hf_progress"] == [(3, 5.5), (6, 11.5)]          # every 3rd token, and the last
    assert any("time limit" in line for line in lines)


def test_clock_never_stops_before_token_2_and_a_whole_run_is_not_truncated():
    now = FakeTime()
    clock = DecodeClock(prompt_width=3, new_tokens=4, limit_s=0.5, device="cpu", log=lambda s: None, every=100,
                        now=now)
    now.t += 5.0                                    # the limit passed during the prefill
    assert not clock(ids(1, 4), None).any()         # token 1: never stopped (no rate yet)
    now.t += 1.0
    assert clock(ids(1, 5), None).all()             # token 2: stopped
    assert clock.result(1)["hf_decode_tokens_per_s"] == 1.0
    unlimited = DecodeClock(3, 4, 0.0, "cpu", lambda s: None, every=100, now=now)
    for n in range(1, 5):
        now.t += 1.0
        assert not unlimited(ids(1, 3 + n), None).any()
    r = unlimited.result(1)
    assert not r["hf_truncated"] and r["hf_tokens_reached"] == 4 and r["hf_time_limit_s"] is None
    assert r["hf_decode_tokens_per_s"] == 3 / 3.0 and r["hf_last_token_synced"]     # the last token is synced


def test_hf_part_with_a_time_limit_tiny_cpu(tmp_path):
    """A limit shorter than one step cuts HF at token 2; the native engine is then timed over the same 2 tokens,
    and the row and summary say HF was truncated (no whole-run ratio)."""
    pytest.importorskip("transformers")
    args = add_rollout_bench_args(argparse.ArgumentParser()).parse_args(
        ["--parts", "hf", "--models", "tiny", "--prompt-len", "5", "--hf-batch", "2", "--hf-new-tokens", "6",
         "--hf-time-limit", "1e-6", "--device", "cpu", "--out", str(tmp_path)])
    report = run_rollout_bench(args)
    assert not report["errors"], report["errors"]
    row = report["hf"][0]
    assert row["hf_truncated"] and row["hf_tokens_reached"] == 2 and row["hf_generated_tokens"] == 2
    assert row["hf_decode_tokens_per_s"] > 0 and row["native_decode_tokens_per_s_same_tokens"] > 0
    assert row["native_same_tokens_s"] != row["native_s"]                 # timed again for 2 tokens, not 6
    assert row["native_vs_hf_decode_same_tokens"] == pytest.approx(
        row["native_decode_tokens_per_s_same_tokens"] / row["hf_decode_tokens_per_s"])
    assert row["speedup"] is None and row["native_decode_tokens_per_s_full"] > 0
    line = next(x for x in report["summary"] if "native_vs_hf_decode_same_tokens" in x)
    assert line["hf_truncated"] and line["hf_tokens_reached"] == 2 and line["native_vs_hf_whole_run"] is None
    assert any("TRUNCATED at token 2/6" in s for s in report["log"])
