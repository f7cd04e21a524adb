"""NativeEngine at the bf16 plan on CPU (float32): rollout log-probs = the trainer's recomputation,
greedy = HF greedy, seeds, continuous batching, output schema and in-place weight loading."""

from __future__ import annotations

import pytest
import torch

from tests.engine.native_helpers import PAD, random_prompts, trainer_log_probs
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.models import tiny_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_model("tiny", seed=11)[0]


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.0, 0, 0.8), (0.8, 17, 0.9)])
def test_rollout_log_probs_equal_trainer_recomputation(tiny, rng, temperature, top_k, top_p):
    # 3 prompts x n=3 = 9 samples through 4 slots: slots are refilled as samples finish (stop tokens).
    engine = NativeEngine(tiny, max_batch=4, max_seq_len=64, block_size=8, pad_token_id=PAD)
    sampling = SamplingParams(n=3, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=23,
                              stop_token_ids=tuple(range(30, 40)), seed=int(torch.randint(0, 10**6, (), generator=rng)))
    out = engine.generate(random_prompts([5, 9, 1], rng), sampling)
    assert out.batch_size == (9,) and out[K.PROMPT_INDEX].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    ngen, mask = out[K.NUM_GENERATED], out[K.MASK_RESPONSE]
    assert torch.equal(mask.sum(1), ngen) and int(ngen.min()) >= 1 and int(ngen.max()) <= 23
    resp = out[K.TOKENS_RESPONSE]
    for r in range(9):   # a response ends at its first stop token, or at max_new_tokens
        stops = torch.isin(resp[r, : ngen[r]], torch.arange(30, 40))
        assert not stops[:-1].any() and (bool(stops[-1]) or int(ngen[r]) == 23)
    assert (resp[~mask] == PAD).all() and (out[K.LOGP_ROLLOUT][~mask] == 0).all()
    want = trainer_log_probs(tiny, out, sampling)
    torch.testing.assert_close(out[K.LOGP_ROLLOUT], want, rtol=0, atol=1e-5)
    assert (out[K.LOGP_ROLLOUT][mask] < 0).any()


def test_fixed_seed_reproduces_samples(tiny, rng):
    engine = NativeEngine(tiny, max_batch=3, max_seq_len=48, block_size=16)
    prompts = random_prompts([4, 7], rng)
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=17, seed=1234)
    a, b = engine.generate(prompts, sampling), engine.generate(prompts, sampling)
    assert torch.equal(a[K.TOKENS_RESPONSE], b[K.TOKENS_RESPONSE])
    assert torch.equal(a[K.LOGP_ROLLOUT], b[K.LOGP_ROLLOUT])
    c = engine.generate(prompts, sampling.model_copy(update={"seed": 4321}))
    assert not torch.equal(a[K.TOKENS_RESPONSE], c[K.TOKENS_RESPONSE])
    # siblings of one prompt share the prefill but not their samples
    assert not torch.equal(a[K.TOKENS_RESPONSE][0], a[K.TOKENS_RESPONSE][1])


def test_greedy_equals_hf_greedy(tmp_path, rng):
    pytest.importorskip("transformers")
    from tests.models.hf_tiny import hf_folder
    from trace_rl.engine.hf import HFEngine
    from trace_rl.models import load

    folder, hf = hf_folder("qwen3", tmp_path, seed=int(torch.randint(0, 2**31, (), generator=rng)), std=0.3)
    ours = NativeEngine(load(folder), max_batch=2, max_seq_len=64, block_size=16)
    prompts = random_prompts([6, 3, 8], rng, high=83)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=20, ignore_stop=True)
    a = ours.generate(prompts, greedy)
    b = HFEngine(hf, pad_token_id=PAD).generate(prompts, greedy)
    assert torch.equal(a[K.TOKENS_RESPONSE], b[K.TOKENS_RESPONSE])
    assert (a[K.LOGP_ROLLOUT] == 0).all() and (a[K.NUM_GENERATED] == 20).all()


def test_hf_engine_log_probs_are_its_sampling_distribution(tmp_path, rng):
    pytest.importorskip("transformers")
    from tests.models.hf_tiny import hf_folder
    from trace_rl.engine.hf import HFEngine
    from trace_rl.models import load

    folder, hf = hf_folder("llama", tmp_path, seed=5)
    engine = HFEngine(hf, pad_token_id=PAD)
    sampling = SamplingParams(n=2, temperature=0.7, max_new_tokens=9, stop_token_ids=(5, 6, 7), seed=3)
    out = engine.generate(random_prompts([4, 6], rng, high=83), sampling)
    assert out[K.TOKENS_RESPONSE].shape[0] == 4
    torch.testing.assert_close(out[K.LOGP_ROLLOUT], trainer_log_probs(load(folder), out, sampling),
                               rtol=0, atol=1e-5)
    again = engine.generate(out[:: 2].select(K.TOKENS_PROMPT, K.MASK_PROMPT), sampling)
    assert torch.equal(again[K.TOKENS_RESPONSE], out[K.TOKENS_RESPONSE])   # seeded


