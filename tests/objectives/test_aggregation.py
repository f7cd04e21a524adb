"""Loss aggregation by hand: masked tokens leave the denominator."""

import math

import pytest
import torch

from trace_rl.objectives.aggregation import aggregate

VALUES = torch.tensor([[1.0, 2.0, 3.0], [4.0, float("nan"), 0.0], [5.0, 6.0, 7.0]])
MASK = torch.tensor([[True, True, True], [True, False, False], [False, False, False]])


def test_token_mean():
    assert aggregate(VALUES, MASK, "token_mean").item() == pytest.approx((1 + 2 + 3 + 4) / 4)


def test_sequence_mean_skips_empty_sequences():
    assert aggregate(VALUES, MASK, "sequence_mean").item() == pytest.approx((2.0 + 4.0) / 2)


def test_constant_normaliser_counts_every_row():
    assert aggregate(VALUES, MASK, "constant", normalizer=5).item() == pytest.approx(10 / (3 * 5))
    with pytest.raises(ValueError):
        aggregate(VALUES, MASK, "constant")


def test_nan_in_kept_token_stays_nan_and_empty_is_zero():
    assert math.isnan(aggregate(VALUES, torch.ones_like(MASK), "token_mean").item())
    assert aggregate(VALUES, torch.zeros_like(MASK), "token_mean").item() == 0.0
