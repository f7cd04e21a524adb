"""What makes a folder an HF model folder, written without transformers: `generation_config.json`, the
check for the optional transformers package, and the list of files every folder we write holds.

A trace_rl model folder (written by `save_pretrained`, by every checkpoint and by `trace-rl export`):

| file | what |
|---|---|
| `config.json` | the HF architecture config (`Qwen3ForCausalLM`, `LlamaForCausalLM`, `Qwen2ForCausalLM`) |
| `generation_config.json` | bos/eos/pad ids, the stop tokens and the sampling the run used |
| `model.safetensors` | weights under transformers' names (a tied `lm_head.weight` left out, as HF writes it) |
| `tokenizer.json`, `tokenizer_config.json` | the tokenizer (`CharTokenizer` writes standard `tokenizers` files) |

`transformers.AutoModelForCausalLM.from_pretrained(folder)` and `AutoTokenizer.from_pretrained(folder)` load it
(tested); vLLM reads the same files.
"""

from __future__ import annotations

import importlib.util

from trace_rl.config import ConfigError

GENERATION_CONFIG_FILE = "generation_config.json"
HF_FILES = ("config.json", GENERATION_CONFIG_FILE, "model.safetensors")


class MissingDependency(ConfigError, ImportError):
    """An optional package is needed for what was asked (exit code 2 on the command line)."""


def require_transformers(purpose: str) -> None:
    """Raise `MissingDependency` with the install command when transformers is not installed."""
    if importlib.util.find_spec("transformers") is None:
        raise MissingDependency(f"{purpose} needs the transformers package: pip install 'trace-rl[hf]' "
                                f"(or pip install 'transformers>=4.50')", ("transformers",))


def generation_config(tokenizer=None, sampling=None, model_config=None) -> dict:
    """generation_config.json: special ids from the tokenizer (or the model config) and, when given, the
    run's sampling (`trace_rl.engine.base.SamplingParams`): temperature, top-k, top-p, max_new_tokens and
    its stop tokens as `eos_token_id` (a list when there are several, which transformers' generate and vLLM
    both stop on)."""
    ids = {}
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        value = getattr(tokenizer, name, None) if tokenizer is not None else None
        if value is None and model_config is not None:
            value = getattr(model_config, name, None)
        if value is not None:
            ids[name] = int(value)
    out: dict = dict(ids)
    if sampling is not None:
        stops = [int(t) for t in getattr(sampling, "stop_token_ids", ()) or ()]
        eos = [ids["eos_token_id"]] if "eos_token_id" in ids else []
        stops = list(dict.fromkeys(eos + stops))
        if stops:
            out["eos_token_id"] = stops[0] if len(stops) == 1 else stops
        greedy = sampling.temperature == 0
        out.update({"do_sample": not greedy, "max_new_tokens": int(sampling.max_new_tokens)})
        if not greedy:
            out.update({"temperature": float(sampling.temperature), "top_k": int(sampling.top_k),
                        "top_p": float(sampling.top_p)})
    return out
