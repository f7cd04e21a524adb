"""Local HF-format folders: `load(path, plan=...)` and `save_pretrained(model, tokenizer, folder)`.

A folder holds `config.json`, `generation_config.json`, `model.safetensors` (or shards listed in
`model.safetensors.index.json`) and tokenizer files (see `trace_rl.models.hf`). Nothing is fetched from a
hub. Tied checkpoints may omit `lm_head.weight` (as HF writes them). Missing or unexpected tensors are an
error that names them.

Qwen3-MoE experts load from either layout users have: one tensor per expert and projection
(`mlp.experts.{e}.{gate,up,down}_proj.weight`: Qwen's checkpoints, and what transformers 5 writes by
default) or transformers 5's fused in-memory layout (`mlp.experts.gate_up_proj [E, 2I, H]`, gate rows
first, and `mlp.experts.down_proj [E, H, I]`: `save_pretrained(save_original_format=False)`). Our models
hold the fused layout; `save_pretrained` writes the per-expert one.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from trace_rl.models.config import ModelConfig
from trace_rl.models.decoder import Decoder, build

WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
_DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
                torch.float64: "float64"}


def _weight_files(folder: Path) -> list[Path]:
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    if (folder / INDEX_FILE).is_file():
        index = json.loads((folder / INDEX_FILE).read_text())
        return [folder / f for f in sorted(set(index["weight_map"].values()))]
    raise FileNotFoundError(f"no {WEIGHTS_FILE} or {INDEX_FILE} in {folder}")


def read_state_dict(folder: str | Path, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    sd = {}
    for f in _weight_files(Path(folder)):
        sd.update(load_file(str(f), device=str(device)))
    return {k: v for k, v in sd.items() if not k.endswith(_IGNORED_SUFFIXES)}


def fuse_expert_weights(model: Decoder, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`state_dict` with per-expert tensors stacked into the fused layout of `model`'s expert groups."""
    groups = [ex.name for ex in model.experts()]
    if not groups or all(f"{g}.gate_up_proj" in state_dict for g in groups):
        return state_dict
    sd = dict(state_dict)
    for g in groups:
        if f"{g}.gate_up_proj" in sd:
            continue
        n = model.config.num_experts
        keys = {p: [f"{g}.{e}.{p}.weight" for e in range(n)] for p in ("gate_proj", "up_proj", "down_proj")}
        missing = [k for ks in keys.values() for k in ks if k not in sd]
        if missing:
            raise ValueError(f"state dict has neither {g}.gate_up_proj (fused experts) nor every per-expert "
                             f"tensor: missing {missing[:4]}{'...' if len(missing) > 4 else ''}")
        gate, up, down = ([sd.pop(k) for k in keys[p]] for p in ("gate_proj", "up_proj", "down_proj"))
        sd[f"{g}.gate_up_proj"] = torch.cat([torch.stack(gate), torch.stack(up)], dim=1)
        sd[f"{g}.down_proj"] = torch.stack(down)
    return sd


def split_expert_weights(model: Decoder, state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse: fused expert tensors written one per expert and projection (the checkpoint layout)."""
    sd = dict(state_dict)
    for ex in model.experts():
        gate_up, down = sd.pop(f"{ex.name}.gate_up_proj"), sd.pop(f"{ex.name}.down_proj")
        i = ex.intermediate
        for e in range(ex.num_experts):
            sd[f"{ex.name}.{e}.gate_proj.weight"] = gate_up[e, :i]
            sd[f"{ex.name}.{e}.up_proj.weight"] = gate_up[e, i:]
            sd[f"{ex.name}.{e}.down_proj.weight"] = down[e]
    return sd


@torch.no_grad()
def load_state_dict_into(model: Decoder, state_dict: dict[str, torch.Tensor]) -> None:
    """Copy a HF-named state dict into a trainer-stage model (cast to its dtype), strictly."""
    state_dict = fuse_expert_weights(model, state_dict)
    expected = {k: v for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
        state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
    missing = sorted(set(expected) - set(state_dict))
    unexpected = sorted(set(state_dict) - set(expected))
    if missing or unexpected:
        raise ValueError(f"state dict does not match the {model.config.family} decoder: missing {missing[:8]}"
                         f"{'...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                         f"{'...' if len(unexpected) > 8 else ''}")
    for name, target in expected.items():
        src = state_dict[name]
        if src.shape != target.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(src.shape)} != model shape {tuple(target.shape)}")
        target.copy_(src)


def load(path: str | Path, plan=None, device: torch.device | str = "cpu",
         dtype: torch.dtype | None = None) -> Decoder:
    """A trainer-stage Decoder from a local HF folder, with `plan` applied (None: plain).

    `dtype` defaults to the checkpoint's `torch_dtype` (float32 if absent)."""
    folder = Path(path)
    config = ModelConfig.from_pretrained(folder)
    if dtype is None:
        raw = json.loads((folder / "config.json").read_text())
        name = raw.get("torch_dtype") or raw.get("dtype") or "float32"
        dtype = {v: k for k, v in _DTYPE_NAMES.items()}.get(name, torch.float32)
    model = build(config, device=device, dtype=dtype, plan=plan)
    load_state_dict_into(model, read_state_dict(folder, device))
    return model


def hf_state_dict(model: Decoder, dtype: torch.dtype | None = None,
                  state_dict: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """The weights as an HF checkpoint stores them: CPU, contiguous, a tied `lm_head.weight` left out, MoE
    experts one tensor per expert and projection.
    `state_dict`: the model's full state dict when `model` cannot give it (FSDP-sharded: gathered first)."""
    full = split_expert_weights(model, model.state_dict() if state_dict is None else state_dict)
    sd = {k: v.detach().to("cpu", dtype or v.dtype).contiguous() for k, v in full.items()}
    if model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)        # HF omits the tied head; loaders re-tie it
    return sd


def save_pretrained(model: Decoder, tokenizer, folder: str | Path, *, sampling=None,
                    dtype: torch.dtype | None = None, state_dict: dict[str, torch.Tensor] | None = None) -> Path:
    """Write an HF model folder: config.json, generation_config.json (with `sampling`'s temperature, top-k/p
    and stop tokens when given), model.safetensors (cast to `dtype` when given) and the tokenizer files.
    transformers' `AutoModelForCausalLM` / `AutoTokenizer` and our `load` / `load_tokenizer` read it."""
    from safetensors.torch import save_file

    from trace_rl.models.hf import GENERATION_CONFIG_FILE, generation_config
    from trace_rl.models.tokenizer import CharTokenizer

    if model.is_rollout:
        raise ValueError("save_pretrained saves trainer-stage models; a rollout model holds packed weights")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    sd = hf_state_dict(model, dtype, state_dict)
    config = model.config
    if tokenizer is not None and hasattr(tokenizer, "pad_token_id") and config.pad_token_id is None:
        config = config.replace(pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                                eos_token_id=tokenizer.eos_token_id)
    dtype_name = _DTYPE_NAMES[next(iter(sd.values())).dtype]
    (folder / "config.json").write_text(json.dumps(config.to_hf_dict(dtype_name), indent=2))
    gen = generation_config(tokenizer, sampling, config)
    (folder / GENERATION_CONFIG_FILE).write_text(json.dumps(gen, indent=2))
    save_file(sd, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    if isinstance(tokenizer, CharTokenizer):
        tokenizer.save(folder, model_max_length=config.max_position_embeddings)
    elif tokenizer is not None:
        tokenizer.save_pretrained(str(folder))
    return folder
