"""GPU: the decoder's norms with their projections' W4A4 quantization fused into them (the attention input and, since
the MLP wiring, the MLP input: post_attention_layernorm -> gate/up) (models/norm_input.py,
`FP4Backend.norm_quantize_input`, kernels/rmsnorm_quantize.py) on 2 layers of the Qwen3-8B shape: a decode step's
logits (eager) are bit-identical with the fusion on and off (`norm_input.FUSE_NORM_QUANTIZE`; the kernel gives the
two kernels' bits, so every GEMM reads the same operand), at B = 313 (operand cache / cuBLAS) and B = 16 (the FP4
GEMM), nvfp4 (q/k/v, gate/up apart) and mxfp4 (one stacked qkv_proj, gate_up_proj); the fused kernel runs twice per
layer (attention and MLP input); the captured step runs it too."""

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


@pytest.mark.parametrize("plan_name", ["w4a4-kv4", "w4a4-kv4-mx"])
def test_fused_norm_quantize_engine_logits_bit_identical_gpu(plan_name, monkeypatch):
    from trace_rl.backends import get_backend
    from trace_rl.bench.decode_grid import prime_decode
    from trace_rl.bench.measure import build_rollout_model
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import norm_input
    from trace_rl.plan import PrecisionPlan

    plan = PrecisionPlan.preset(plan_name)
    model = build_rollout_model("qwen3-8b", plan, torch.device("cuda"), torch.bfloat16, 0, 2)
    engine = NativeEngine(model, plan, max_batch=313, max_seq_len=L + 1, device="cuda", graph_buckets=[16, 313],
                          kv_layout="pool", attention="kernels", operand_cache=True)
    count = lambda: get_backend("fp4").paths.counts.get("fp4.norm_quantize", 0)   # noqa: E731
    for batch in (313, 16):
        monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", True)
        before = count()
        fused = _logits(engine, batch)
        assert count() - before == 4                                  # attention + MLP input, per layer
        monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", False)
        separate = _logits(engine, batch)
        assert count() - before == 4
        same = float((fused == separate).float().mean())
        print(f"{plan_name} B={batch}: fused vs separate logits identical {same:.6f}")
        assert torch.equal(fused, separate)
    monkeypatch.setattr(norm_input, "FUSE_NORM_QUANTIZE", True)
    engine.graphs.invalidate()
    prime_decode(engine, 313, L)
    before = count()
    engine.decode_step(313, L, (1.0, 0, 1.0))
    torch.cuda.synchronize()
    assert engine.graphs.captured and count() > before              # the captured step runs the fused kernel
