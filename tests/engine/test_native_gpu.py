"""NativeEngine on a GPU: CUDA-graph decode equals eager decode, and stays valid across load_weights."""

from __future__ import annotations

import pytest
import torch

from tests.engine.native_helpers import random_prompts, trainer_log_probs
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.models import tiny_model
from trace_rl.plan import PrecisionPlan

pytestmark = pytest.mark.gpu


def _engine(model, plan=None, graphs=True):
    return NativeEngine(model, plan, max_batch=5, max_seq_len=96, block_size=16, cuda_graphs=graphs)


def test_graph_decode_equals_eager_and_survives_load_weights(rng):
    a, _ = tiny_model("tiny", seed=1, device="cuda", dtype=torch.bfloat16)
    b, _ = tiny_model("tiny", seed=2, device="cuda", dtype=torch.bfloat16)
    prompts = random_prompts([7, 3, 12], rng)
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=40, ignore_stop=True)
    graphed = _engine(a)
    got = graphed.generate(prompts, greedy)
    assert graphed.graphs.captured
    want = _engine(a, graphs=False).generate(prompts, greedy)
    assert torch.equal(got[K.TOKENS_RESPONSE], want[K.TOKENS_RESPONSE])
    graphed.load_weights(b.state_dict(), version=1)      # in place: the captured graphs read the new weights
    assert graphed.graphs.captured
    assert torch.equal(graphed.generate(prompts, greedy)[K.TOKENS_RESPONSE],
                       _engine(b, graphs=False).generate(prompts, greedy)[K.TOKENS_RESPONSE])


def test_sampled_log_probs_match_trainer_in_bf16(rng):
    model, _ = tiny_model("tiny", seed=3, device="cuda", dtype=torch.bfloat16)
    sampling = SamplingParams(n=3, temperature=0.8, top_p=0.95, max_new_tokens=48, seed=5,
                              stop_token_ids=tuple(range(40, 45)))
    out = _engine(model).generate(random_prompts([9, 4], rng), sampling)
    diff = (out[K.LOGP_ROLLOUT] - trainer_log_probs(model, out, sampling)).abs()[out[K.MASK_RESPONSE]]
    assert diff.isfinite().all() and diff.mean() < 2e-2      # bf16 rounding differs between decode and full forward


@pytest.mark.parametrize("preset", ["w4a4-kv4", "fp8"])
def test_quantized_plans_run_and_report_paths(preset, rng):
    model, _ = tiny_model("tiny", seed=4, device="cuda", dtype=torch.bfloat16)
    engine = _engine(model, PrecisionPlan.preset(preset))
    out = engine.generate(random_prompts([9, 4], rng), SamplingParams(n=2, max_new_tokens=30, seed=1))
    assert out[K.LOGP_ROLLOUT].isfinite().all()
    report = engine.report()
    print(preset, report["linear"], report["kv"])
    assert report["kv"]["decode_attention"] != "torch.reference" or engine.cache.why


def test_pool_preemption_and_contiguous_autotune_on_gpu(rng):
    model, _ = tiny_model("tiny", seed=6, device="cuda", dtype=torch.bfloat16)
    sampling = SamplingParams(n=4, temperature=1.0, max_new_tokens=40, ignore_stop=True, seed=2)
    prompts = random_prompts([5, 3], rng)
    pool = NativeEngine(model, max_batch=8, max_seq_len=64, block_size=8, num_pages=14)
    out = pool.generate(prompts, sampling)
    assert pool.report()["preemptions"] > 0 and (out[K.NUM_GENERATED] == 40).all()
    assert pool.pool.free == pool.pool.num_pages
    diff = (out[K.LOGP_ROLLOUT] - trainer_log_probs(model, out, sampling)).abs()[out[K.MASK_RESPONSE]]
    assert diff.isfinite().all() and diff.mean() < 2e-2
    contiguous = NativeEngine(model, max_batch=8, max_seq_len=64, block_size=8, kv_layout="contiguous")
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=30, ignore_stop=True)
    a = contiguous.generate(prompts, greedy)
    report = contiguous.report()
    print(report["attention_chosen"], report["attention_timings"])
    assert report["attention_chosen"]
    b = _engine(model, graphs=False).generate(prompts, greedy)
    assert (a[K.TOKENS_RESPONSE] == b[K.TOKENS_RESPONSE]).float().mean() > 0.9   # bf16: paths round apart


