"""`models.linear.shared_input`: a rollout nvfp4 W4A4 model (q/k/v and gate/up left unfused) quantizes each shared
input once, with the same logits as each layer quantizing it (emulated here; the kernels' bits:
tests/kernels/test_shared_input.py); hooks still see every layer; the trainer stage is unchanged."""

import torch

from trace_rl.backends import get_backend
from trace_rl.models import build, preset
from trace_rl.models import linear as linear_mod
from trace_rl.plan import PrecisionPlan


def _rollout(plan_name):
    model = build(preset("tiny"), dtype=torch.float32, plan=PrecisionPlan.preset(plan_name))
    model.init_random(generator=torch.Generator().manual_seed(0))
    return model.to_rollout()


def test_shared_quantization_same_logits(monkeypatch):
    model = _rollout("w4a4-kv4")
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    assert attn.qkv_proj is None and mlp.gate_up_proj is None        # nvfp4: not stacked, so shared_input runs
    tokens = torch.randint(0, 128, (3, 9), generator=torch.Generator().manual_seed(1))
    backend = get_backend("fp4")
    calls = []
    real = type(backend).quantize_input
    monkeypatch.setattr(type(backend), "quantize_input", lambda self, *a: calls.append(1) or real(self, *a))
    seen = []
    attn.k_proj.activation_hook = lambda layer, x: seen.append(layer.name)
    mlp.up_proj.activation_hook = lambda layer, x: seen.append(layer.name)
    with torch.no_grad():
        shared = model(tokens)
        n = len(model.model.layers)
        assert len(calls) == 2 * n and len(seen) == 2
        monkeypatch.setattr(linear_mod, "SHARE_ROLLOUT_INPUTS", False)
        separate = model(tokens)
    assert len(calls) == 2 * n and len(seen) == 4
    assert torch.equal(shared, separate)


def test_trainer_and_bf16_do_not_share(monkeypatch):
    backend = get_backend("fp4")
    calls = []
    real = type(backend).quantize_input
    monkeypatch.setattr(type(backend), "quantize_input", lambda self, *a: calls.append(1) or real(self, *a))
    tokens = torch.randint(0, 128, (2, 5), generator=torch.Generator().manual_seed(2))
    trainer = build(preset("tiny"), dtype=torch.float32, plan=PrecisionPlan.preset("w4a4-kv4"))
    trainer.init_random(generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trainer(tokens)
        _rollout("w4a16")(tokens)                                     # W4A16: nothing to share
    assert not calls


def test_shared_input_groups_are_the_unstacked_ones():
    """`Decoder.shared_input_groups`: q/k/v and gate/up of every layer where `to_rollout` left them apart (nvfp4),
    none where it stacked them (mxfp4: `FUSABLE_WEIGHT_FORMATS`); the engine's operand cache stacks these."""
    nv, mx = _rollout("w4a4-kv4"), _rollout("w4a4-kv4-mx")
    groups = nv.shared_input_groups()
    n = len(nv.model.layers)
    assert len(groups) == 2 * n
    assert [p.name.rsplit(".", 1)[1] for p in groups[0] + groups[1]] == ["q_proj", "k_proj", "v_proj", "gate_proj",
                                                                          "up_proj"]
    assert mx.shared_input_groups() == []
