"""RecomputeEngine: right-padded prompts of different lengths, n samples, stops, seeds, weights."""

import pytest
import torch
from tensordict import TensorDict

from tests.tiny_lm import TinyLM
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.recompute import RecomputeEngine

PAD = 0


def _prompts(rows: list[list[int]]) -> TensorDict:
    width = max(map(len, rows))
    tokens = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        tokens[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = True
    return TensorDict({K.TOKENS_PROMPT: tokens, K.MASK_PROMPT: mask}, batch_size=[len(rows)])


def _reference_log_probs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """Log-probs of `response` given `prompt`, from one unpadded forward of the concatenation."""
    seq = torch.tensor([prompt + response])
    logp = torch.log_softmax(model(seq)[0].float() / temperature, -1)
    pos = torch.arange(len(prompt) - 1, len(prompt) + len(response) - 1)
    return logp[pos, torch.tensor(response)]


PROMPTS = [[3, 5, 7, 2], [4], [9, 1]]


def test_log_probs_match_unpadded_recomputation_for_each_row():
    model = TinyLM(vocab_size=12)
    engine = RecomputeEngine(model, pad_token_id=PAD)
    out = engine.generate(_prompts(PROMPTS), SamplingParams(n=2, temperature=0.8, max_new_tokens=6, seed=0))
    assert out.batch_size == torch.Size([6])
    assert out[K.PROMPT_INDEX].tolist() == [0, 0, 1, 1, 2, 2]
    for row in range(6):
        prompt = PROMPTS[row // 2]
        n = int(out[K.NUM_GENERATED][row])
        response = out[K.TOKENS_RESPONSE][row, :n].tolist()
        ref = _reference_log_probs(model, prompt, response, 0.8)
        torch.testing.assert_close(out[K.LOGP_ROLLOUT][row, :n], ref, rtol=1e-5, atol=1e-5)
        # the prompt comes back as given (right-padded)
        assert out[K.TOKENS_PROMPT][row, : len(prompt)].tolist() == prompt


def test_greedy_batched_equals_greedy_one_prompt_at_a_time():
    model = TinyLM(vocab_size=12, seed=3)
    engine = RecomputeEngine(model, pad_token_id=PAD)
    params = SamplingParams(temperature=0.0, max_new_tokens=5)
    batched = engine.generate(_prompts(PROMPTS), params)
    for i, p in enumerate(PROMPTS):
        single = engine.generate(_prompts([p]), params)
        assert batched[K.TOKENS_RESPONSE][i].tolist() == single[K.TOKENS_RESPONSE][0].tolist()
    assert (batched[K.LOGP_ROLLOUT] == 0).all()  # greedy: log q = 0 at the argmax


def test_stop_tokens_end_rows_and_mask_the_rest():
    model = TinyLM(vocab_size=6, seed=1)
    engine = RecomputeEngine(model, pad_token_id=PAD)
    params = SamplingParams(n=8, temperature=1.0, max_new_tokens=10, stop_token_ids=(1, 2), seed=4)
    out = engine.generate(_prompts([[3, 4]]), params)
    tokens, mask, num = out[K.TOKENS_RESPONSE], out[K.MASK_RESPONSE], out[K.NUM_GENERATED]
    assert torch.equal(num, mask.sum(1))
    for row in range(8):
        n = int(num[row])
        assert mask[row, :n].all() and not mask[row, n:].any()
        if n < 10:
            assert tokens[row, n - 1].item() in (1, 2)  # stop token included
        assert not any(t in (1, 2) for t in tokens[row, : n - 1].tolist())
        assert (tokens[row, n:] == PAD).all() and (out[K.LOGP_ROLLOUT][row, n:] == 0).all()
    assert tokens.shape[1] == int(num.max())  # trimmed to the longest response


def test_ignore_stop_generates_exactly_max_new_tokens():
    engine = RecomputeEngine(TinyLM(vocab_size=6, seed=1), pad_token_id=PAD)
    params = SamplingParams(n=3, max_new_tokens=7, stop_token_ids=(1, 2), ignore_stop=True, seed=0)
    out = engine.generate(_prompts([[3]]), params)
    assert out[K.NUM_GENERATED].tolist() == [7, 7, 7]


def test_seed_reproduces_and_differs_across_seeds():
    engine = RecomputeEngine(TinyLM(vocab_size=12), pad_token_id=PAD)
    a = engine.generate(_prompts(PROMPTS), SamplingParams(n=2, max_new_tokens=6, seed=11))
    b = engine.generate(_prompts(PROMPTS), SamplingParams(n=2, max_new_tokens=6, seed=11))
    c = engine.generate(_prompts(PROMPTS), SamplingParams(n=2, max_new_tokens=6, seed=12))
    assert torch.equal(a[K.TOKENS_RESPONSE], b[K.TOKENS_RESPONSE])
    assert not torch.equal(a[K.TOKENS_RESPONSE], c[K.TOKENS_RESPONSE])


def test_load_weights_swaps_model_and_stamps_version():
    engine = RecomputeEngine(TinyLM(vocab_size=12, seed=0), pad_token_id=PAD)
    other = TinyLM(vocab_size=12, seed=5)
    engine.load_weights(other.state_dict(), version=3)
    out = engine.generate(_prompts(PROMPTS), SamplingParams(temperature=0.0, max_new_tokens=4))
    assert out[K.POLICY_VERSION].tolist() == [3, 3, 3]
    ref = RecomputeEngine(other, pad_token_id=PAD).generate(
        _prompts(PROMPTS), SamplingParams(temperature=0.0, max_new_tokens=4))
    assert torch.equal(out[K.TOKENS_RESPONSE], ref[K.TOKENS_RESPONSE])
    with pytest.raises(RuntimeError):
        engine.load_weights({"nope": torch.zeros(1)}, version=4)


def test_empty_prompt_is_an_error():
    engine = RecomputeEngine(TinyLM(), pad_token_id=PAD)
    prompts = _prompts([[1, 2]])
    prompts[K.MASK_PROMPT][:] = False
    with pytest.raises(ValueError):
        engine.generate(prompts, SamplingParams())
