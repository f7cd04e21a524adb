"""Drift metrics against values computed by hand from the ratios, with padding and ragged lengths."""

import math

import pytest
import torch
from tensordict import TensorDict

from tests.correction.cases import RHO, batch
from trace_rl.correction import (
    METRIC_NAMES,
    Corrections,
    DriftMetrics,
    TokenMask,
    drift_metrics,
    mismatch_by_position,
)
from trace_rl.data import schema as K


def metrics_of(td, keep=None):
    return drift_metrics(td[K.LOGP_ROLLOUT], td[K.LOGP_TRAINER], td[K.MASK_RESPONSE], keep)


def test_names_are_exactly_the_documented_ones():
    assert set(metrics_of(batch())) == set(METRIC_NAMES) == {
        "mismatch_k1", "mismatch_k3", "abs_log_ratio_mean", "abs_log_ratio_max", "chi2_token", "chi2_seq",
        "ess", "token_mult_prob_error", "ppl_ratio", "frac_masked_tokens", "frac_rejected_seqs"}
    assert all(isinstance(v, float) for v in metrics_of(batch()).values())


def test_each_metric_by_hand():
    seqs = [r for r in RHO if r]  # the empty row counts for nothing
    tokens = [x for r in seqs for x in r]
    n = len(tokens)
    delta = [-math.log(x) for x in tokens]  # log π_rollout − log π_trainer
    expected = {
        "mismatch_k1": sum(delta) / n,
        "mismatch_k3": sum(x - math.log(x) - 1 for x in tokens) / n,
        "abs_log_ratio_mean": sum(abs(d) for d in delta) / n,
        "abs_log_ratio_max": math.log(4.0),  # ρ = 0.25
        "chi2_token": sum(x * x for x in tokens) / n - 1,
        "chi2_seq": sum(math.prod(r) ** 2 for r in seqs) / len(seqs) - 1,
        "ess": sum(tokens) ** 2 / (n * sum(x * x for x in tokens)),
        "token_mult_prob_error": sum(math.exp(abs(d)) for d in delta) / n,
        "ppl_ratio": sum(math.exp(sum(-math.log(x) for x in r) / len(r)) for r in seqs) / len(seqs),
        "frac_masked_tokens": 0.0,
        "frac_rejected_seqs": 0.0,
    }
    got = metrics_of(batch())
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, rel=1e-5, abs=1e-6), name


def test_masked_and_rejected_fractions():
    td = Corrections([TokenMask(0.5, 2.0)])(batch())
    got = metrics_of(td, td[K.CORRECTION_MASK])
    # token mask drops ρ=3 (row 0) and ρ=.25 (row 1, its only token): 2 of 8 tokens, 1 of 3 sequences
    assert got["frac_masked_tokens"] == pytest.approx(2 / 8)
    assert got["frac_rejected_seqs"] == pytest.approx(1 / 3)


def test_identical_policies():
    got = metrics_of(batch([[1.0] * len(r) for r in RHO]))
    for name in ("mismatch_k1", "mismatch_k3", "abs_log_ratio_mean", "abs_log_ratio_max", "chi2_token",
                 "chi2_seq", "frac_masked_tokens", "frac_rejected_seqs"):
        assert got[name] == 0.0, name
    for name in ("ess", "token_mult_prob_error", "ppl_ratio"):
        assert got[name] == pytest.approx(1.0), name


def test_nan_log_prob_makes_metrics_nan_not_zero():
    td = batch()
    td[K.LOGP_ROLLOUT][2, 0] = float("nan")
    got = metrics_of(td)
    for name in ("mismatch_k1", "mismatch_k3", "abs_log_ratio_mean", "abs_log_ratio_max", "chi2_token",
                 "chi2_seq", "ess", "token_mult_prob_error", "ppl_ratio"):
        assert math.isnan(got[name]), name
    by_pos = mismatch_by_position(td[K.LOGP_ROLLOUT], td[K.LOGP_TRAINER], td[K.MASK_RESPONSE])
    assert math.isnan(by_pos.abs_log_ratio[0])


def test_no_real_tokens_gives_nan_not_zero():
    got = metrics_of(batch([[]]))
    assert math.isnan(got["mismatch_k1"]) and math.isnan(got["ess"])


