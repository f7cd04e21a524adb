"""GPU: the engine's FP8 operand cache (operand_cache="fp8", kernels/operand_cache_fp8.py) on 2 layers of the Qwen3-8B
shape with the w4a4-kv4-mx plan at the fixed 8k workload's batch (B = 313): every dense mxfp4 linear holds an E4M3
cache, allocator-measured at 1 byte per weight element (half the bf16 cache's), and a decode step's logits (eager and
the captured graph, which runs fp4.operand_cache_fp8) match the bf16 cache's within bf16 rounding (the same operand
values; only the float32 accumulation differs)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.qwen3_decode import B, L, decode_logits, qwen3_layers

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

def _model(layers=2):
    return qwen3_layers("w4a4-kv4-mx", layers)


def _logits(engine):
    return decode_logits(engine, B, L)


def test_fp8_engine_logits_match_the_bf16_cache_gpu():
    from trace_rl.backends import get_backend
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.engine import operand_cache as engine_oc
    from trace_rl.engine.native import NativeEngine

    paths = get_backend("fp4").paths
    logits, nbytes = {}, {}
    for kind in ("bf16", "fp8"):
        model, plan = _model()
        torch.cuda.synchronize()
        m0 = torch.cuda.memory_allocated()
        nbytes[kind] = (engine_oc.attach_model(model, plan, "cuda", kind), torch.cuda.memory_allocated() - m0)
        engine = NativeEngine(model, plan, max_batch=B, max_seq_len=L + 1, device="cuda", graph_buckets=[B],
                              kv_layout="pool", attention="kernels", operand_cache=kind)
        dense = engine_oc.fp4_dense(engine.model)
        assert engine.report()["operand_cache_kinds"] == {kind: len(dense)}
        before = paths.counts.get("fp4.operand_cache_fp8", 0)
        logits[kind] = _logits(engine)
        ran = paths.counts.get("fp4.operand_cache_fp8", 0) - before
        assert ran == (len(dense) if kind == "fp8" else 0)
        if kind == "fp8":        # the captured step takes the FP8 path too
            prime_decode(engine, B, L)
            n = paths.counts.get("fp4.operand_cache_fp8", 0)
            engine.decode_step(B, L, (1.0, 0, 1.0))
            torch.cuda.synchronize()
            assert engine.graphs.captured and paths.counts.get("fp4.operand_cache_fp8", 0) > n
        del engine, model
        torch.cuda.empty_cache()
    elements = nbytes["fp8"][0]
    assert nbytes["bf16"][0] == 2 * elements and nbytes["bf16"][1] - nbytes["fp8"][1] >= 0.99 * elements
    a, b = logits["fp8"], logits["bf16"]
    rel = float((a - b).norm() / b.norm())
    agree = float((a.argmax(-1) == b.argmax(-1)).float().mean())
    print(f"fp8 vs bf16 operand cache logits: rel {rel:.3g}, argmax agree {agree:.4f}; cache bytes {nbytes}")
    assert rel < 1e-3 and agree > 0.99      # the H200 measured rel 0, agree 1.0 (2026-12-02)