def test_split_candidates_are_timed_and_run_in_graphs(rng):
    """A bf16 cache on the GPU: the kernel's split variants are timed beside it per (batch, context bucket), each
    gives the reference attention, and a chosen variant runs in the captured step (its span in the graph key)."""
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.measure import fill_random
    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kv.cache import KERNEL_PATH, parse_path

    model, _ = tiny_model("tiny", seed=7, device="cuda", dtype=torch.bfloat16)
    engine = NativeEngine(model, max_batch=4, max_seq_len=2048, graph_buckets=[4])
    fill_random(engine.cache, torch.Generator(device="cuda").manual_seed(int(rng.initial_seed())))
    prime_decode(engine, 4, 1500)
    path = engine.attention_path(4, 1500)
    choice = engine.attention_choice[(4, 1536)]
    print(choice)
    kernel_paths = [p for p in choice["ms"] if parse_path(p)[0] == KERNEL_PATH]
    assert kernel_paths[0] == KERNEL_PATH and len(kernel_paths) > 1 and path in choice["ms"]
    assert all(choice["ms"][p] is not None for p in kernel_paths)
    q = torch.randn(4, 6, 32, generator=rng).to("cuda", torch.bfloat16)
    lens = torch.tensor([1500, 3, 700, 1024], dtype=torch.int32, device="cuda")
    table = engine.block_table[:4]
    want = decode_attention_reference(q, engine.cache.k[1], engine.cache.v[1], table, lens, 32 ** -0.5).float()
    for p in kernel_paths:
        got = engine.cache.decode(1, q, table, lens, 32 ** -0.5, None, p, span=1536)
        torch.testing.assert_close(got.float(), want, rtol=2e-2, atol=2e-2)
        assert torch.equal(engine.cache.decode(1, q, table, lens, 32 ** -0.5, None, p, span=1536), got)
    split = kernel_paths[-1]
    engine.attention_choice[(4, 1536)]["path"] = split       # as if it had won: the captured step runs it
    engine.decode_step(4, 1500, (1.0, 0, 1.0))
    assert any(key[2] == split and key[3] == 1536 for key in engine.graphs.graphs)


def test_attention_choice_is_graph_timed(rng):
    """With CUDA graphs the candidates are timed as graphs of calls over several layers (what the captured step
    runs), and the record says so; the winner has the least time per layer call and runs in the captured step.
    An eager engine keeps timing layer 0's calls one at a time."""
    import json

    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.measure import fill_random

    model, _ = tiny_model("tiny", seed=7, device="cuda", dtype=torch.bfloat16)
    for graphs, how in ((True, "cuda graph of 4 layer calls"), (False, "eager")):
        engine = NativeEngine(model, max_batch=4, max_seq_len=2048, graph_buckets=[4], kv_layout="contiguous",
                              cuda_graphs=graphs)
        fill_random(engine.cache, torch.Generator(device="cuda").manual_seed(int(rng.initial_seed())))
        prime_decode(engine, 4, 1500)
        path = engine.attention_path(4, 1500)
        choice = engine.attention_choice[(4, 1536)]
        print(choice)
        assert choice["timed"].startswith(how) and len(choice["ms"]) > 1
        ok = {p: t for p, t in choice["ms"].items() if t is not None}
        assert path == min(ok, key=ok.get) and 0 < ok[path] < 10       # ms per layer call
        json.dumps(engine.report())                                      # the bench rows carry the record
        engine.decode_step(4, 1500, (1.0, 0, 1.0))
        assert not graphs or any(key[2] == path for key in engine.graphs.graphs)


