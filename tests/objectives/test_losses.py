"""GRPO and CISPO on hand-made tensors: values, clipping, per-token advantages of ragged lengths,
corrections, KL to a reference, and torchrl LossModule interop."""

import math

import pytest
import torch
from tensordict import TensorDict
from torchrl.objectives import LossModule

from trace_rl.data import schema as K
from trace_rl.objectives import CISPOLoss, GRPOLoss, LossConfig

# two sequences of lengths 3 and 1, right-padded to 3
MASK = torch.tensor([[True, True, True], [True, False, False]])
OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.5, 0.0, 0.0]])
# current - old = log r: tokens of row 0 have r = 1.5, 0.7, 1.0; row 1 r = 0.5
LOG_R = torch.tensor([[math.log(1.5), math.log(0.7), 0.0], [math.log(0.5), 0.0, 0.0]])


def batch(advantage, extra=None):
    current = (OLD + LOG_R).clone().requires_grad_(True)
    td = TensorDict({K.MASK_RESPONSE: MASK, K.LOGP_OLD: OLD, K.LOGP_CURRENT: current, K.ADVANTAGE: advantage,
                     **(extra or {})}, batch_size=[2])
    return td, current


def grpo_token(r, a, lo=0.2, hi=0.28):
    return -min(r * a, min(max(r, 1 - lo), 1 + hi) * a)


def test_grpo_value_and_asymmetric_clip_by_hand():
    td, _ = batch(torch.tensor([1.0, -2.0]))
    out = GRPOLoss()(td)
    # row 0 (A=1): r 1.5 -> clipped to 1.28; .7 -> min(.7, .8) = .7; 1 -> 1. row 1 (A=-2): r .5 -> clipped .8
    expected = [grpo_token(1.5, 1), grpo_token(0.7, 1), grpo_token(1.0, 1), grpo_token(0.5, -2)]
    assert expected == pytest.approx([-1.28, -0.7, -1.0, 1.6])
    assert out["loss_objective"].item() == pytest.approx(sum(expected) / 4)
    assert out["clip_fraction"].item() == pytest.approx(2 / 4)  # r=1.5 with A>0, r=.5 with A<0
    assert out["ratio_mean"].item() == pytest.approx((1.5 + 0.7 + 1.0 + 0.5) / 4)
    r = [1.5, 0.7, 1.0, 0.5]
    assert out["kl_old"].item() == pytest.approx(sum(x - 1 - math.log(x) for x in r) / 4)


def test_per_token_advantages_of_ragged_lengths_stay_aligned():
    """torchrl 0.14's GRPOLoss left-pads ragged per-token tensors and zeroes the first response
    log-prob; here position t of the advantage meets position t of the response."""
    adv = torch.tensor([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0]])  # 99: padding, must not count
    td, _ = batch(adv)
    current = OLD.clone().requires_grad_(True)  # r = 1 everywhere: grad = -A / N
    td[K.LOGP_CURRENT] = current
    GRPOLoss()(td)["loss_objective"].backward()
    expected = torch.tensor([[-1.0, -2.0, -3.0], [-4.0, 0.0, 0.0]]) / 4
    torch.testing.assert_close(current.grad, expected)
    assert current.grad[:, 0].abs().min() > 0  # the first response token has its gradient


def test_correction_weight_and_mask_enter_the_loss():
    weight = torch.tensor([[2.0, 1.0, 0.5], [1.0, 0.0, 0.0]])
    keep = torch.tensor([[True, False, True], [True, False, False]])
    td, _ = batch(torch.tensor([1.0, -2.0]), {K.CORRECTION_WEIGHT: weight, K.CORRECTION_MASK: keep})
    out = GRPOLoss()(td)
    # kept: (0,0) w2, (0,2) w.5, (1,0) w1; the masked token leaves the denominator (3, not 4)
    expected = (2 * grpo_token(1.5, 1) + 0.5 * grpo_token(1.0, 1) + grpo_token(0.5, -2)) / 3
    assert out["loss_objective"].item() == pytest.approx(expected)
    assert out["kept_tokens"].item() == 3


def test_sequence_mean_and_constant_aggregation():
    adv = torch.tensor([1.0, -2.0])
    t = [grpo_token(1.5, 1), grpo_token(0.7, 1), grpo_token(1.0, 1), grpo_token(0.5, -2)]
    out = GRPOLoss(aggregation="sequence_mean")(batch(adv)[0])
    assert out["loss_objective"].item() == pytest.approx((sum(t[:3]) / 3 + t[3]) / 2)
    out = GRPOLoss(aggregation="constant", normalizer=8)(batch(adv)[0])
    assert out["loss_objective"].item() == pytest.approx(sum(t) / (2 * 8))