def test_load_weights_in_place(rng):
    model_a, _ = tiny_model("tiny", seed=1)
    model_b, _ = tiny_model("tiny", seed=2)
    engine = NativeEngine(model_a, max_batch=2, max_seq_len=32, block_size=8)
    ptrs = {n: b.data_ptr() for n, b in engine.model.named_buffers()}
    cache_ptr = engine.cache.k[0].codes.data_ptr()
    prompts = random_prompts([5, 3], rng)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=12, ignore_stop=True)
    engine.load_weights(model_b.state_dict(), version=7)
    got = engine.generate(prompts, greedy)
    want = NativeEngine(model_b, max_batch=2, max_seq_len=32, block_size=8).generate(prompts, greedy)
    assert torch.equal(got[K.TOKENS_RESPONSE], want[K.TOKENS_RESPONSE])
    assert (got[K.POLICY_VERSION] == 7).all()
    assert ptrs == {n: b.data_ptr() for n, b in engine.model.named_buffers()}
    assert engine.cache.k[0].codes.data_ptr() == cache_ptr
    with pytest.raises(KeyError, match="missing"):
        engine.load_weights({}, version=8)


def test_rejects_bad_prompts(tiny):
    engine = NativeEngine(tiny, max_batch=2, max_seq_len=16, block_size=8)
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="max_seq_len"):
        engine.generate(random_prompts([10], g), SamplingParams(max_new_tokens=10))
    holes = random_prompts([3], g)
    holes[K.MASK_PROMPT][0, 1] = False
    with pytest.raises(ValueError, match="right-padded"):
        engine.generate(holes, SamplingParams(max_new_tokens=2))


@pytest.mark.parametrize("kv_layout", ["pool", "contiguous"])
def test_attention_choice_without_cuda(tiny, kv_layout):
    """On a CPU there is one decode-attention path (no split variants, nothing to time)."""
    engine = NativeEngine(tiny, max_batch=4, max_seq_len=2048, block_size=16, kv_layout=kv_layout)
    assert engine.attention_path(4, 1500) == "torch.reference"
    assert engine.attention_choice == {} and engine.report()["attention_chosen"] == {}


@pytest.mark.parametrize("graphed", [False, True])
def test_attention_timing_picks_fastest_and_skips_failures(tiny, caplog, graphed):
    """The choice with an injected timer: the fastest candidate wins, one that fails to run (or to be captured)
    is logged and recorded as None, never chosen; with graphs each candidate is timed over several layers' caches
    (one call per layer, as the captured step reads them), eager over layer 0."""
    from trace_rl.engine.cuda_graphs import DecodeGraphs

    engine = NativeEngine(tiny, max_batch=4, max_seq_len=1024, block_size=16, kv_layout="contiguous")
    if graphed:                  # as an engine whose decode step runs as CUDA graphs (the timer is injected)
        engine.graphs = DecodeGraphs()
    results, seen = iter([3.0, RuntimeError("capture failed"), 1.0]), []

    def timer(calls):
        seen.append(len(calls))
        r = next(results)
        if isinstance(r, Exception):
            raise r
        assert all(f().shape == (4, 6, 32) for f in calls)
        return r

    candidates = ["torch.sdpa_masked", "torch.flash_varlen", "torch.reference"]
    with caplog.at_level("WARNING", logger="trace_rl.engine"):
        choice = engine._time_attention(4, 512, candidates, timer=timer)
    assert choice == {"path": "torch.reference", "timed": "injected",
                      "ms": {"torch.sdpa_masked": 3.0, "torch.flash_varlen": None, "torch.reference": 1.0}}
    assert seen == [4 if graphed else 1] * 3          # tiny has 4 layers (< ATTENTION_TIME_LAYERS)
    assert "torch.flash_varlen failed" in caplog.text and "capture failed" in caplog.text
    with pytest.raises(RuntimeError, match="no decode-attention path runs"):
        engine._time_attention(4, 512, ["torch.reference"], timer=lambda calls: 1 / 0)


def test_attention_timing_default_is_eager_without_graphs(tiny):
    """Without CUDA graphs (CPU, eager engines) the candidates are timed as before: layer 0, each call alone."""
    engine = NativeEngine(tiny, max_batch=2, max_seq_len=1024, block_size=16, kv_layout="contiguous")
    choice = engine._time_attention(2, 512, ["torch.reference", "torch.sdpa_masked"])
    assert choice["timed"].startswith("eager") and choice["path"] in choice["ms"]
    assert all(t is not None and t > 0 for t in choice["ms"].values())
