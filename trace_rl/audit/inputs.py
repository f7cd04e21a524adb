"""What a drift audit runs on: a model (path or preset), prompts (a JSONL file or a task) and their parsing.

Every function here raises `ConfigError` with the bad input named and what is allowed, before any output
is written (the CLI turns it into exit code 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import yaml

from trace_rl.config import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(spec: str, device: torch.device, dtype: torch.dtype, seed: int = 0):
    """(trainer-stage Decoder without a plan, tokenizer) from a local HF folder or a preset name.

    'default' is the embedded SFT'd policy; 'tiny' / 'tiny-llama' are randomly initialised (seeded)."""
    from trace_rl.models import loading, presets
    from trace_rl.models.tokenizer import load_tokenizer
    from trace_rl.pipelines.assemble import DEFAULT_POLICY_DIR
    from trace_rl.pipelines.config import DEFAULT_MODEL

    folder = DEFAULT_POLICY_DIR if spec == DEFAULT_MODEL else Path(spec)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ConfigError(f"--model {spec}: no config.json in {folder} (expected an HF-format folder: "
                              f"config.json + *.safetensors + tokenizer)", ("model",))
        return loading.load(folder, plan=None, device=device, dtype=dtype), load_tokenizer(folder)
    if spec in presets.PRESETS and presets.PRESETS[spec].vocab_size <= 1024:
        return presets.tiny_model(spec, seed=seed, device=device, dtype=dtype)
    tiny = [n for n, c in presets.PRESETS.items() if c.vocab_size <= 1024]
    raise ConfigError(f"--model {spec!r}: not a folder and not a model preset; use a local HF-format folder or "
                      f"one of: {', '.join([DEFAULT_MODEL, *tiny])}", ("model",))


def read_prompt_file(path: str | Path) -> list[str]:
    """Prompts of a JSONL file: one JSON object per line with a string "prompt" (other keys ignored)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"--prompts {path}: file not found", ("prompts",))
    prompts = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ConfigError(f"--prompts {path}:{number}: not valid JSON ({err.msg})", ("prompts",)) from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise ConfigError(f"--prompts {path}:{number}: expected an object with a non-empty string "
                              f"\"prompt\", e.g. {{\"prompt\": \"12+30=\"}}", ("prompts",))
        prompts.append(row["prompt"])
    if not prompts:
        raise ConfigError(f"--prompts {path}: no prompts in the file", ("prompts",))
    return prompts


def parse_task(text: str):
    """A task config from `--task`: a kind ('arithmetic') or a YAML mapping
    ('{kind: arithmetic, show_work: true, max_digits: 6}')."""
    from trace_rl.tasks import parse_task_config

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"--task {text!r}: not a task kind nor a YAML mapping ({problem})", ("task",)) from None
    if isinstance(data, str):
        data = {"kind": data}
    return parse_task_config(data, "--task")


def task_prompts(task, count: int, seed: int) -> list[str]:
    """`count` held-out prompts of a task (the eval split, so the SFT'd policy has not trained on them)."""
    return [p.prompt for p in task.problems(count, seed, "eval")]


def encode_prompts(prompts: list[str], tokenizer):
    """A right-padded prompt TensorDict; a prompt that encodes to nothing is an error."""
    from trace_rl.collectors.prompts import prompt_batch

    ids = [tokenizer.encode(p) for p in prompts]
    empty = [i for i, x in enumerate(ids) if not x]
    if empty:
        raise ConfigError(f"prompt {empty[0]} encodes to no tokens: {prompts[empty[0]]!r}", ("prompts",))
    return prompt_batch(ids, None, tokenizer.pad_token_id)
