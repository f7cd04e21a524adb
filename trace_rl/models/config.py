"""`ModelConfig`: the shape of a Llama / Qwen2 / Qwen3 / Qwen3-MoE decoder, read from and written to HF
`config.json`.

The families share one module tree; they differ only in a few switches:

| family    | q/k/v bias        | o_proj bias       | MLP bias      | QK-norm | usual tie |
|-----------|-------------------|-------------------|---------------|---------|-----------|
| llama     | attention_bias    | attention_bias    | mlp_bias      | no      | no        |
| qwen2     | yes (always)      | no                | no            | no      | small ones|
| qwen3     | attention_bias    | attention_bias    | no            | yes     | small ones|
| qwen3_moe | attention_bias    | attention_bias    | no            | yes     | no        |

Qwen3-MoE (`Qwen3MoeForCausalLM`): layer i is a mixture-of-experts block (`num_experts` SwiGLU experts of
width `moe_intermediate_size`, the top `num_experts_per_tok` of a softmax router, renormalised when
`norm_topk_prob`) unless i is in `mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`;
those layers are dense MLPs of width `intermediate_size` (`moe_layers()` lists the MoE ones).

RoPE: `default` and `llama3` frequency scaling (Llama 3.1+). Other rope types, sliding windows and
non-SiLU activations are refused with an error naming the field, never silently ignored.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

FAMILIES = ("llama", "qwen2", "qwen3", "qwen3_moe")
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
                 "qwen3_moe": "Qwen3MoeForCausalLM"}
QK_NORM_FAMILIES = ("qwen3", "qwen3_moe")
ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True)
class ModelConfig:
    family: str = "qwen3"
    vocab_size: int = 128
    hidden_size: int = 192
    intermediate_size: int = 512
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 2
    head_dim: int = 32
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = field(default=None, hash=False)  # llama3: factor, low/high_freq_factor, ...
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = True
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = True
    bos_token_id: int | None = None
    eos_token_id: int | None = None
    pad_token_id: int | None = None
    # Mixture of experts (family qwen3_moe; 0 experts = dense)
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.001     # the checkpoint's value (round trip); RL uses its own, off by default

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(f"model family {self.family!r} is not supported; supported: {', '.join(FAMILIES)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if self.rope_scaling is not None and self.rope_scaling.get("rope_type", "default") not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_scaling.get('rope_type')!r} is not supported; "
                             f"supported: {', '.join(ROPE_TYPES)}")
        object.__setattr__(self, "mlp_only_layers", tuple(int(i) for i in self.mlp_only_layers))
        if (self.family == "qwen3_moe") != (self.num_experts > 0):
            raise ValueError(f"family {self.family!r} with num_experts={self.num_experts}: mixture-of-experts "
                             f"layers need family 'qwen3_moe' and num_experts > 0 (dense families have none)")
        if self.num_experts > 0:
            if not 1 <= self.num_experts_per_tok <= self.num_experts:
                raise ValueError(f"num_experts_per_tok={self.num_experts_per_tok} must be in 1..num_experts="
                                 f"{self.num_experts}")
            if self.moe_intermediate_size < 1 or self.decoder_sparse_step < 1:
                raise ValueError("moe_intermediate_size and decoder_sparse_step must be >= 1")
            if self.num_experts > 32767:
                raise ValueError(f"num_experts={self.num_experts}: routing records are int16 (at most 32767)")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        """transformers' rule: sparse unless listed in mlp_only_layers or off the decoder_sparse_step grid."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    def moe_layers(self) -> list[int]:
        return [i for i in range(self.num_layers) if self.is_moe_layer(i)]

    @property
    def num_params(self) -> int:
        h, i, d = self.hidden_size, self.intermediate_size, self.head_dim
        attn = h * d * (2 * self.num_heads + 2 * self.num_kv_heads)
        common = attn + 2 * h + (2 * d if self.qk_norm else 0)
        moe = len(self.moe_layers())
        sparse = self.num_experts * 3 * h * self.moe_intermediate_size + self.num_experts * h
        per_layers = self.num_layers * common + (self.num_layers - moe) * 3 * h * i + moe * sparse
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return per_layers + embed + h

    @property
    def num_active_params(self) -> int:
        """Parameters one token reads (its top-k experts, not all of them): the 'A3B' of Qwen3-30B-A3B."""
        moe = len(self.moe_layers())
        unused = (self.num_experts - self.num_experts_per_tok) * 3 * self.hidden_size * self.moe_intermediate_size
        return self.num_params - moe * unused

    def kv_values_per_token(self) -> int:
        """K and V values one token stores over all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    # -- HF config.json --
    @classmethod
    def from_hf_dict(cls, d: dict) -> ModelConfig:
        family = d.get("model_type")
        if family not in FAMILIES:
            raise ValueError(f"config.json has model_type={family!r}; trace_rl's decoder loads "
                             f"{', '.join(FAMILIES)} checkpoints")
        if d.get("hidden_act", "silu") != "silu":
            raise ValueError(f"config.json: hidden_act={d['hidden_act']!r}; only 'silu' (SwiGLU) is supported")
        if d.get("use_sliding_window", False):
            raise ValueError("config.json: use_sliding_window=true is not supported (full attention only)")
        rope = dict(d.get("rope_parameters") or {})
        rope_theta = rope.pop("rope_theta", d.get("rope_theta", 10000.0))
        scaling = rope or d.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type", "default")) == "default":
            scaling = None
        elif scaling:
            scaling = {**scaling, "rope_type": scaling.get("rope_type", scaling.get("type"))}
            scaling.pop("type", None)
        heads = d["num_attention_heads"]
        attention_bias = bool(d.get("attention_bias", False))
        eos = d.get("eos_token_id")
        return cls(
            family=family,
            vocab_size=d["vocab_size"],
            hidden_size=d["hidden_size"],
            intermediate_size=d["intermediate_size"],
            num_layers=d["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=d.get("num_key_value_heads") or heads,
            head_dim=d.get("head_dim") or d["hidden_size"] // heads,
            rms_norm_eps=d.get("rms_norm_eps", 1e-6),
            rope_theta=float(rope_theta),
            rope_scaling=scaling,
            max_position_embeddings=d.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(d.get("tie_word_embeddings", family != "llama")),
            qkv_bias=True if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=bool(d.get("mlp_bias", False)) if family == "llama" else False,
            qk_norm=family in QK_NORM_FAMILIES,
            bos_token_id=d.get("bos_token_id"),
            eos_token_id=eos[0] if isinstance(eos, list) and eos else eos,
            pad_token_id=d.get("pad_token_id"),
            **(_moe_fields(d) if family == "qwen3_moe" else {}),
        )

    def to_hf_dict(self, dtype: str = "float32") -> dict:
        """config.json contents that both our loader and transformers (4.x and 5.x) read."""
        if self.family == "qwen2" and (not self.qkv_bias or self.o_bias or self.mlp_bias):
            raise ValueError("qwen2 checkpoints always have q/k/v biases and no o_proj/MLP bias")
        if self.family in QK_NORM_FAMILIES and (self.qkv_bias != self.o_bias or self.mlp_bias or not self.qk_norm):
            raise ValueError(f"{self.family} has QK-norm, one attention_bias switch for q/k/v/o and no MLP bias")
        if self.family == "llama" and (self.qkv_bias != self.o_bias or self.qk_norm):
            raise ValueError("llama has no QK-norm and one attention_bias switch for q/k/v/o")
        rope = {"rope_type": "default"} if self.rope_scaling is None else dict(self.rope_scaling)
        d = {
            "architectures": [ARCHITECTURES[self.family]],
            "model_type": self.family,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_parameters": {"rope_theta": self.rope_theta, **rope},
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.qkv_bias if self.family != "qwen2" else False,
            "torch_dtype": dtype,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_id,
            "pad_token_id": self.pad_token_id,
        }
        if self.rope_scaling is not None:
            d["rope_scaling"] = dict(self.rope_scaling)
        if self.family == "llama":
            d["mlp_bias"] = self.mlp_bias
        if self.family in ("qwen2", "qwen3", "qwen3_moe"):
            d["use_sliding_window"] = False
        if self.family == "qwen3_moe":
            d.update(num_experts=self.num_experts, num_experts_per_tok=self.num_experts_per_tok,
                     moe_intermediate_size=self.moe_intermediate_size, norm_topk_prob=self.norm_topk_prob,
                     decoder_sparse_step=self.decoder_sparse_step, mlp_only_layers=list(self.mlp_only_layers),
                     router_aux_loss_coef=self.router_aux_loss_coef, output_router_logits=False)
        return d

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> ModelConfig:
        path = Path(folder) / "config.json"
        if not path.is_file():
            raise FileNotFoundError(f"no config.json in {folder}: expected a local HF-format model folder "
                                    f"(config.json + *.safetensors)")
        return cls.from_hf_dict(json.loads(path.read_text()))

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        known = {f.name for f in fields(self)}
        unknown = set(changes) - known
        if unknown:
            raise ValueError(f"unknown ModelConfig fields {sorted(unknown)}; known: {sorted(known)}")
        return ModelConfig(**{**asdict(self), **changes})


def _moe_fields(d: dict) -> dict:
    """Qwen3-MoE's switches. transformers 5 writes `num_local_experts`; Qwen's checkpoints `num_experts`."""
    experts = d.get("num_experts", d.get("num_local_experts"))
    if not experts:
        raise ValueError("config.json: model_type 'qwen3_moe' without num_experts (or num_local_experts)")
    return dict(num_experts=int(experts), num_experts_per_tok=int(d.get("num_experts_per_tok", 8)),
                moe_intermediate_size=int(d.get("moe_intermediate_size", 768)),
                norm_topk_prob=bool(d.get("norm_topk_prob", False)),
                decoder_sparse_step=int(d.get("decoder_sparse_step", 1)),
                mlp_only_layers=tuple(d.get("mlp_only_layers") or ()),
                router_aux_loss_coef=float(d.get("router_aux_loss_coef", 0.001)))
