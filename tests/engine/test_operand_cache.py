"""The engine's operand cache (engine/operand_cache.py): refused with a clear error where it cannot work (bf16/fp8
plans, CPU); attached before the KV cache and counted in `report()`; every weight-sync path of the engine
(`load_weights`' batched `load_linear_weights`, `weight_sync.load_packed`) refreshes each cache in place. On CPU the
fp4 backend emulates (the cache is never read), so `why_not` is patched to let the engine attach it here; the
refresh runs the dequantization kernel in Triton's interpreter."""

from __future__ import annotations

import pytest
import torch

from trace_rl.engine import operand_cache as engine_oc
from trace_rl.engine.native import NativeEngine
from trace_rl.models import tiny_model
from trace_rl.plan import PrecisionPlan

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("preset,match", [("bf16", "plan 'bf16' has 'bf16' rollout weights"),
                                          ("fp8", "has 'fp8_e4m3"),
                                          ("w4a4-kv4", "on cpu the fp4 backend emulates")])
def test_refused_where_it_cannot_work(preset, match):
    model, _ = tiny_model("tiny", seed=0)
    with pytest.raises(ValueError, match=f"operand_cache: .*{match}"):
        NativeEngine(model, PrecisionPlan.preset(preset), max_batch=2, max_seq_len=32, operand_cache=True)


def _check_caches(engine, ptrs=None):
    from trace_rl.kernels.hopper_fp4 import operand
    from trace_rl.kernels.operand_cache import cached

    out = {}
    for q in engine_oc.fp4_dense(engine.model):
        oc = cached(q.packed)
        assert oc is not None
        ref = operand(q.packed.layout["hopper_fp4"])
        nan = ref.isnan()
        assert torch.equal(nan, oc.buf.isnan()) and torch.equal(oc.buf[~nan].view(torch.int16),
                                                                 ref[~nan].view(torch.int16))
        out[id(q)] = oc.buf.data_ptr()
        if oc.stack is not None:      # its rows of the stack, and its row factors beside them
            h = q.packed.layout["hopper_fp4"]
            assert torch.equal(oc.stack.buf[oc.lo:oc.lo + h.n], oc.buf)
            assert torch.equal(oc.stack.row_factor[oc.lo:oc.lo + h.n].view(torch.int32),
                               h.row_factor[:h.n].view(torch.int32))
    if ptrs is not None:
        assert out == ptrs            # refreshed in place: no buffer reallocated
    return out


@pytest.mark.parametrize("preset", ["w4a4-kv4", "w4a4-kv4-mx"])
def test_every_sync_path_refreshes_in_place(preset, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device: "")
    model, _ = tiny_model("tiny", seed=1)
    engine = NativeEngine(model, PrecisionPlan.preset(preset), max_batch=2, max_seq_len=32, operand_cache=True)
    dense = engine_oc.fp4_dense(engine.model)
    assert dense
    rep = engine.report()
    stacks = engine_oc.stack_groups(engine.model)
    assert bool(stacks) == (preset == "w4a4-kv4")      # nvfp4: q/k/v and gate/up apart, their caches stacked
    assert rep["operand_cache"] and rep["operand_cache_bytes"] == sum(2 * q.out_features * q.in_features
                                                                       for q in dense) \
        + sum(4 * q.out_features for g in stacks for q in g)      # + the stacks' float32 row factors
    ptrs = _check_caches(engine)
    before = [q.packed.layout["operand_cache"].buf.clone() for q in dense]
    state = {k: -2 * v if v.is_floating_point() else v for k, v in model.state_dict().items()}
    engine.load_weights(state, 1)                       # the batched sync (load_linear_weights)
    _check_caches(engine, ptrs)
    assert any(not torch.equal(b, q.packed.layout["operand_cache"].buf) for b, q in zip(before, dense))
    from trace_rl.distributed.weight_sync import load_packed, unique_state_keys

    live = engine.model.state_dict()
    payload = {k: live[k].clone() for k in unique_state_keys(engine.model)}
    codes = [k for k in payload if k.endswith("w_codes")]
    for k in codes:
        payload[k] = payload[k] ^ 0x21                  # other codes, same layout
    before = [q.packed.layout["operand_cache"].buf.clone() for q in dense]
    load_packed(engine, payload, 2)                     # the distributed workers' packed sync
    _check_caches(engine, ptrs)
    assert all(not torch.equal(b, q.packed.layout["operand_cache"].buf) for b, q in zip(before, dense))


def test_a_lost_cache_is_an_error_not_a_silent_fallback(monkeypatch):
    """A packed weight rebuilt after the engine attached its cache (e.g. the model moved) would run the per-call paths
    unannounced: the next weight load says so instead."""
    pytest.importorskip("triton")
    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device: "")
    model, _ = tiny_model("tiny", seed=2)
    engine = NativeEngine(model, PrecisionPlan.preset("w4a4-kv4"), max_batch=2, max_seq_len=32, operand_cache=True)
    state = dict(model.state_dict())
    engine.load_weights(state, 1)                       # caches present: fine
    del engine_oc.fp4_dense(engine.model)[0].packed.layout["operand_cache"]
    with pytest.raises(RuntimeError, match="operand_cache: 1 dense FP4 linear"):
        engine.load_weights(state, 2)


