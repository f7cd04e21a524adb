"""GPU: the engine's stacked operand cache (q/k/v and gate/up of the nvfp4 rollout model as one GEMM each) at the
fixed 8k workload's batch (B = 313, above the operand-cache threshold) on 2 layers of the Qwen3-8B shape: logits of a
decode step (eager, and the captured graph) match one GEMM per projection on the same buffers within bf16 rounding
(only cuBLAS's float32 accumulation order differs), and the caches take the separate caches' bytes plus the stacks'
float32 row factors, no more (allocator-measured around `attach_model`)."""

from __future__ import annotations

import pytest
import torch

from tests.engine.qwen3_decode import B, L, decode_logits, qwen3_layers

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

def _model(layers=2):
    return qwen3_layers("w4a4-kv4", layers)


def _logits(engine):
    return decode_logits(engine, B, L)


# the stacked GEMMs' paths: q/k/v runs `operand_stack_cublas`; gate/up of a SiLU x mul MLP runs the stacked GEMM with
# the down projection's quantize fused (`operand_stack_silu_mul_quantize`)
_STACK_PATHS = ("fp4.operand_stack_cublas", "fp4.operand_stack_silu_mul_quantize")


def _stacked_calls(paths) -> int:
    return sum(paths.counts.get(p, 0) for p in _STACK_PATHS)


def test_stacked_engine_logits_match_per_part_gpu(monkeypatch):
    from trace_rl.backends import get_backend
    from trace_rl.engine.native import NativeEngine
    from trace_rl.models import linear as linear_mod

    model, plan = _model()
    engine = NativeEngine(model, plan, max_batch=B, max_seq_len=L + 1, device="cuda", graph_buckets=[B],
                          kv_layout="pool", attention="kernels", operand_cache=True)
    paths = get_backend("fp4").paths
    before = _stacked_calls(paths)
    stacked = _logits(engine)
    assert _stacked_calls(paths) - before == 2 * 2      # 2 layers x (q/k/v, gate/up)
    monkeypatch.setattr(linear_mod, "STACK_ROLLOUT_OPERANDS", False)
    per_part = _logits(engine)
    assert _stacked_calls(paths) - before == 4, "per part: no stacked GEMM"
    rel = float((stacked - per_part).norm() / per_part.norm())
    agree = float((stacked.argmax(-1) == per_part.argmax(-1)).float().mean())
    print(f"stacked vs per-part logits: rel {rel:.3g}, {float((stacked == per_part).float().mean()):.4f} identical, "
          f"argmax agree {agree:.4f}")
    assert rel < 1e-2 and agree > 0.95
    # the captured step reads the stacked path too (graphs re-captured after the switch)
    monkeypatch.setattr(linear_mod, "STACK_ROLLOUT_OPERANDS", True)
    engine.graphs.invalidate()
    from trace_rl.bench.decode_grid import prime_decode

    prime_decode(engine, B, L)
    captured = _stacked_calls(paths)
    engine.decode_step(B, L, (1.0, 0, 1.0))
    torch.cuda.synchronize()
    assert engine.graphs.captured and _stacked_calls(paths) > captured   # captured stacked


def test_stacked_cache_bytes_do_not_grow_gpu(monkeypatch):
    from trace_rl.engine import operand_cache as engine_oc

    got = {}
    for stack in (False, True):
        monkeypatch.setattr(engine_oc, "STACK", stack)
        model, plan = _model()
        torch.cuda.synchronize()
        m0 = torch.cuda.memory_allocated()
        reported = engine_oc.attach_model(model, plan, "cuda")
        torch.cuda.synchronize()
        got[stack] = (torch.cuda.memory_allocated() - m0, reported, engine_oc.stack_groups(model))
        del model
    rf = sum(4 * q.out_features for g in got[True][2] for q in g)
    assert got[True][2] and rf == 2 * 4 * (4096 + 2 * 1024 + 2 * 12288)
    assert got[True][1] == got[False][1] + rf                     # reported: the same bf16 bytes + row factors
    print(f"operand cache, 2 layers: separate {got[False][0] / 1e9:.4f} GB, stacked {got[True][0] / 1e9:.4f} GB "
          f"(allocated); reported {got[False][1]} / {got[True][1]} B")
    assert got[True][0] <= got[False][0] + rf + 2**20            # allocated: not more than that (1 MiB slack)


def test_stacked_graphs_survive_load_weights_gpu(monkeypatch):
    """The captured steps read the stacks in place across a weight sync (the fused one on the GPU: each part's new
    global scale into the stack's row factors): greedy tokens after `load_weights` equal a fresh engine's on the new
    weights (same buckets and attention path, so the same GEMM shapes), the stacked GEMM running throughout."""
    from tests.engine.native_helpers import random_prompts
    from trace_rl.backends import get_backend
    from trace_rl.data import schema as K
    from trace_rl.engine.base import SamplingParams
    from trace_rl.engine.native import NativeEngine
    from trace_rl.engine.operand_cache import stack_groups
    from trace_rl.kernels import fp4_dequant
    from trace_rl.models import tiny_model
    from trace_rl.plan import PrecisionPlan

    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 1)       # every step reads the operand caches
    plan = PrecisionPlan.preset("w4a4-kv4")
    a, _ = tiny_model("tiny", seed=1, device="cuda", dtype=torch.bfloat16)
    b, _ = tiny_model("tiny", seed=2, device="cuda", dtype=torch.bfloat16)
    state_b = {k: v.clone() for k, v in b.state_dict().items()}

    def engine(model):
        return NativeEngine(model, plan, max_batch=5, max_seq_len=96, block_size=16, attention="kernels",
                            operand_cache=True)

    prompts = random_prompts([7, 3, 12], torch.Generator().manual_seed(0))
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=24, ignore_stop=True)
    count = get_backend("fp4").paths.counts.get
    graphed = engine(a)
    stacks = [g[0].packed.layout["operand_cache"].stack for g in stack_groups(graphed.model)]
    ptrs = [(st.buf.data_ptr(), st.row_factor.data_ptr()) for st in stacks]
    assert stacks and all(st is not None for st in stacks)
    before = count("fp4.operand_stack_cublas", 0)
    graphed.generate(prompts, greedy)
    assert graphed.graphs.captured and count("fp4.operand_stack_cublas", 0) > before
    fused = count("fp4.sync.fused", 0)
    graphed.load_weights(state_b, version=1)          # in place: the captured graphs read the new stacks
    assert graphed.graphs.captured and count("fp4.sync.fused", 0) > fused
    assert [(st.buf.data_ptr(), st.row_factor.data_ptr()) for st in stacks] == ptrs
    assert [g[0].packed.layout["operand_cache"].stack for g in stack_groups(graphed.model)] == stacks
    got = graphed.generate(prompts, greedy)[K.TOKENS_RESPONSE]
    want = engine(b).generate(prompts, greedy)[K.TOKENS_RESPONSE]
    assert torch.equal(got, want)
