"""The native engine records each token's experts (router replay); the MoE decode step has no host sync."""

from __future__ import annotations

import pytest
import torch

from tests.engine.native_helpers import PAD, random_prompts
from trace_rl.data import schema as K
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine, rollout_copy
from trace_rl.models import tiny_model
from trace_rl.models.moe import moe_blocks
from trace_rl.objectives import TrainerLogProbs
from trace_rl.plan import PrecisionPlan

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _generate(rng, plan=None, dtype=torch.float64, n=2, new=9, **kw):
    model, _ = tiny_model("tiny-moe", seed=3, dtype=dtype)
    engine = NativeEngine(model, plan, max_batch=4, max_seq_len=40, pad_token_id=PAD, **kw)
    prompts = random_prompts([5, 11, 3], rng)
    out = engine.generate(prompts, SamplingParams(n=n, temperature=1.0, max_new_tokens=new, seed=5))
    return model, engine, out


@pytest.mark.parametrize("kw", [{}, {"kv_layout": "contiguous"}, {"num_pages": 5, "block_size": 8}])
def test_records_are_the_trainers_routing_at_every_fed_position(kw, rng):
    """float64 bf16 plan: rollout (prefill with shared prompt pages, paged decode, continuous batching over 4
    slots, preemption and recompute when the pool is short) and trainer compute the same router logits, so
    the recorded experts are the trainer's own top-k everywhere."""
    model, engine, out = _generate(rng, **kw)
    if "num_pages" in kw:
        assert engine.stats["preemptions"] > 0
    experts, valid = out.get(K.ROUTING_EXPERTS), out.get(K.ROUTING_VALID)
    rows, lp, lr = 6, out.get(K.TOKENS_PROMPT).shape[1], out.get(K.TOKENS_RESPONSE).shape[1]
    assert experts.shape == (rows, lp + lr, 3, 2) and experts.dtype == torch.int16
    plen, ngen = out.get(K.MASK_PROMPT).sum(1), out.get(K.NUM_GENERATED)
    want_valid = torch.arange(lp + lr)[None, :] < (plen + ngen - 1)[:, None]
    assert torch.equal(valid, want_valid)
    assert engine.report()["routing_bytes_per_token"] == 3 * 2 * 2
    TrainerLogProbs(model, pad_token_id=PAD, micro_batch_size=4)(out)
    own = out.get(K.ROUTING_TRAINER)
    same = (experts.sort(-1).values == own.sort(-1).values).all(-1).all(-1)
    assert bool(same[valid].all())


def test_replaying_the_trainers_own_routing_changes_nothing(rng):
    model, _, out = _generate(rng, dtype=torch.float32)
    TrainerLogProbs(model, pad_token_id=PAD, write_old=False)(out)
    plain = out.get(K.LOGP_TRAINER).clone()
    out.set(K.ROUTING_EXPERTS, out.get(K.ROUTING_TRAINER))              # the trainer's own choices...
    out.set(K.ROUTING_VALID, torch.ones_like(out.get(K.ROUTING_VALID)))  # ...at every position
    TrainerLogProbs(model, pad_token_id=PAD, write_old=False, router_replay=True)(out)
    assert torch.equal(out.get(K.LOGP_TRAINER), plain)


def test_replay_uses_the_records_and_keeps_router_gradients(rng):
    from trace_rl.objectives.logprobs import response_log_probs
    from trace_rl.objectives.router_replay import router_replay

    model, _, out = _generate(rng, dtype=torch.float32)
    other = out.clone()
    other.set(K.ROUTING_EXPERTS, (out.get(K.ROUTING_EXPERTS) + 1) % 8)   # different experts everywhere
    args = [out.get(k) for k in (K.TOKENS_PROMPT, K.MASK_PROMPT, K.TOKENS_RESPONSE, K.MASK_RESPONSE)]
    with router_replay(model, out):
        lp, _ = response_log_probs(model, *args, pad_token_id=PAD)
    with router_replay(model, other):
        lp_other, _ = response_log_probs(model, *args, pad_token_id=PAD)
    assert (lp - lp_other).abs().max() > 1e-3
    lp_other.sum().backward()
    assert all(b.gate.weight.grad.abs().sum() > 0 for b in moe_blocks(model))
    assert all(b.replay is None for b in moe_blocks(model))               # the context restores the model
    bad = out.clone()
    bad.set(K.ROUTING_EXPERTS, out.get(K.ROUTING_EXPERTS)[..., :1, :])
    with pytest.raises(ValueError, match="MoE layers"):
        with router_replay(model, bad):
            pass


