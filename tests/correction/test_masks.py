"""Token and sequence masks against hand-computed keep patterns."""

import pytest
import torch

from tests.correction.cases import RHO, batch
from trace_rl.correction import SequenceMask, TokenMask
from trace_rl.data import schema as K

F, T = False, True


def test_token_mask_keeps_lo_le_rho_le_hi():
    td = TokenMask(lo=0.5, hi=2.0)(batch())
    # bounds are inclusive: 2.0 and 0.5 are kept, 3.0 and 0.25 are not
    assert td[K.CORRECTION_MASK].tolist() == [[T, T, F, F], [F, F, F, F], [T, T, T, T], [F, F, F, F]]
    # a mask-only correction leaves weight 1 on kept tokens
    assert td[K.CORRECTION_WEIGHT][2].tolist() == [1.0] * 4


def test_sequence_mask_on_product():
    # products: 3, .25, 1.65
    td = SequenceMask(lo=0.5, hi=2.0)(batch())
    assert td[K.CORRECTION_MASK].tolist() == [[F] * 4, [F] * 4, [T] * 4, [F] * 4]
    td = SequenceMask(lo=0.2, hi=3.0)(batch())
    assert td[K.CORRECTION_MASK].tolist() == [[T, T, T, F], [T, F, F, F], [T] * 4, [F] * 4]


def test_identical_policies_mask_nothing():
    same = [[1.0] * len(r) for r in RHO]
    for corr in (TokenMask(0.9, 1.1), SequenceMask(0.9, 1.1)):
        td = corr(batch(same))
        assert torch.equal(td[K.CORRECTION_MASK], td[K.MASK_RESPONSE])


def test_bounds_are_validated():
    with pytest.raises(ValueError):
        TokenMask(lo=2.0, hi=1.0)
    with pytest.raises(ValueError):
        SequenceMask(lo=-1.0)
