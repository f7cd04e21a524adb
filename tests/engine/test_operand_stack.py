"""The engine's stacked operand cache (engine/operand_cache.py `STACK`, `models.linear.STACK_ROLLOUT_OPERANDS`) on a
tiny w4a4-kv4 model (nvfp4: q/k/v and gate/up apart): the kernel paths run in Triton's interpreter on CPU tensors
(`_on_kernels` forced, the operand-cache threshold lowered to 1 row so prefill and decode both read the caches).
Samples and log-probs equal the unstacked GEMMs' (on the same stacked buffer) and separate caches'; the caches take
the same bf16 bytes as separate ones (+ the stacks' float32 row factors); the stacked GEMM is what runs."""

from __future__ import annotations

import pytest
import torch

from tests.engine.native_helpers import PAD, random_prompts
from trace_rl.backends import fp4 as fp4_backend
from trace_rl.backends import get_backend
from trace_rl.data import schema as K
from trace_rl.engine import operand_cache as engine_oc
from trace_rl.engine.base import SamplingParams
from trace_rl.engine.native import NativeEngine
from trace_rl.models import linear as linear_mod
from trace_rl.models import tiny_model
from trace_rl.plan import PrecisionPlan

pytestmark = [pytest.mark.usefixtures("one_torch_thread"),
              pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:overflow:RuntimeWarning"),
              pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")]


@pytest.fixture
def kernels_on_cpu(monkeypatch):
    pytest.importorskip("triton")
    from trace_rl.kernels import fp4_dequant, interpreting

    if not interpreting():
        pytest.skip("needs TRITON_INTERPRET=1 (set by the test suite on CPU machines)")
    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device: "")
    monkeypatch.setattr(fp4_backend, "_on_kernels", lambda x: True)
    monkeypatch.setattr(fp4_dequant, "DEQUANT_CUBLAS_MIN_M", 1)
    return monkeypatch


def _engine(stack: bool, monkeypatch, seed=5):
    monkeypatch.setattr(engine_oc, "STACK", stack)
    model, _ = tiny_model("tiny", seed=seed)
    return NativeEngine(model, PrecisionPlan.preset("w4a4-kv4"), max_batch=3, max_seq_len=32, block_size=16,
                        pad_token_id=PAD, operand_cache=True)


def _run(engine, seed=11, max_new=5):
    rng = torch.Generator().manual_seed(seed)
    sampling = SamplingParams(n=2, temperature=1.0, max_new_tokens=max_new, ignore_stop=True, seed=1234)
    out = engine.generate(random_prompts([5, 9], rng), sampling)
    return out[K.TOKENS_RESPONSE], out[K.LOGP_ROLLOUT]


def test_stacked_engine_same_samples_and_bytes(kernels_on_cpu):
    paths = get_backend("fp4").paths
    engine = _engine(True, kernels_on_cpu)
    groups = engine_oc.stack_groups(engine.model)
    layers = len(engine.model.model.layers)
    assert len(groups) == 2 * layers and [len(g) for g in groups[:2]] == [3, 2]
    before = paths.counts.get("fp4.operand_stack_cublas", 0)
    tok, logp = _run(engine)
    stacked_calls = paths.counts.get("fp4.operand_stack_cublas", 0) - before
    assert stacked_calls >= 2 * layers * 2                       # prefill + decode steps, q/k/v and gate/up each
    kernels_on_cpu.setattr(linear_mod, "STACK_ROLLOUT_OPERANDS", False)   # per-part GEMMs on the same buffer
    tok_parts, logp_parts = _run(engine)
    assert paths.counts.get("fp4.operand_stack_cublas", 0) - before == stacked_calls
    kernels_on_cpu.setattr(linear_mod, "STACK_ROLLOUT_OPERANDS", True)
    separate = _engine(False, kernels_on_cpu)
    assert not any(engine_oc.KEY in q.packed.layout and q.packed.layout[engine_oc.KEY].stack is not None
                   for q in engine_oc.fp4_dense(separate.model))
    tok_sep, logp_sep = _run(separate)
    for t, lp in ((tok_parts, logp_parts), (tok_sep, logp_sep)):
        assert torch.equal(t, tok)
        torch.testing.assert_close(lp, logp, rtol=0, atol=1e-5)   # CPU: the same float32 matmul per column
    rf = sum(4 * q.out_features for g in groups for q in g)
    stacked_bytes, separate_bytes = engine.report()["operand_cache_bytes"], separate.report()["operand_cache_bytes"]
    assert stacked_bytes == separate_bytes + rf                   # the bf16 operands: the same bytes, not doubled
    assert separate_bytes == sum(2 * q.out_features * q.in_features for q in engine_oc.fp4_dense(separate.model))


def test_stack_follows_weight_sync(kernels_on_cpu):
    """After `load_weights` (new global scales), the stacked engine still matches separate caches."""
    engine, separate = _engine(True, kernels_on_cpu, seed=6), _engine(False, kernels_on_cpu, seed=6)
    model, _ = tiny_model("tiny", seed=6)
    state = {k: -3 * v for k, v in model.state_dict().items()}
    for e in (engine, separate):
        e.load_weights(state, 1)
    tok, logp = _run(engine, seed=12, max_new=2)
    tok_sep, logp_sep = _run(separate, seed=12, max_new=2)
    assert torch.equal(tok, tok_sep)
    torch.testing.assert_close(logp, logp_sep, rtol=0, atol=1e-5)


def test_check_model_refuses_a_broken_stack(kernels_on_cpu):
    """A part whose cache was replaced by a separate one after stacking: the group would run per part beside a
    buffer no layer reads whole, so `check_model` (run after every weight load) says so instead."""
    from trace_rl.kernels import operand_cache as kernel_oc

    engine = _engine(True, kernels_on_cpu)
    engine_oc.check_model(engine.model)
    group = engine_oc.stack_groups(engine.model)[0]
    group[0].packed.layout.pop(engine_oc.KEY)
    kernel_oc.attach(group[0].packed)
    with pytest.raises(RuntimeError, match="no longer whole"):
        engine_oc.check_model(engine.model)
