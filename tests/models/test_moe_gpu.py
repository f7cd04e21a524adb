"""FP4 and FP8 MoE plans on a GPU: the experts run the grouped FP4 kernel (`experts.fp4_grouped`) or
`torch._scaled_grouped_mm` (`experts.fp8_grouped`), so the engine captures the decode step in CUDA graphs; graph
== eager, and the graphs stay valid across load_weights (layouts re-derived in place), also with the FP4 reference
codes offloaded to host memory (`derive_kernel_layouts(offload_reference=True)`)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.native_helpers import random_prompts
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.models import tiny_model
from trace_rl.plan import PrecisionPlan

pytestmark = pytest.mark.gpu


def _engine(model, plan, graphs):
    return NativeEngine(model, plan, max_batch=5, max_seq_len=64, block_size=16, cuda_graphs=graphs)


@pytest.mark.parametrize("plan,offload", [("w4a4-kv4", False), ("w4a16-mx", False), ("w4a4-kv4", True),
                                          ("fp8", False)])
def test_moe_decode_graph_equals_eager_and_survives_load_weights(plan, offload, rng):
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.measure import fill_random

    def prime(engines):          # the same cache contents and slot state in each engine
        for e in engines:
            fill_random(e.cache, torch.Generator(device="cuda").manual_seed(4))
            prime_decode(e, 4, 20, seed=3)

    plan = PrecisionPlan.preset(plan)
    a, _ = tiny_model("tiny-moe", seed=1, device="cuda", dtype=torch.bfloat16)
    b, _ = tiny_model("tiny-moe", seed=2, device="cuda", dtype=torch.bfloat16)
    graphed, eager = _engine(a, plan, None), _engine(a, plan, False)
    assert graphed.graphs is not None                     # every grouped linear is capturable: graphs by default
    x = torch.empty(1, 128, device="cuda", dtype=torch.bfloat16)
    linears = [g for ex in graphed.model.experts() for g in ex.grouped_linears().values()]
    path = "fp8_grouped" if linears[0].weight_fmt.startswith("fp8") else "fp4_grouped"
    assert all(g.path(x) == path for g in linears), [g.path(x) for g in linears]
    if offload:
        freed = sum(ex.derive_kernel_layouts(offload_reference=True) for ex in graphed.model.experts())
        assert freed == sum(g.nbytes for g in linears) > 0 and all(g.w_codes.device.type == "cpu" for g in linears)
    backend = linears[0].backend
    before = dict(backend.paths.counts)
    prompts = random_prompts([7, 3, 12], rng)
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=24, ignore_stop=True)
    got = graphed.generate(prompts, greedy)
    assert graphed.graphs.captured
    assert backend.paths.counts[f"experts.{path}"] > before.get(f"experts.{path}", 0)
    assert backend.paths.counts["experts.loop"] == before.get("experts.loop", 0)
    want = eager.generate(prompts, greedy)
    assert torch.equal(got[K.TOKENS_RESPONSE], want[K.TOKENS_RESPONSE])
    assert torch.equal(got[K.ROUTING_EXPERTS], want[K.ROUTING_EXPERTS])
    # the decode forward alone, same rows: the replayed graph computes what eager computes, bit for bit
    prime((graphed, eager))
    assert torch.equal(graphed.decode_logits(4, 20), eager.decode_logits(4, 20))
    # load_weights re-quantizes into the same buffers and re-derives the kernel layouts in place
    graphed.load_weights(b.state_dict(), version=1)
    assert graphed.graphs.captured
    fresh = _engine(b, plan, False)
    prime((graphed, fresh))
    assert torch.equal(graphed.decode_logits(4, 20), fresh.decode_logits(4, 20))
    assert torch.equal(graphed.generate(prompts, greedy)[K.TOKENS_RESPONSE],
                       fresh.generate(prompts, greedy)[K.TOKENS_RESPONSE])
