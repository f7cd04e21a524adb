"""Our decoder against transformers' own implementation, HF-folder round trips, and plan application."""

from __future__ import annotations

import json

import pytest
import torch

from tests.models.hf_tiny import FAMILIES, hf_folder
from trace_rl.models import ModelConfig, build, load, save_pretrained, tiny_model
from trace_rl.plan import PrecisionPlan

pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).detach().norm() / b.detach().norm())


@pytest.mark.parametrize("family", FAMILIES)
def test_logits_equal_transformers(family, tmp_path, rng):
    seed = int(torch.randint(0, 2**31, (), generator=rng))
    folder, ref = hf_folder(family, tmp_path, seed)
    ours = load(folder)
    assert ours.config.family == family
    tokens = torch.randint(0, ref.config.vocab_size, (3, 41), generator=rng)
    with torch.no_grad():
        want = ref(tokens).logits
        got = ours(tokens)
    assert got.shape == (3, 41, ref.config.vocab_size)
    assert _rel(got, want) <= 1e-5


def test_untied_qwen3_and_positions(tmp_path, rng):
    folder, ref = hf_folder("qwen3", tmp_path, 7, tie=False)
    ours = load(folder)
    assert ours.lm_head.weight.data_ptr() != ours.model.embed_tokens.weight.data_ptr()
    tokens = torch.randint(0, 83, (2, 9), generator=rng)
    pos = torch.arange(100, 109).expand(2, 9)          # positions other than 0..T-1 reach RoPE
    with torch.no_grad():
        want = ref(tokens, position_ids=pos).logits
        assert _rel(ours(tokens, positions=pos), want) <= 1e-5


@pytest.mark.parametrize("name", ["tiny", "tiny-llama"])
def test_save_pretrained_loads_in_both(name, tmp_path, rng):
    from transformers import AutoModelForCausalLM

    model, tok = tiny_model(name, seed=3)
    save_pretrained(model, tok, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["model_type"] == model.config.family and cfg["eos_token_id"] == tok.eos_token_id
    again = load(tmp_path)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), local_files_only=True).float().eval()
    tokens = torch.randint(0, tok.vocab_size, (2, 13), generator=rng)
    with torch.no_grad():
        ours = model(tokens)
        assert torch.equal(again(tokens), ours)
        assert _rel(hf(tokens).logits, ours) <= 1e-5


def test_tiny_preset_size():
    model, tok = tiny_model("tiny")
    n = sum(p.numel() for p in model.parameters())
    assert 1_000_000 <= n <= 3_000_000 and n == model.config.num_params
    assert model.config.qk_norm and model.config.tie_word_embeddings
    assert tok.vocab_size == model.config.vocab_size


def test_unsupported_config_is_an_error():
    with pytest.raises(ValueError, match="model_type"):
        ModelConfig.from_hf_dict({"model_type": "gpt2"})
    with pytest.raises(ValueError, match="hidden_act"):
        ModelConfig.from_hf_dict({"model_type": "llama", "hidden_act": "gelu"})


def test_plan_formats_and_keep_high_precision():
    plan = PrecisionPlan.preset("w4a4-kv4").model_copy(
        update={"keep_high_precision": ("lm_head", "embed_tokens", "*norm*", "model.layers.0.mlp.*")})
    model, _ = tiny_model("tiny", plan=plan)
    lin = model.linears()
    assert (lin["model.layers.1.self_attn.q_proj"].weight_fmt, lin["model.layers.1.self_attn.q_proj"].act_fmt) \
        == ("nvfp4", "nvfp4")
    assert lin["model.layers.0.mlp.down_proj"].weight_fmt == "bf16"
    assert lin["model.layers.0.self_attn.o_proj"].weight_fmt == "nvfp4"
    assert lin["lm_head"].weight_fmt == "bf16"
    model.to_rollout()
    assert model.lm_head.quant.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, no copy
    assert model.model.layers[1].mlp.up_proj.quant.w_codes.dtype == torch.uint8    # nvfp4: never stacked
    assert model.model.layers[1].self_attn.qkv_proj is None
    fused = model.model.layers[0].mlp.gate_up_proj                                  # bf16 gate/up: stacked
    assert fused.quant.weight_fmt == "bf16" and model.model.layers[0].mlp.up_proj is None
    assert fused.fused_from == ("model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj")


def test_aligned_trainer_fake_quantizes_and_has_gradients(rng):
    model, _ = tiny_model("tiny", seed=5)
    tokens = torch.randint(4, 100, (2, 11), generator=rng)
    plain = model(tokens)
    model.apply_plan(PrecisionPlan.preset("fp4-aligned"))
    aligned = model(tokens)
    assert 1e-3 < _rel(aligned, plain) < 0.5        # quantization changes the logits, but not wildly
    aligned.logsumexp(-1).mean().backward()        # straight-through: every weight gets a gradient
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    model.apply_plan(PrecisionPlan.preset("fp4"))    # trainer="bf16": plain forward again
    assert torch.equal(model(tokens), plain)


def test_build_on_meta_materialises_on_device():
    model = build(ModelConfig(), dtype=torch.bfloat16)
    assert model.inv_freq.dtype == torch.float32 and model.model.embed_tokens.weight.dtype == torch.bfloat16
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert not any(p.is_meta for p in model.parameters())