def _gluon_runs() -> bool:
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        return False
    try:
        import triton
    except ImportError:
        return False
    return triton.__version__.startswith("3.6")


gluon_only = pytest.mark.skipif(not _gluon_runs(), reason="needs an sm_90 GPU and Triton 3.6 (Gluon)")


def _gluon_model(seed: int):
    """A 2-layer model with the Gluon kernel's heads: head_dim 128, 8 query heads over 2 KV heads (group 4)."""
    from dataclasses import replace

    from trace_rl.models import build, preset

    config = replace(preset("tiny"), hidden_size=512, num_heads=8, num_kv_heads=2, head_dim=128, num_layers=2)
    model = build(config, device="cuda", dtype=torch.bfloat16)
    model.init_random(generator=torch.Generator(device="cuda").manual_seed(seed))
    return model


@gluon_only
@pytest.mark.parametrize("kv_cache", ["nvfp4", "mxfp4"])
def test_gluon_attention_equals_kernels_in_graphs(kv_cache, rng):
    """attention='gluon' (forced) against attention='kernels' over the same nvfp4 / mxfp4 cache contents: the decode
    logits agree within the kernel-vs-reference tolerance (2e-2) at ragged lengths (one token, a page, a tile + 1,
    tails) over scattered pages, inside CUDA graphs, and again after the pages, the lengths and the block tables
    change under the captured graphs (replayed, not recaptured: the TMA descriptors of the capture address the
    cache's static tensors). Each path's attention also matches the reference per layer."""
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.measure import fill_random
    from trace_rl.kernels.attention_reference import decode_attention_reference
    from trace_rl.kv.cache import GLUON_PATH, KERNEL_PATH

    model = _gluon_model(seed=11)
    plan = PrecisionPlan(kv_cache=kv_cache)       # bf16 weights: the logits differ by the attention alone
    n, cap = 6, 1024
    engines = {a: NativeEngine(model, plan, max_batch=n, max_seq_len=cap, graph_buckets=[n], attention=a)
               for a in ("kernels", "gluon")}
    for a, path in (("kernels", KERNEL_PATH), ("gluon", GLUON_PATH)):
        assert engines[a].report()["kv"]["decode_attention"] == path and engines[a].graphs is not None
        assert engines[a].attention_candidates(n, cap) == [path]

    def state(seed: int, lengths: list[int]) -> None:
        pages = torch.randperm(n * engines["gluon"].pages_per_seq, generator=torch.Generator().manual_seed(seed))
        for e in engines.values():             # same sizes, same seed: the same pages in both caches
            fill_random(e.cache, torch.Generator(device="cuda").manual_seed(seed))
            prime_decode(e, n, max(lengths), seed)
            e.block_table[:n] = pages.view(n, -1).to(e.block_table)
            e.positions[:n] = torch.tensor(lengths, device="cuda") - 1

    for seed, lengths in ((1, [1, 64, 129, 300, 513, 1000]), (2, [1000, 7, 255, 256, 2, 640])):
        state(seed, lengths)
        got = {a: e.decode_logits(n, max(lengths)).float().clone() for a, e in engines.items()}
        assert got["gluon"].isfinite().all()
        scale = got["kernels"].abs().max().item()
        print(seed, "max |gluon - kernels|", (got["gluon"] - got["kernels"]).abs().max().item(), "max |logit|", scale)
        # 2e-2 (the kernel-vs-reference tolerance) relative, and of the logits' range for the small ones
        torch.testing.assert_close(got["gluon"], got["kernels"], rtol=2e-2, atol=2e-2 * max(1.0, scale))
        for e in engines.values():
            assert list(e.graphs.graphs) == [("forward", n, e.cache.attention_path, None)]   # one capture, replayed
        e = engines["gluon"]
        q = torch.randn(n, 8, 128, generator=rng).to("cuda", torch.bfloat16)
        lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
        table = e.block_table[:n]
        for layer in range(2):
            want = decode_attention_reference(q, e.cache.k[layer], e.cache.v[layer], table, lens, 128 ** -0.5).float()
            for path in (KERNEL_PATH, GLUON_PATH):
                out = e.cache.decode(layer, q, table, lens, 128 ** -0.5, None, path).float()
                torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)


