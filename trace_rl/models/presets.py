"""Model presets: tiny char-level models for tests and the embedded default, and real shapes for benches.

| name          | family    | layers | hidden | heads/kv | head_dim | MLP   | vocab  | params | tied |
|---------------|-----------|--------|--------|----------|----------|-------|--------|--------|------|
| tiny          | qwen3     | 4      | 192    | 6 / 2    | 32       | 512   | 128    | ~1.6M  | yes  |
| tiny-llama    | llama     | 2      | 128    | 4 / 2    | 32       | 256   | 128    | ~0.3M  | no   |
| tiny-moe      | qwen3_moe | 4      | 128    | 4 / 2    | 32       | 8x64 t2 | 128    | ~0.9M  | yes  |
| qwen3-1.7b    | qwen3     | 28     | 2048   | 16 / 8   | 128      | 6144  | 151936 | 2.0B   | yes  |
| qwen3-8b      | qwen3     | 36     | 4096   | 32 / 8   | 128      | 12288 | 151936 | 8.2B   | no   |
| qwen3-30b-a3b | qwen3_moe | 48     | 2048   | 32 / 4   | 128      | 128x768 t8 | 151936 | 30.5B | no |

MoE MLP column: experts x width, t = experts per token. tiny-moe's layer 0 is a dense MLP (256);
qwen3-30b-a3b reads 3.3B parameters per token.

The real shapes carry no weights (none can be downloaded here): benches fill them with random values.
"""

from __future__ import annotations

import torch

from trace_rl.models.config import ModelConfig
from trace_rl.models.tokenizer import CharTokenizer

_TOK = CharTokenizer(vocab_size=128)
_CHAR_IDS = dict(bos_token_id=_TOK.bos_token_id, eos_token_id=_TOK.eos_token_id, pad_token_id=_TOK.pad_token_id)

PRESETS: dict[str, ModelConfig] = {
    "tiny": ModelConfig(family="qwen3", vocab_size=128, hidden_size=192, intermediate_size=512, num_layers=4,
                        num_heads=6, num_kv_heads=2, head_dim=32, rope_theta=10000.0,
                        max_position_embeddings=4096, tie_word_embeddings=True, qk_norm=True, **_CHAR_IDS),
    "tiny-llama": ModelConfig(family="llama", vocab_size=128, hidden_size=128, intermediate_size=256,
                              num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, rms_norm_eps=1e-5,
                              tie_word_embeddings=False, qk_norm=False, **_CHAR_IDS),
    "tiny-moe": ModelConfig(family="qwen3_moe", vocab_size=128, hidden_size=128, intermediate_size=256,
                            num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, tie_word_embeddings=True,
                            qk_norm=True, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                            norm_topk_prob=True, mlp_only_layers=(0,), **_CHAR_IDS),
    "qwen3-1.7b": ModelConfig(family="qwen3", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                              num_layers=28, num_heads=16, num_kv_heads=8, head_dim=128, rope_theta=1e6,
                              max_position_embeddings=40960, tie_word_embeddings=True, qk_norm=True),
    "qwen3-8b": ModelConfig(family="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                            num_layers=36, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=1e6,
                            max_position_embeddings=40960, tie_word_embeddings=False, qk_norm=True),
    "qwen3-30b-a3b": ModelConfig(family="qwen3_moe", vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                 num_layers=48, num_heads=32, num_kv_heads=4, head_dim=128, rope_theta=1e6,
                                 max_position_embeddings=40960, tie_word_embeddings=False, qk_norm=True,
                                 num_experts=128, num_experts_per_tok=8, moe_intermediate_size=768,
                                 norm_topk_prob=True),
}


def preset(name: str) -> ModelConfig:
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; available: {', '.join(PRESETS)}")
    return PRESETS[name]


def char_tokenizer_for(config: ModelConfig) -> CharTokenizer:
    """The char tokenizer whose vocabulary fills (part of) `config.vocab_size`."""
    return CharTokenizer(vocab_size=config.vocab_size)


def tiny_model(name: str = "tiny", seed: int = 0, device: torch.device | str = "cpu",
               dtype: torch.dtype = torch.float32, plan=None):
    """(model, tokenizer): a randomly initialised tiny preset and its char tokenizer."""
    from trace_rl.models.decoder import build

    config = preset(name)
    if config.vocab_size > 1024:
        raise ValueError(f"tiny_model builds char-level presets; {name!r} is a real model shape (use build())")
    model = build(config, device=device, dtype=dtype, plan=plan)
    model.init_random(generator=torch.Generator(device=device).manual_seed(seed))
    return model, char_tokenizer_for(config)