def test_cispo_value_and_gradient_by_hand():
    adv = torch.tensor([1.0, -2.0])
    td, current = batch(adv)
    out = CISPOLoss(clip_epsilon=(0.2, 0.28))(td)
    r = [1.5, 0.7, 1.0, 0.5]
    w = [1.28, 0.8, 1.0, 0.8]  # clip(r, .8, 1.28)
    a = [1.0, 1.0, 1.0, -2.0]
    lp = [(OLD + LOG_R)[0, 0], (OLD + LOG_R)[0, 1], (OLD + LOG_R)[0, 2], (OLD + LOG_R)[1, 0]]
    expected = sum(-wi * ai * float(li) for wi, ai, li in zip(w, a, lp)) / 4
    assert out["loss_objective"].item() == pytest.approx(expected, rel=1e-5)
    assert out["clip_fraction"].item() == pytest.approx(3 / 4)
    out["loss_objective"].backward()
    # every token keeps a gradient, scaled by the clipped weight (unlike PPO's clip)
    expected_grad = torch.tensor([[-1.28, -0.8, -1.0], [1.6, 0.0, 0.0]]) / 4
    torch.testing.assert_close(current.grad, expected_grad)
    assert [min(max(x, 0.8), 1.28) for x in r] == w


def test_cispo_default_has_no_lower_clip():
    td, _ = batch(torch.tensor([1.0, -2.0]))
    out = CISPOLoss()(td)
    assert out["clip_fraction"].item() == pytest.approx(1 / 4)  # only r = 1.5 > 1.28


def test_kl_to_reference_by_hand():
    ref = OLD + torch.tensor([[0.1, -0.2, 0.0], [0.3, 5.0, 5.0]])
    td, _ = batch(torch.tensor([1.0, -2.0]), {K.LOGP_REF: ref})
    out = GRPOLoss(kl_to_ref_coeff=0.5)(td)
    d = [float(ref[0, 0] - (OLD + LOG_R)[0, 0]), float(ref[0, 1] - (OLD + LOG_R)[0, 1]),
         float(ref[0, 2] - (OLD + LOG_R)[0, 2]), float(ref[1, 0] - (OLD + LOG_R)[1, 0])]
    kl = sum(math.exp(x) - x - 1 for x in d) / 4
    assert out["kl_to_ref"].item() == pytest.approx(kl, rel=1e-5)
    assert out["loss_kl_to_ref"].item() == pytest.approx(0.5 * kl, rel=1e-5)


def test_losses_are_torchrl_loss_modules_with_set_keys():
    loss = GRPOLoss()
    assert isinstance(loss, LossModule) and isinstance(CISPOLoss(), LossModule)
    loss.set_keys(advantage="my_adv", old_log_prob=("log_probs", "trainer"))
    assert "my_adv" in loss.in_keys and K.LOGP_TRAINER in loss.in_keys
    td, _ = batch(torch.tensor([1.0, -2.0]))
    td["my_adv"] = td.pop(K.ADVANTAGE)
    td[K.LOGP_TRAINER] = td.pop(K.LOGP_OLD)
    out = loss(td)
    assert [k for k in out.keys() if k.startswith("loss_")] == ["loss_objective"]
    with pytest.raises(ValueError):
        loss.set_keys(not_a_key="x")
    loss.set_keys(advantage=None)
    assert loss.tensor_keys.advantage == K.ADVANTAGE


def test_missing_old_log_prob_is_a_clear_error():
    td, _ = batch(torch.tensor([1.0, -2.0]))
    del td[K.LOGP_OLD]
    with pytest.raises(KeyError, match="TrainerLogProbs"):
        GRPOLoss()(td)


def test_bad_advantage_shape_and_config():
    td, _ = batch(torch.ones(2, 2))  # neither [B] nor [B, Lr]
    with pytest.raises(ValueError, match="advantage"):
        GRPOLoss()(td)
    with pytest.raises(ValueError):
        GRPOLoss(aggregation="constant")
    cfg = LossConfig.from_yaml("kind: cispo\naggregation: sequence_mean\n")
    assert isinstance(cfg.build(), CISPOLoss)
    assert cfg.build().clip_low == 1.0
