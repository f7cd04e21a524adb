"""Composition (weights multiply, masks AND), the registry/config, and NaN handling."""

import math

import pytest
import torch

from tests.correction.cases import batch, per_token
from trace_rl.config import ConfigError
from trace_rl.correction import (
    Corrections,
    CorrectionsConfig,
    SequenceMask,
    SequenceTIS,
    TokenMask,
    TokenTIS,
    build_correction,
    build_corrections,
)
from trace_rl.data import schema as K


def test_weights_multiply_and_masks_and():
    td = Corrections([TokenTIS(C=2.0), SequenceTIS(C=1.2), TokenMask(0.5, 2.0), SequenceMask(0.2, 3.0)])(batch())
    # token w * seq w (products 3, .25, 1.65 cut at 1.2): row0 [2, .5, 2]*1.2; row1 .25*.25; row2 [1,1,1.5,1.1]*1.2
    # token mask keeps row0 [T, T, F], row1 [F]; seq mask keeps rows 0..2
    expected_w = per_token([[2.4, 0.6, 0.0], [0.0], [1.2, 1.2, 1.8, 1.32], []])
    torch.testing.assert_close(td[K.CORRECTION_WEIGHT], expected_w)
    assert td[K.CORRECTION_MASK].tolist() == [
        [True, True, False, False], [False] * 4, [True] * 4, [False] * 4]


def test_composition_is_order_independent():
    a = Corrections([TokenTIS(C=2.0), SequenceMask(0.5, 2.0)])(batch())
    b = Corrections([SequenceMask(0.5, 2.0), TokenTIS(C=2.0)])(batch())
    assert torch.equal(a[K.CORRECTION_WEIGHT], b[K.CORRECTION_WEIGHT])
    assert torch.equal(a[K.CORRECTION_MASK], b[K.CORRECTION_MASK])


def test_no_corrections_give_weight_one_on_real_tokens():
    td = Corrections([])(batch())
    assert torch.equal(td[K.CORRECTION_MASK], td[K.MASK_RESPONSE])
    torch.testing.assert_close(td[K.CORRECTION_WEIGHT], td[K.MASK_RESPONSE].float())


def test_nan_log_prob_is_never_masked_into_a_finite_weight():
    td = batch()
    td[K.LOGP_TRAINER][2, 1] = float("nan")
    out = Corrections([TokenMask(0.5, 2.0), TokenTIS(C=2.0)])(td)
    assert math.isnan(out[K.CORRECTION_WEIGHT][2, 1])
    assert out[K.CORRECTION_MASK][2, 1]
    # NaN in padding is ignored (the fixture's rollout padding is NaN)
    assert torch.isfinite(out[K.CORRECTION_WEIGHT][[0, 1, 3]]).all()


def test_registry_and_config_round_trip():
    yaml_text = """
corrections:
  - {kind: token_tis, params: {C: 2.0}}
  - {kind: seq_mask, params: {lo: 0.5, hi: 2.0}}
max_weight: 10.0
"""
    cfg = CorrectionsConfig.from_yaml(yaml_text)
    assert CorrectionsConfig.from_toml(cfg.to_toml()) == cfg
    built = cfg.build()
    direct = Corrections([TokenTIS(C=2.0), SequenceMask(0.5, 2.0)], max_weight=10.0)
    a, b = built(batch()), direct(batch())
    assert torch.equal(a[K.CORRECTION_WEIGHT], b[K.CORRECTION_WEIGHT])
    assert isinstance(build_correction("k3_reject", threshold=0.1, reduce="max"), object)
    assert len(build_corrections([{"kind": "geo_reject"}, TokenTIS()])) == 2


@pytest.mark.parametrize("bad", [
    {"corrections": [{"kind": "nope"}]},
    {"corrections": [{"kind": "token_tis", "params": {"C": 0}}]},
    {"corrections": [{"kind": "token_tis", "params": {"c": 2}}]},
    {"corrections": [{"kind": "k3_reject", "params": {"reduce": "median"}}]},
])
def test_bad_configs_name_the_field(bad):
    with pytest.raises(ConfigError, match="corrections.0"):
        CorrectionsConfig.parse(bad)


def test_every_params_field_is_documented():
    from trace_rl.config import undocumented_fields
    from trace_rl.correction import CORRECTION_REGISTRY

    for cls in CORRECTION_REGISTRY.values():
        assert undocumented_fields(cls.Params) == []
    assert undocumented_fields(CorrectionsConfig) == []
