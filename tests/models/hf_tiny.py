"""Tiny random HF checkpoints (Llama, Qwen2, Qwen3, Qwen3-MoE) written by transformers' own classes: no hub access."""

from __future__ import annotations

import torch

FAMILIES = ("llama", "qwen2", "qwen3")


def hf_config(family: str, vocab: int = 83, tie: bool | None = None):
    """Odd-ish shapes; each family exercises its own switches (biases, QK-norm, llama3 RoPE, ties)."""
    from transformers import LlamaConfig, Qwen2Config, Qwen3Config

    common = dict(vocab_size=vocab, hidden_size=96, intermediate_size=160, num_hidden_layers=2,
                  max_position_embeddings=512)
    if family == "llama":
        return LlamaConfig(**common, num_attention_heads=3, num_key_value_heads=1, attention_bias=True,
                           mlp_bias=True, tie_word_embeddings=bool(tie),
                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if family == "qwen2":
        return Qwen2Config(**common, num_attention_heads=4, num_key_value_heads=2,
                           tie_word_embeddings=True if tie is None else tie)
    return Qwen3Config(**common, num_attention_heads=6, num_key_value_heads=2, head_dim=32, rope_theta=5000.0,
                       tie_word_embeddings=True if tie is None else tie)


def hf_model(family: str, seed: int, std: float = 0.1, **kw):
    """A transformers CausalLM in float32 with N(0, std) weights (norms around 1)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_config(family, **kw)).float().eval()
    _randomize(model, seed, std)
    return model


def hf_folder(family: str, folder, seed: int, **kw):
    """(folder, transformers model): the model saved with `save_pretrained` into `folder`."""
    model = hf_model(family, seed, **kw)
    model.save_pretrained(str(folder))
    return folder, model


def hf_moe_config(vocab: int = 83, norm_topk_prob: bool = True, mlp_only_layers=(1,), sparse_step: int = 1,
                  tie: bool = False):
    """A tiny Qwen3-MoE: 3 layers (layer 1 dense by default), 8 experts, top 3, odd-ish widths."""
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(vocab_size=vocab, hidden_size=64, intermediate_size=96, moe_intermediate_size=40,
                          num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                          num_experts=8, num_experts_per_tok=3, norm_topk_prob=norm_topk_prob,
                          decoder_sparse_step=sparse_step, mlp_only_layers=list(mlp_only_layers),
                          rope_theta=5000.0, max_position_embeddings=512, tie_word_embeddings=tie)


def hf_moe_model(seed: int, std: float = 0.1, **kw):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(hf_moe_config(**kw)).float().eval()
    _randomize(model, seed, std)
    return model


def _randomize(model, seed: int, std: float) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(std * torch.randn(p.shape, generator=gen))
