"""Routing drift metrics on hand-made expert records."""

import math

import torch
from tensordict import TensorDict

from trace_rl.correction import DriftMetrics
from trace_rl.correction.routing_metrics import routing_drift
from trace_rl.data import schema as K


def _case():
    layer0_r = [[0, 1], [2, 3], [0, 1], [4, 5]]
    layer0_t = [[1, 0], [2, 4], [0, 1], [6, 7]]     # same set (order differs), half, same, none (invalid)
    same = [[1, 2], [3, 4], [5, 6], [7, 0]]
    rollout = torch.tensor([layer0_r, same]).permute(1, 0, 2)[None].to(torch.int16)   # [1, 4, 2, 2]
    trainer = torch.tensor([layer0_t, same]).permute(1, 0, 2)[None].to(torch.int16)
    valid = torch.tensor([[True, True, True, False]])
    return rollout, trainer, valid


def test_mismatch_and_overlap_by_layer_and_position():
    rollout, trainer, valid = _case()
    r = routing_drift(rollout, trainer, valid, torch.tensor([2]), [0, 1, 2])
    assert math.isclose(r.metrics["routing_mismatch/moe0"], 1 / 3)
    assert math.isclose(r.metrics["routing_overlap/moe0"], 2.5 / 3)
    assert r.metrics["routing_mismatch/moe1"] == 0 and r.metrics["routing_overlap/moe1"] == 1
    assert math.isclose(r.metrics["routing_mismatch"], 1 / 6) and math.isclose(r.metrics["routing_overlap"], 5.5 / 6)
    assert r.count == [1, 0] and r.mismatch_by_position[0] == 0 and math.isnan(r.mismatch_by_position[1])
    flat = r.flat()
    assert flat["routing_by_position/count/0-1"] == 1.0 and math.isnan(flat["routing_by_position/mismatch/1-2"])


def test_records_of_another_width_and_no_valid_position():
    rollout, trainer, valid = _case()
    wide = torch.cat([rollout, rollout[:, :2]], 1)                      # the batch's records were wider
    r = routing_drift(wide, trainer, torch.cat([valid, torch.zeros(1, 2, dtype=torch.bool)], 1),
                      torch.tensor([2]), [0, 1, 2])
    assert math.isclose(r.metrics["routing_mismatch"], 1 / 6)
    none = routing_drift(rollout, trainer, torch.zeros_like(valid), torch.tensor([2]), [0, 1, 2])
    assert math.isnan(none.metrics["routing_mismatch"])                  # 0/0, never a made-up 0


def test_drift_metrics_report_routing_when_the_batch_has_it():
    rollout, trainer, valid = _case()
    td = TensorDict({K.LOGP_ROLLOUT: torch.zeros(1, 2), K.LOGP_TRAINER: torch.zeros(1, 2),
                     K.MASK_RESPONSE: torch.ones(1, 2, dtype=torch.bool),
                     K.MASK_PROMPT: torch.ones(1, 2, dtype=torch.bool)}, batch_size=[1])
    assert DriftMetrics()(td).routing is None
    td.set(K.ROUTING_EXPERTS, rollout)
    td.set(K.ROUTING_VALID, valid)
    td.set(K.ROUTING_TRAINER, trainer)
    flat = DriftMetrics()(td).flat()
    assert math.isclose(flat["routing_mismatch"], 1 / 6) and "mismatch_k3" in flat