def test_mismatch_by_position_by_hand():
    td = batch()
    pos = mismatch_by_position(td[K.LOGP_ROLLOUT], td[K.LOGP_TRAINER], td[K.MASK_RESPONSE])
    assert pos.edges == [0, 1, 2, 4]  # power-of-two bins for width 4
    # position 0: ρ 2, .25, 1; position 1: .5, 1; positions 2-3: 3, 1.5, 1.1
    bins = [[2.0, 0.25, 1.0], [0.5, 1.0], [3.0, 1.5, 1.1]]
    assert pos.count == [3, 2, 3]
    for i, b in enumerate(bins):
        assert pos.abs_log_ratio[i] == pytest.approx(sum(abs(math.log(x)) for x in b) / len(b))
        assert pos.k1[i] == pytest.approx(sum(-math.log(x) for x in b) / len(b))
        assert pos.k3[i] == pytest.approx(sum(x - math.log(x) - 1 for x in b) / len(b))
    custom = mismatch_by_position(td[K.LOGP_ROLLOUT], td[K.LOGP_TRAINER], td[K.MASK_RESPONSE], [0, 2, 8])
    assert custom.count == [5, 3]
    empty = mismatch_by_position(td[K.LOGP_ROLLOUT], td[K.LOGP_TRAINER], td[K.MASK_RESPONSE], [0, 4, 8])
    assert empty.count == [8, 0] and math.isnan(empty.abs_log_ratio[1])
    assert "mismatch_by_position/k3/0-1" in pos.flat()
    for i, b in enumerate(bins):                      # ess of each bin's ratios: (Σρ)² / (n Σρ²)
        assert pos.ess[i] == pytest.approx(sum(b) ** 2 / (len(b) * sum(x * x for x in b)))
    assert math.isnan(empty.ess[1])                   # an empty bin: NaN, not a made-up 1
    assert pos.flat()["mismatch_by_position/ess/2-4"] == pytest.approx(pos.ess[2])


def test_ess_by_position_exact_at_log_ratios_that_overflow():
    """Each bin is scaled by its own largest ρ: e^1000 in one bin neither overflows it nor touches the other."""
    lp_rollout = torch.tensor([[0.0, -1000.0, 0.0, 0.0], [0.0, -1000.0, -999.0, 0.0]])
    pos = mismatch_by_position(lp_rollout, torch.zeros(2, 4), torch.ones(2, 4, dtype=torch.bool), [0, 1, 4])
    assert pos.ess[0] == pytest.approx(1.0)                       # position 0: ρ = 1, 1
    scaled = [1.0, 1.0, math.exp(-1.0)]                           # ρ / e^1000; the three ρ = 1 vanish (e^-1000)
    assert pos.ess[1] == pytest.approx(sum(scaled) ** 2 / (6 * sum(x * x for x in scaled)), rel=1e-12)


def test_drift_metrics_module_reads_correction_mask():
    td = Corrections([TokenMask(0.5, 2.0)])(batch())
    report = DriftMetrics()(td)
    assert report.metrics["frac_masked_tokens"] == pytest.approx(0.25)
    assert report.by_position.count == [3, 2, 3]
    assert set(METRIC_NAMES) <= set(report.flat())


def test_metrics_are_computed_in_float32_from_bf16():
    td = batch()
    got = drift_metrics(td[K.LOGP_ROLLOUT].bfloat16(), td[K.LOGP_TRAINER].bfloat16(), td[K.MASK_RESPONSE])
    assert math.isfinite(got["ess"]) and 0 < got["ess"] <= 1


def test_zero_length_responses_give_nan_not_a_crash():
    empty = TensorDict({K.LOGP_ROLLOUT: torch.zeros(3, 0), K.LOGP_TRAINER: torch.zeros(3, 0),
                        K.MASK_RESPONSE: torch.zeros(3, 0, dtype=torch.bool),
                        K.CORRECTION_MASK: torch.zeros(3, 0, dtype=torch.bool)}, batch_size=[3])
    report = DriftMetrics()(empty)
    assert set(report.metrics) == set(METRIC_NAMES)
    for name in ("mismatch_k1", "mismatch_k3", "abs_log_ratio_max", "ess", "chi2_seq", "ppl_ratio"):
        assert math.isnan(report.metrics[name]), name
    assert report.by_position.count == [0]


def test_ess_exact_at_log_ratios_that_overflow_float32():
    """ρ = e^100 and e^1000 overflow float32 (and e^1000 float64); ess is scale-free: (Σρ)²/(NΣρ²) = 1/3
    when one token dominates, 1/2 for two equal dominant ones."""
    mask = torch.ones(1, 3, dtype=torch.bool)
    for big in (100.0, 1000.0):
        lp_rollout = torch.tensor([[0.0, -big, -big / 2]])
        got = drift_metrics(lp_rollout, torch.zeros(1, 3), mask)["ess"]
        assert got == pytest.approx(1 / 3, rel=1e-12), big
    two = drift_metrics(torch.tensor([[-300.0, -300.0, 0.0]]), torch.zeros(1, 3), mask)["ess"]
    assert two == pytest.approx(2 / 3, rel=1e-12)           # (2x)² / (3 · 2x²)
