"""Trainer log-probs: aligned with each row's own prompt length, first response token included, and
equal to the rollout's log-probs of the same (processed) distribution."""

import torch

from tests.tiny_lm import TinyLM
from trace_rl.data import schema as K
from trace_rl.data.padding import pad_right
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.recompute import RecomputeEngine
from trace_rl.objectives.logprobs import TrainerLogProbs, response_log_probs

PROMPTS = [[3, 5, 7, 2], [4], [9, 1]]
RESPONSES = [[1, 2], [6, 6, 6, 5], [8]]


def _batch():
    pt, pm = pad_right([torch.tensor(p) for p in PROMPTS])
    rt, rm = pad_right([torch.tensor(r) for r in RESPONSES])
    return pt, pm, rt, rm


def test_matches_unpadded_forward_row_by_row():
    model = TinyLM(vocab_size=12)
    lp, ent = response_log_probs(model, *_batch(), temperature=0.7, return_entropy=True)
    assert lp.shape == (3, 4)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES)):
        logits = model(torch.tensor([p + r]))[0] / 0.7
        logq = torch.log_softmax(logits, -1)
        positions = torch.arange(len(p) - 1, len(p) + len(r) - 1)  # first one: the last prompt position
        torch.testing.assert_close(lp[i, : len(r)], logq[positions, torch.tensor(r)])
        expected_entropy = -(logq.exp() * logq).sum(-1)[positions]
        torch.testing.assert_close(ent[i, : len(r)], expected_entropy)
        assert (lp[i, len(r):] == 0).all()
    assert (lp[:, 0] != 0).all()  # the first response log-prob is never zeroed


def test_rollout_and_trainer_agree_for_the_same_weights():
    model = TinyLM(vocab_size=12, seed=2)
    sampling = SamplingParams(n=3, temperature=0.8, top_k=6, top_p=0.9, max_new_tokens=6, seed=1)
    pt, pm = pad_right([torch.tensor(p) for p in PROMPTS])
    from tensordict import TensorDict

    out = RecomputeEngine(model).generate(TensorDict({K.TOKENS_PROMPT: pt, K.MASK_PROMPT: pm}, [3]), sampling)
    TrainerLogProbs.from_sampling(model, sampling, micro_batch_size=4)(out)
    torch.testing.assert_close(out[K.LOGP_TRAINER], out[K.LOGP_ROLLOUT], rtol=1e-5, atol=1e-5)
    assert torch.equal(out[K.LOGP_OLD], out[K.LOGP_TRAINER])
    assert not out[K.LOGP_TRAINER].requires_grad


def test_gradient_flows_to_the_model():
    model = TinyLM(vocab_size=12)
    lp, _ = response_log_probs(model, *_batch())
    lp.sum().backward()
    assert model.embed.weight.grad is not None and model.embed.weight.grad.abs().sum() > 0
