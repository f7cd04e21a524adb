"""What each correction does on its own, per step: the share of real tokens it masks and the share whose weight
it truncates (`correction_fractions`), by hand on the shared cases."""

import math

import pytest
import torch

from tests.correction.cases import RHO, batch
from trace_rl.correction import (
    Corrections,
    GeometricRejection,
    SequenceTIS,
    TokenMask,
    TokenTIS,
    correction_fractions,
)
from trace_rl.data import schema as K

REAL = sum(len(r) for r in RHO)          # 8 real tokens (padding holds NaN and must not count)


def fractions(corrections):
    td = batch()
    return correction_fractions(corrections, td[K.LOGP_ROLLOUT], td[K.LOGP_TRAINER], td[K.MASK_RESPONSE])


def test_token_tis_truncates_the_ratios_above_c():
    got = fractions(Corrections([TokenTIS(C=1.2)]))
    above = sum(x > 1.2 for r in RHO for x in r)                      # 2.0, 3.0, 1.5
    assert got == {"correction/token_tis/frac_masked": 0.0,
                   "correction/token_tis/frac_truncated": pytest.approx(above / REAL)}


def test_masks_count_what_each_drops_on_its_own():
    got = fractions([TokenMask(0.5, 2.0), GeometricRejection(lo=0.9, hi=1.2)])
    dropped = sum(not 0.5 <= x <= 2.0 for r in RHO for x in r)       # 0.25 and 3.0
    geo = [math.exp(sum(map(math.log, r)) / len(r)) for r in RHO if r]
    rejected = sum(len(r) for r, g in zip([r for r in RHO if r], geo) if not 0.9 <= g <= 1.2)
    assert got["correction/token_mask/frac_masked"] == pytest.approx(dropped / REAL)
    assert got["correction/geo_reject/frac_masked"] == pytest.approx(rejected / REAL)
    assert got["correction/token_mask/frac_truncated"] == 0.0


def test_sequence_tis_truncates_whole_sequences_and_kinds_listed_twice_are_numbered():
    got = fractions([SequenceTIS(C=2.0), SequenceTIS(C=100.0)])
    over = sum(len(r) for r in RHO if r and math.prod(r) > 2.0)      # 2 * .5 * 3 = 3 (3 tokens); 1.65 is not
    assert got["correction/seq_tis.1/frac_truncated"] == pytest.approx(over / REAL)
    assert got["correction/seq_tis.2/frac_truncated"] == 0.0


def test_no_corrections_no_keys():
    assert fractions(Corrections([])) == {} and fractions([]) == {}


def test_no_real_token_gives_nan_not_zero():
    td = batch()
    mask = torch.zeros_like(td[K.MASK_RESPONSE])
    got = correction_fractions([TokenTIS(C=1.0)], td[K.LOGP_ROLLOUT], td[K.LOGP_TRAINER], mask)
    assert all(math.isnan(v) for v in got.values())                   # 0/0, as drift_metrics says it