def test_layout_key_is_the_kernels():
    """engine/operand_cache.py names the packed layout's entry without importing Triton; it must be the kernel's."""
    kernel = pytest.importorskip("trace_rl.kernels.operand_cache")
    assert engine_oc.KEY == kernel.KEY


def test_fp8_kind_refused_off_mxfp4_w4a4():
    model, _ = tiny_model("tiny", seed=0)
    for preset in ("w4a4-kv4", "w4a16-mx"):
        with pytest.raises(ValueError, match="operand_cache: the FP8 operand cache holds mxfp4 operands exactly"):
            NativeEngine(model, PrecisionPlan.preset(preset), max_batch=2, max_seq_len=32, operand_cache="fp8")
    with pytest.raises(ValueError, match="operand_cache='fp16': choose false, true"):
        NativeEngine(model, PrecisionPlan.preset("w4a4-kv4-mx"), max_batch=2, max_seq_len=32, operand_cache="fp16")


def test_fp8_cache_attached_counted_and_refreshed_in_place(monkeypatch):
    """operand_cache='fp8' on an mxfp4 W4A4 plan: every dense linear holds the E4M3 operand (its bf16 operand x 2**5,
    bit-identical values), 1 byte per element in the report, never stacked; both sync paths rewrite it in place."""
    pytest.importorskip("triton")
    from trace_rl.kernels.hopper_fp4 import operand

    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device, kind="bf16": "")
    model, _ = tiny_model("tiny", seed=1)
    engine = NativeEngine(model, PrecisionPlan.preset("w4a4-kv4-mx"), max_batch=2, max_seq_len=32, operand_cache="fp8")
    dense = engine_oc.fp4_dense(engine.model)
    rep = engine.report()
    assert rep["operand_cache"] and rep["operand_cache_kind"] == "fp8"
    assert rep["operand_cache_kinds"] == {"fp8": len(dense)}
    assert rep["operand_cache_bytes"] == sum(q.out_features * q.in_features for q in dense)

    def check():
        for q in dense:
            oc = q.packed.layout["operand_cache"]
            assert oc.fp8 and oc.stack is None
            assert torch.equal(oc.buf.float(), operand(q.packed.layout["hopper_fp4"]).float() * 32)
        return [q.packed.layout["operand_cache"].buf.data_ptr() for q in dense]

    ptrs = check()
    state = {k: -2 * v if v.is_floating_point() else v for k, v in model.state_dict().items()}
    engine.load_weights(state, 1)
    assert check() == ptrs


def test_fp8_sync_checks_once_and_names_every_inexact_weight(monkeypatch):
    """A weight sync (load_weights' batched loads, weight_sync.load_packed) with two weights E4M3 cannot hold raises
    one InexactWeight naming both (one host read for the sync, none per weight), leaves policy_version as it was; a
    fitting sync after it goes through."""
    pytest.importorskip("triton")
    from trace_rl.distributed.weight_sync import load_packed, unique_state_keys
    from trace_rl.kernels import operand_cache_fp8 as f8

    monkeypatch.setattr(engine_oc, "why_not", lambda plan, device, kind="bf16": "")
    model, _ = tiny_model("tiny", seed=2)
    engine = NativeEngine(model, PrecisionPlan.preset("w4a4-kv4-mx"), max_batch=2, max_seq_len=32, operand_cache="fp8")
    names = [n for n, lin in engine.model.linears().items() if not lin.fused_from and lin.quant.weight_fmt == "mxfp4"]
    bad_names = [names[0], names[-1]]
    good = {k: v.clone() for k, v in model.state_dict().items()}
    bad = {k: v.clone() for k, v in good.items()}
    for n in bad_names:
        w = bad[f"{n}.weight"]
        w[0, :32] = torch.linspace(0.1, 6.0, 32) * 2.0 ** -20 * w[0].abs().max()     # ~21 binades below the row
    monkeypatch.setattr(f8.OperandCacheFP8, "write", lambda self, q: pytest.fail("a per-weight host read"))
    with pytest.raises(f8.InexactWeight) as err:
        engine.load_weights(bad, 1)
    assert err.value.names == bad_names and engine.policy_version == 0
    live = engine.model.state_dict()
    payload = {k: live[k].clone() for k in unique_state_keys(engine.model)}      # the inexact weights, packed
    engine.load_weights(good, 2)
    assert engine.policy_version == 2
    with pytest.raises(f8.InexactWeight) as err:
        load_packed(engine, payload, 3)
    assert err.value.names == bad_names and engine.policy_version == 2
