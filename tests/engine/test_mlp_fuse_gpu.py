"""GPU (issue 16): the MLP tail of the FP4 rollout with the stacked gate/up GEMM's epilogue fused into the SiLU x mul
W4A4 quantize (`decoder.FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE`, kernels/epilogue_silu_quantize.py) and the MLP input
norm fused with the gate/up quantize (`norm_input.FUSE_NORM_QUANTIZE`): on 2 layers of the Qwen3-8B shape (nvfp4,
operand cache stacked), a decode step's logits (eager) are bit-identical with each switch on and off, at B = 313
(the stacked cuBLAS GEMM: the fused path runs once per layer) and B = 16 (the FP4 GEMM: not taken); the captured step
runs it too."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

L = 257


def _logits(engine, batch):
    from trace_rl.bench.decode_grid import prime_decode

    prime_decode(engine, batch, L)
    path = engine.attention_path(batch, L)
    with torch.no_grad():
        return engine._decode_forward(batch, path, engine.attention_span(path, L)).float().clone()


def test_epilogue_silu_quantize_engine_logits_bit_identical_gpu(monkeypatch):
    from trace_rl.backends import get_backend
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.measure import build_rollout_model
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import decoder, norm_input
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan.preset("w4a4-kv4")
    model = build_rollout_model("qwen3-8b", plan, torch.device("cuda"), torch.bfloat16, 0, 2)
    engine = NativeEngine(model, plan, max_batch=313, max_seq_len=L + 1, device="cuda", graph_buckets=[16, 313],
                          kv_layout="pool", attention="kernels", operand_cache=True)
    count = lambda: get_backend("fp4").paths.counts.get("fp4.operand_stack_silu_mul_quantize", 0)   # noqa: E731
    for batch, per_step in ((313, 2), (16, 0)):
        engine.attention_path(batch, L)
        monkeypatch.setattr(decoder, "FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE", True)
        monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", True)
        before = count()
        fused = _logits(engine, batch)
        assert count() - before == per_step                          # one fused launch per layer at B = 313
        monkeypatch.setattr(decoder, "FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE", False)
        apart = _logits(engine, batch)
        monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", False)
        unfused = _logits(engine, batch)
        assert count() - before == per_step
        for name, other in (("epilogue apart", apart), ("epilogue and norms apart", unfused)):
            same = float((fused == other).float().mean())
            print(f"B={batch}: fused vs {name}: logits identical {same:.6f}")
        assert torch.equal(fused.view(torch.int32), apart.view(torch.int32))
        assert torch.equal(fused.view(torch.int32), unfused.view(torch.int32))
    monkeypatch.setattr(decoder, "FUSE_ROLLOUT_EPILOGUE_SILU_QUANTIZE", True)
    monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", True)
    engine.graphs.invalidate()
    prime_decode(engine, 313, L)
    before = count()
    engine.decode_step(313, L, (1.0, 0, 1.0))
    torch.cuda.synchronize()
    assert engine.graphs.captured and count() > before              # the captured step runs the fused kernel
