"""Geometric and K3 rejection against hand-computed scores."""

import math

import torch

from tests.correction.cases import RHO, batch
from trace_rl.correction import GeometricRejection, K3Rejection
from trace_rl.data import schema as K


def kept_rows(td) -> list[bool]:
    return td[K.CORRECTION_MASK].any(-1).tolist()


def k3(r: float) -> float:
    return r - math.log(r) - 1


def test_geometric_rejection():
    geo = [math.prod(r) ** (1 / len(r)) for r in RHO[:3]]  # 1.442, .25, 1.133
    assert geo[0] > 1.2 and geo[1] < 0.9 and 0.9 < geo[2] < 1.2
    assert kept_rows(GeometricRejection(lo=0.9, hi=1.2)(batch())) == [False, False, True, False]
    assert kept_rows(GeometricRejection(lo=0.2, hi=1.5)(batch())) == [True, True, True, False]
    # whole sequences go: every real token of row 2 is kept
    td = GeometricRejection(lo=0.9, hi=1.2)(batch())
    assert td[K.CORRECTION_MASK][2].tolist() == [True] * 4


def test_k3_rejection_mean_and_max():
    means = [sum(map(k3, r)) / len(r) for r in RHO[:3]]  # .467, .636, .0248
    maxes = [max(map(k3, r)) for r in RHO[:3]]  # .901, .636, .0945
    assert means[2] < 0.05 < maxes[2] < 0.1
    assert kept_rows(K3Rejection(threshold=0.05, reduce="mean")(batch())) == [False, False, True, False]
    assert kept_rows(K3Rejection(threshold=0.05, reduce="max")(batch())) == [False, False, False, False]
    assert kept_rows(K3Rejection(threshold=0.1, reduce="max")(batch())) == [False, False, True, False]
    assert kept_rows(K3Rejection(threshold=0.5, reduce="mean")(batch())) == [True, False, True, False]


def test_identical_policies_reject_nothing():
    same = [[1.0] * len(r) for r in RHO]
    for corr in (GeometricRejection(0.999, 1.001), K3Rejection(0.0, "mean"), K3Rejection(0.0, "max")):
        td = corr(batch(same))
        assert torch.equal(td[K.CORRECTION_MASK], td[K.MASK_RESPONSE])