@gluon_only
def test_auto_times_gluon_beside_the_kernel():
    """attention='auto' over an nvfp4 cache the Gluon kernel reads (GLUON_IN_AUTO): the Gluon path is timed beside the
    Triton kernel (graph of layer calls), the faster one is chosen and runs in the captured step, whose logits match
    a forced-kernels engine's over the same cache contents within 2e-2."""
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.measure import fill_random
    from trace_rl.kv.cache import GLUON_PATH, KERNEL_PATH

    model = _gluon_model(seed=13)
    plan = PrecisionPlan(kv_cache="nvfp4")
    n, cap, length = 4, 1024, 700
    engines = {a: NativeEngine(model, plan, max_batch=n, max_seq_len=cap, graph_buckets=[n], attention=a)
               for a in ("auto", "kernels")}
    auto = engines["auto"]
    assert {KERNEL_PATH, GLUON_PATH} <= set(auto.attention_candidates(n, length))
    for e in engines.values():
        fill_random(e.cache, torch.Generator(device="cuda").manual_seed(3))
        prime_decode(e, n, length, 3)
    path = auto.attention_path(n, length)
    choice = auto.attention_choice[(n, auto.context_bucket(length))]
    print(choice)
    assert choice["timed"].startswith("cuda graph") and choice["ms"][GLUON_PATH] and choice["ms"][KERNEL_PATH]
    ok = {p: t for p, t in choice["ms"].items() if t is not None}
    assert path == min(ok, key=ok.get)
    got = {a: e.decode_logits(n, length).float().clone() for a, e in engines.items()}
    scale = got["kernels"].abs().max().item()
    torch.testing.assert_close(got["auto"], got["kernels"], rtol=2e-2, atol=2e-2 * max(1.0, scale))
    auto.decode_step(n, length, (1.0, 0, 1.0))
    assert any(key[2] == path for key in auto.graphs.graphs)


@gluon_only
def test_gluon_engine_log_probs_match_trainer(rng):
    """A forced-Gluon engine generates (prefill, then captured decode steps over the page pool) with log-probs the
    trainer recomputes with the same nvfp4 K/V (fake-quantized per token and head): the bf16 tolerance of
    test_sampled_log_probs_match_trainer_in_bf16, as for the kernel engine. (Token agreement between the two engines
    is printed, not asserted: one bf16 flip changes the rest of a sample.)"""
    model = _gluon_model(seed=12)
    plan = PrecisionPlan(kv_cache="nvfp4")
    prompts = random_prompts([70, 5, 130], rng)
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=60, ignore_stop=True, seed=5)
    out = {}
    for a in ("kernels", "gluon"):
        engine = NativeEngine(model, plan, max_batch=6, max_seq_len=256, attention=a)
        out[a] = engine.generate(prompts, sampling)
        assert engine.graphs.captured and not engine.report()["attention_chosen"]     # forced: nothing timed
    for layer in model.model.layers:           # the trainer reads K/V as the cache stored them
        layer.self_attn.kv_fake_fmt = "nvfp4"
    for a, o in out.items():
        diff = (o[K.LOGP_ROLLOUT] - trainer_log_probs(model, o, sampling)).abs()[o[K.MASK_RESPONSE]]
        print(a, "|rollout - trainer log-prob| mean", diff.mean().item(), "max", diff.max().item())
        assert diff.isfinite().all() and diff.mean() < 2e-2
    same = (out["gluon"][K.TOKENS_RESPONSE] == out["kernels"][K.TOKENS_RESPONSE]).float().mean()
    print("token agreement gluon vs kernels", same.item())
