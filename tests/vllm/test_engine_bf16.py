"""VLLMEngine with the bf16 plan in float32: its rollout log-probs are the trainer's recomputation of the same
tokens, stops and groups follow trace_rl's schema, and a weight sync makes it follow the new weights exactly."""

from __future__ import annotations

import copy

import pytest
import torch

pytest.importorskip("vllm")

from tests.vllm.helpers import default_policy, make_engine, perturbed, prompts, sampling, trainer_log_probs  # noqa: E402
from trace_rl.data import schema as K  # noqa: E402
from trace_rl.engine.base import SamplingParams  # noqa: E402
from trace_rl.engine.native import NativeEngine  # noqa: E402
from trace_rl.plan import PrecisionPlan  # noqa: E402

pytestmark = pytest.mark.vllm
PLAN = PrecisionPlan()


@pytest.fixture(scope="module")
def policy():
    return default_policy()


@pytest.fixture(scope="module")
def engine(policy):
    model, tokenizer = policy
    engine = make_engine(model, tokenizer, PLAN)
    yield engine
    engine.shutdown()


def _greedy(engine, batch, max_new=24):
    return engine.generate(batch, SamplingParams(n=1, temperature=0.0, max_new_tokens=max_new))


@pytest.mark.parametrize("temperature,top_k,top_p", [(0.7, 0, 0.9), (1.0, 12, 1.0), (1.3, 0, 1.0)])
def test_log_probs_equal_trainer_recomputation(engine, policy, rng, temperature, top_k, top_p):
    model, _ = policy
    batch = prompts(rng)
    s = sampling(rng, temperature=temperature, top_k=top_k, top_p=top_p)
    out = engine.generate(batch, s)
    rows = batch.batch_size[0] * s.n
    assert out.batch_size == torch.Size([rows])
    assert torch.equal(out[K.PROMPT_INDEX], torch.arange(rows) // s.n)
    assert torch.equal(out[K.TOKENS_PROMPT], batch[K.TOKENS_PROMPT][out[K.PROMPT_INDEX]])
    assert torch.equal(out[K.NUM_GENERATED], out[K.MASK_RESPONSE].sum(1))
    assert (out[K.NUM_GENERATED] == s.max_new_tokens).all()      # no stop tokens given: none stops early
    assert (out[K.POLICY_VERSION] == engine.policy_version).all()
    trainer = trainer_log_probs(model, out, s)
    torch.testing.assert_close(out[K.LOGP_ROLLOUT], trainer, rtol=0, atol=1e-4)
    # vLLM's default (raw log-probs) would be the untruncated T=1 distribution: not what was sampled.
    if (temperature, top_k, top_p) != (1.0, 0, 1.0):
        raw = trainer_log_probs(model, out, SamplingParams(temperature=1.0))
        assert (out[K.LOGP_ROLLOUT] - raw).abs().max() > 1e-2


def test_greedy_equals_native_engine(engine, policy, rng):
    model, _ = policy
    batch = prompts(rng, lengths=(7, 2, 13))
    native = NativeEngine(model, PLAN, max_batch=4, max_seq_len=96, pad_token_id=engine.pad_token_id)
    ours, theirs = _greedy(engine, batch), _greedy(native, batch)
    assert torch.equal(ours[K.TOKENS_RESPONSE], theirs[K.TOKENS_RESPONSE])
    assert (ours[K.LOGP_ROLLOUT] == 0).all()               # greedy: a point mass, as every engine reports


def test_stop_tokens_end_responses_and_are_kept(engine, rng):
    batch = prompts(rng)
    s = sampling(rng, n=2, max_new_tokens=20)
    free = engine.generate(batch, s)
    stops = tuple(sorted(set(free[K.TOKENS_RESPONSE][:, 4].tolist())))[:3]   # tokens that do get sampled
    stopped = engine.generate(batch, s.model_copy(update={"stop_token_ids": stops}))
    for r in range(stopped.batch_size[0]):
        row = free[K.TOKENS_RESPONSE][r].tolist()
        first = next((i for i, t in enumerate(row) if t in stops), len(row) - 1)
        n = int(stopped[K.NUM_GENERATED][r])
        assert n == first + 1                                    # ends at the first stop, which is kept
        assert stopped[K.TOKENS_RESPONSE][r, :n].tolist() == row[:n]   # same seed: the same samples up to it
        assert (stopped[K.TOKENS_RESPONSE][r, n:] == engine.pad_token_id).all()
        assert (stopped[K.LOGP_ROLLOUT][r, n:] == 0).all()
    ignored = engine.generate(batch, s.model_copy(update={"stop_token_ids": stops, "ignore_stop": True}))
    assert (ignored[K.NUM_GENERATED] == s.max_new_tokens).all()


def test_weight_sync_follows_new_weights(engine, policy, rng):
    model, _ = policy
    batch = prompts(rng, lengths=(6, 10, 4))
    before = _greedy(engine, batch)
    new = perturbed(model, rng)
    engine.load_weights(new.state_dict(), version=7)
    try:
        assert engine.policy_version == 7
        after = _greedy(engine, batch)                 # same prompts: a stale prefix cache would show here
        native = NativeEngine(new, PLAN, max_batch=4, max_seq_len=96, pad_token_id=engine.pad_token_id)
        assert torch.equal(after[K.TOKENS_RESPONSE], _greedy(native, batch)[K.TOKENS_RESPONSE])
        assert not torch.equal(after[K.TOKENS_RESPONSE], before[K.TOKENS_RESPONSE])
        assert (after[K.POLICY_VERSION] == 7).all()
        s = sampling(rng)
        out = engine.generate(batch, s)
        torch.testing.assert_close(out[K.LOGP_ROLLOUT], trainer_log_probs(new, out, s), rtol=0, atol=1e-4)
    finally:
        engine.load_weights(model.state_dict(), version=0)
    assert torch.equal(_greedy(engine, batch)[K.TOKENS_RESPONSE], before[K.TOKENS_RESPONSE])


def test_load_weights_names_missing_and_unexpected_tensors(engine, policy):
    model, _ = policy
    sd = copy.copy(model.state_dict())
    sd.pop("model.norm.weight")
    sd["model.extra.weight"] = torch.zeros(3)
    with pytest.raises(KeyError, match=r"missing \['model.norm.weight'\], unexpected \['model.extra.weight'\]"):
        engine.load_weights(sd, version=1)
    assert engine.policy_version == 0


def test_rejects_left_padded_prompts(engine, rng):
    batch = prompts(rng)
    batch[K.MASK_PROMPT] = batch[K.MASK_PROMPT].flip(1)
    with pytest.raises(ValueError, match="right-padded"):
        engine.generate(batch, sampling(rng))


def test_report_names_the_plan_and_kv_dtype(engine):
    report = engine.report()
    assert report["plan"] == "bf16" and report["cpu"]
    assert report["workers"][0]["kv_cache_dtype"] == "auto"
    assert not {"fp4", "fp8"} & set(report["workers"][0]["linear"])    # no linear went through the plugin
