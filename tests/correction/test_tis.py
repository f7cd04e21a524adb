"""Token and sequence TIS against hand-computed weights, with padding and ragged lengths."""

import math

import torch

from tests.correction.cases import RHO, batch, per_row, per_token
from trace_rl.correction import Corrections, SequenceTIS, TokenTIS
from trace_rl.data import schema as K


def test_token_tis_is_min_rho_c():
    td = TokenTIS(C=2.0)(batch())
    expected = per_token([[2.0, 0.5, 2.0], [0.25], [1.0, 1.0, 1.5, 1.1], []])
    torch.testing.assert_close(td[K.CORRECTION_WEIGHT], expected)
    assert torch.equal(td[K.CORRECTION_MASK], td[K.MASK_RESPONSE])  # TIS masks nothing


def test_sequence_tis_is_min_product_c():
    td = SequenceTIS(C=2.0)(batch())
    products = [2.0 * 0.5 * 3.0, 0.25, 1.0 * 1.0 * 1.5 * 1.1]  # 3, .25, 1.65
    expected = per_token(per_row([min(p, 2.0) for p in products] + [0.0]))
    torch.testing.assert_close(td[K.CORRECTION_WEIGHT], expected)


def test_long_sequence_product_does_not_overflow():
    rho = [[math.e] * 4]
    td = SequenceTIS(C=5.0)(batch(rho))
    torch.testing.assert_close(td[K.CORRECTION_WEIGHT], torch.full((1, 4), 5.0))


def test_identical_policies_give_weight_one():
    same = [[1.0] * len(r) for r in RHO]
    for corr in (TokenTIS(C=2.0), SequenceTIS(C=2.0)):
        td = corr(batch(same))
        torch.testing.assert_close(td[K.CORRECTION_WEIGHT], per_token([[1.0] * len(r) for r in RHO]))


def test_weights_are_detached_and_clamped():
    td = batch()
    td[K.LOGP_TRAINER] = td[K.LOGP_TRAINER].clone().requires_grad_(True)
    out = Corrections([TokenTIS(C=10.0)], max_weight=2.5)(td)
    w = out[K.CORRECTION_WEIGHT]
    assert not w.requires_grad
    assert w[0].tolist()[:3] == [2.0, 0.5, 2.5]
