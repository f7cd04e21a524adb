"""With no correction and ρ = 1 the losses' gradient is the plain policy-gradient estimate.

Checked with autograd on a tiny causal LM: the loss (which recomputes log-probs from the padded batch)
against a surrogate built independently, one unpadded sequence at a time.
"""

import pytest
import torch
from tensordict import TensorDict

from tests.tiny_lm import TinyLM
from trace_rl.correction import Corrections, TokenTIS
from trace_rl.data import schema as K
from trace_rl.data.padding import pad_right
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.recompute import RecomputeEngine
from trace_rl.objectives import CISPOLoss, GRPOLoss, TrainerLogProbs

PROMPTS = [[3, 5, 7, 2], [4], [9, 1]]
SAMPLING = SamplingParams(n=2, temperature=0.9, max_new_tokens=5, stop_token_ids=(1,), seed=3)


def rollout(model):
    pt, pm = pad_right([torch.tensor(p) for p in PROMPTS])
    td = RecomputeEngine(model).generate(TensorDict({K.TOKENS_PROMPT: pt, K.MASK_PROMPT: pm}, [3]), SAMPLING)
    TrainerLogProbs.from_sampling(model, SAMPLING)(td)
    td[K.LOGP_ROLLOUT] = td[K.LOGP_TRAINER].clone()  # ρ = 1 exactly
    td[K.ADVANTAGE] = torch.linspace(-1.5, 2.0, td.batch_size[0])
    return td


def plain_pg_surrogate(model, td, weights=None, mode="token_mean", normalizer=None):
    """-Σ w·A·log π(y_t) normalised as the aggregation does, from unpadded per-row forwards."""
    per_row, counts = [], []
    for b in range(td.batch_size[0]):
        prompt = td[K.TOKENS_PROMPT][b][td[K.MASK_PROMPT][b]].tolist()
        n = int(td[K.NUM_GENERATED][b])
        response = td[K.TOKENS_RESPONSE][b, :n].tolist()
        logq = torch.log_softmax(model(torch.tensor([prompt + response]))[0] / SAMPLING.temperature, -1)
        lp = logq[torch.arange(len(prompt) - 1, len(prompt) + n - 1), torch.tensor(response)]
        w = torch.ones(n) if weights is None else weights[b, :n]
        per_row.append(-(w * td[K.ADVANTAGE][b] * lp).sum())
        counts.append(n)
    total = torch.stack(per_row)
    if mode == "token_mean":
        return total.sum() / sum(counts)
    if mode == "sequence_mean":
        return (total / torch.tensor(counts, dtype=torch.float32)).mean()
    return total.sum() / (len(counts) * normalizer)


@pytest.mark.parametrize("loss_cls", [GRPOLoss, CISPOLoss])
@pytest.mark.parametrize("mode", ["token_mean", "sequence_mean", "constant"])
def test_gradient_equals_plain_policy_gradient(loss_cls, mode):
    model = TinyLM(vocab_size=12, seed=1)
    td = Corrections([])(rollout(model))  # no correction: weight 1, mask = response mask
    normalizer = 5.0 if mode == "constant" else None
    loss = loss_cls(model, aggregation=mode, normalizer=normalizer, temperature=SAMPLING.temperature)
    params = list(model.parameters())
    got = torch.autograd.grad(loss(td)["loss_objective"], params)
    want = torch.autograd.grad(plain_pg_surrogate(model, td, mode=mode, normalizer=normalizer), params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_tis_weights_scale_each_token_of_the_gradient():
    model = TinyLM(vocab_size=12, seed=1)
    td = rollout(model)
    noise = torch.randn(td[K.LOGP_ROLLOUT].shape, generator=torch.Generator().manual_seed(0)) * 0.3
    td[K.LOGP_ROLLOUT] = td[K.LOGP_ROLLOUT] + noise  # ρ ≠ 1: rollout drifted
    td = Corrections([TokenTIS(C=1.2)])(td)
    weights = td[K.CORRECTION_WEIGHT]
    assert (weights[td[K.MASK_RESPONSE]] < 1.2 + 1e-6).all() and (weights != 1).any()
    params = list(model.parameters())
    got = torch.autograd.grad(GRPOLoss(model, temperature=0.9)(td)["loss_objective"], params)
    want = torch.autograd.grad(plain_pg_surrogate(model, td, weights), params)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