def test_no_routing_records_for_dense_models_and_clear_errors(rng):
    model, _ = tiny_model("tiny", seed=0)
    engine = NativeEngine(model, max_batch=2, max_seq_len=24, pad_token_id=PAD)
    assert engine.routing is None
    with pytest.raises(ValueError, match="mixture-of-experts"):
        NativeEngine(model, max_batch=2, max_seq_len=24, pad_token_id=PAD, record_routing=True)
    out = engine.generate(random_prompts([3], rng), SamplingParams(max_new_tokens=3, seed=0))
    with pytest.raises(ValueError, match="mixture-of-experts"):
        TrainerLogProbs(model, pad_token_id=PAD, router_replay=True)(out)


@pytest.mark.parametrize("plan", ["fp8", "w4a4-kv4"])
def test_quantized_moe_engine_load_weights_and_report(plan, rng):
    plan = PrecisionPlan.preset(plan)
    model, engine, out = _generate(rng, plan, dtype=torch.float32, new=5)
    paths = engine.report()["linear"]
    assert any(k.startswith("experts.loop") for p in paths.values() for k in p)
    other, _ = tiny_model("tiny-moe", seed=11)
    engine.load_weights(other.state_dict(), 1)
    fresh = rollout_copy(other, plan, torch.device("cpu"), torch.float32)
    tokens = torch.randint(4, 100, (2, 6), generator=rng)
    with torch.no_grad():
        assert torch.equal(engine.model(tokens), fresh(tokens))


# -- capturability: the MoE decode step has no host sync (what a CUDA graph needs), checked on CPU --


def test_moe_decode_step_has_no_host_sync():
    """Fake tensors carry no data: any op that reads device data on the host (.item(), .tolist(), bool())
    or has a data-dependent shape (nonzero, bincount) raises. The whole decode forward of a bf16 MoE model
    (router, dispatch, torch._grouped_mm, un-permute, routing record) runs through."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, FakeTensorMode

    if not hasattr(torch, "_grouped_mm"):
        pytest.skip("torch has no _grouped_mm")
    model, _ = tiny_model("tiny-moe", seed=1, dtype=torch.bfloat16)
    engine = NativeEngine(model, max_batch=4, max_seq_len=32, pad_token_id=PAD, cuda_graphs=False)
    engine.routing.begin(1, 4, 4, 4)
    assert moe_blocks(engine.model)[0].experts.rollout["gate_up"].path(torch.empty(1, 128, dtype=torch.bfloat16)) \
        == "grouped_mm"
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
        logits = engine._decode_forward(4, None)
        engine.routing.store_decode(torch.arange(4), torch.zeros(4, dtype=torch.long))
        assert logits.shape == (4, 128)
        # the check catches a sync: the reference loop reads the group bounds on the host
        from trace_rl.backends.grouped_linear import grouped_mm

        with pytest.raises(DataDependentOutputException):
            grouped_mm(torch.randn(8, 16, dtype=torch.bfloat16), torch.randn(8, 4, 16, dtype=torch.bfloat16),
                       torch.arange(1, 9, dtype=torch.int32), "loop")


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("plan", ["w4a16-mx", "w4a4-kv4"])
def test_fp4_moe_decode_step_has_no_host_sync(plan, monkeypatch):
    """The same check for an FP4 plan with the experts on the grouped FP4 kernel (`fp4_grouped`, forced here: on
    CPU the engine picks the emulated loop; the kernels' launches are recorded, not run — fake tensors carry no
    data). One grouped-GEMM launch per grouped linear and layer (W4A4: each after its activation quantization)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from triton.runtime.interpreter import InterpretedFunction

    model, _ = tiny_model("tiny-moe", seed=1, dtype=torch.bfloat16)
    engine = NativeEngine(model, PrecisionPlan.preset(plan), max_batch=4, max_seq_len=32, pad_token_id=PAD,
                          cuda_graphs=False)
    linears = [g for ex in engine.model.experts() for g in ex.grouped_linears().values()]
    for g in linears:
        g.force_path = "fp4_grouped"
    engine.routing.begin(1, 4, 4, 4)
    assert engine._decode_forward(4, None).isfinite().all()      # a real step first: derives the kernel layouts
    launches = []
    monkeypatch.setattr(InterpretedFunction, "run",
                        lambda self, *a, grid, warmup, **k: launches.append((self.fn.__name__, grid)))
    with torch.no_grad(), FakeTensorMode(allow_non_fake_inputs=True):
        logits = engine._decode_forward(4, None)
        engine.routing.store_decode(torch.arange(4), torch.zeros(4, dtype=torch.long))
        assert logits.shape == (4, 128)
    grouped = [grid for name, grid in launches if name == "_fp4_grouped_kernel"]
    assert len(grouped) == len(linears) == 3 * 2                 # gate/up stacked (nvfp4: each half its global)
    assert all(isinstance(n, int) for grid in grouped for n in grid)
    silu = [name for name, _ in launches if name == "_silu_mul_kernel"]
    assert len(silu) == (3 if plan == "w4a16-mx" else 0)     # W4A4: SwiGLU fused into the down's quantize launch
    assert len(launches) == len(grouped) * (1 if plan == "w4a16-mx" else 2) + len(silu)
