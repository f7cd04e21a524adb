"""The native engine's page pool, prefix sharing and preemption (CPU, float32, tiny model).

- Samples and log-probs are bit-identical with and without the page pool and with and without shared
  prompt prefixes (same seed; one prompt per prefill forward, so both prefill the same way).
- 1,000 sequences through the pool return every page (no leak) and share prompt pages.
- A pool too small for all samples at once preempts, recomputes, and finishes every sample with
  log-probs equal to the trainer's recomputation (the recomputed cache is right).
"""

from __future__ import annotations

import pytest
import torch

from tests.engine.native_helpers import PAD, random_prompts, trainer_log_probs
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.engine.pages import PagePool
from trace_rl.models import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("tiny", seed=5)[0]


def _engine(model, **kw):
    kw = {"max_batch": 4, "max_seq_len": 64, "block_size": 8, "pad_token_id": PAD, "prefill_tokens": 1, **kw}
    return NativeEngine(model, **kw)


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_pool_and_prefix_sharing_are_bit_identical(tiny, rng, top_p):
    # prompt lengths: a partial last page (13), exactly two pages (16), one token (1); 3 samples each
    # through 4 slots, stop tokens end samples at different times, so slots are refilled mid-run.
    prompts = random_prompts([13, 16, 1], rng)
    sampling = SamplingParams(n=3, temperature=0.9, top_p=top_p, max_new_tokens=30,
                              stop_token_ids=tuple(range(20, 26)), seed=int(torch.randint(0, 10**6, (), generator=rng)))
    runs = {}
    for layout in ("contiguous", "pool"):
        for share in (False, True):
            engine = _engine(tiny, kv_layout=layout, share_prefix=share)
            runs[layout, share] = (engine.generate(prompts, sampling), engine.report())
    base, _ = runs["contiguous", False]
    for key, (out, _) in runs.items():
        assert torch.equal(out[K.TOKENS_RESPONSE], base[K.TOKENS_RESPONSE]), key
        assert torch.equal(out[K.LOGP_ROLLOUT], base[K.LOGP_ROLLOUT]), key
        assert torch.equal(out[K.NUM_GENERATED], base[K.NUM_GENERATED]), key
    assert runs["pool", True][1]["shared_prompt_pages"] > 0 and runs["pool", False][1]["shared_prompt_pages"] == 0
    # one prefill per prompt when shared, one per sample otherwise
    assert runs["pool", True][1]["prefill_tokens"] < runs["pool", False][1]["prefill_tokens"]
    assert (base[K.NUM_GENERATED] < 30).any()          # some samples stopped early


def test_no_page_leak_after_1000_sequences(tiny, rng):
    engine = _engine(tiny, max_batch=32, max_seq_len=32, prefill_tokens=4096)
    prompts = random_prompts(torch.randint(1, 20, (125,), generator=rng).tolist(), rng)
    sampling = SamplingParams(n=8, temperature=1.0, max_new_tokens=8, stop_token_ids=tuple(range(10, 40)), seed=1)
    out = engine.generate(prompts, sampling)
    assert out.batch_size == (1000,)
    pool = engine.pool
    assert pool.free == pool.num_pages and not any(pool.refs)       # every page came back
    report = engine.report()
    assert report["shared_prompt_pages"] > 0 and report["peak_pages"] > 0
    assert (out[K.NUM_GENERATED] >= 1).all()


def test_running_out_of_pages_preempts_and_finishes_every_sample(tiny, rng):
    # 8 samples of up to 5 + 40 tokens need 6 pages each at the end; the pool has 14: at most two run to
    # their end together, the rest are preempted and recomputed.
    engine = _engine(tiny, num_pages=14)
    prompts = random_prompts([5, 3], rng)
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=40, ignore_stop=True, seed=3)
    out = engine.generate(prompts, sampling)
    report = engine.report()
    assert report["preemptions"] > 0
    assert (out[K.NUM_GENERATED] == 40).all()
    assert engine.pool.free == engine.pool.num_pages
    want = trainer_log_probs(tiny, out, sampling)
    torch.testing.assert_close(out[K.LOGP_ROLLOUT], want, rtol=0, atol=1e-5)


def test_pool_too_small_for_one_sequence_is_refused(tiny):
    with pytest.raises(ValueError, match="num_pages"):
        _engine(tiny, num_pages=7)        # 64 tokens need 8 pages of 8


def test_page_pool_reference_counts():
    pool = PagePool(4, 16)
    a = pool.alloc(3)
    assert a == [0, 1, 2] and pool.free == 1 and pool.alloc(2) is None and pool.free == 1
    pool.retain(a[:2])
    pool.release(a)
    assert pool.free == 2 and pool.shared(0) is False and pool.refs[:3] == [1, 1, 0]
    pool.release(a[:2])
    pool.check_empty()
    with pytest.raises(RuntimeError, match="already free"):
        pool.release([0])
