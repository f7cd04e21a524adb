"""Checkpoints: model and optimizer tensors in safetensors, step/RNG/counters in JSON.

Layout of `<run_dir>/checkpoint/`, which is also a complete HF model folder (`trace_rl.models.hf`:
transformers' `AutoModelForCausalLM.from_pretrained` and vLLM load it): `config.json`,
`generation_config.json`, `model.safetensors` (the trainer's weights under HF names), the tokenizer files,
and for resuming `optimizer.safetensors`
(every tensor of the optimizer state, keyed `state.<param index>.<name>`), `state.json` (step, policy
version, collector counters, optimizer scalars and param groups, config), `rng.safetensors` (torch CPU
RNG state). Resuming from it continues the run exactly (same metrics as an uninterrupted run on CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

CHECKPOINT_DIR = "checkpoint"


def _split_optimizer_state(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    tensors, scalars = {}, {}
    for idx, entry in state["state"].items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"state.{idx}.{name}"] = value.detach().contiguous().cpu()
            else:
                scalars[f"{idx}.{name}"] = value
    return tensors, {"scalars": scalars, "param_groups": state["param_groups"]}


def _join_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    state: dict[int, dict] = {}
    for key, value in tensors.items():
        _, idx, name = key.split(".", 2)
        state.setdefault(int(idx), {})[name] = value
    for key, value in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = value
    return {"state": state, "param_groups": meta["param_groups"]}


def save_checkpoint(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict, *,
                    tokenizer=None, sampling=None) -> Path:
    from trace_rl.models.decoder import Decoder
    from trace_rl.models.loading import save_pretrained

    folder = Path(run_dir) / CHECKPOINT_DIR
    tmp = folder.with_name(CHECKPOINT_DIR + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    if isinstance(model, Decoder):
        save_pretrained(model, tokenizer, tmp, sampling=sampling)       # the HF model folder part
    else:       # a model assembled in Python that is not our Decoder: its state dict only, not an HF folder
        sd = {k: v.detach().contiguous().cpu().clone() for k, v in model.state_dict().items()}
        save_file(sd, str(tmp / "model.safetensors"))
    tensors, meta = _split_optimizer_state(optimizer.state_dict())
    save_file(tensors, str(tmp / "optimizer.safetensors"))
    save_file({"cpu": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
    (tmp / "state.json").write_text(json.dumps({**state, "optimizer": meta}, indent=2, default=float))
    if folder.exists():
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    tmp.rename(folder)        # a checkpoint is replaced whole or not at all
    return folder


def load_checkpoint(run_dir: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    folder = Path(run_dir) / CHECKPOINT_DIR
    if not (folder / "state.json").is_file():
        raise FileNotFoundError(f"no checkpoint in {folder} (expected state.json there); start without --resume")
    state = json.loads((folder / "state.json").read_text())
    from trace_rl.models.decoder import Decoder
    from trace_rl.models.loading import load_state_dict_into

    device = next(model.parameters()).device
    weights = load_file(str(folder / "model.safetensors"), device=str(device))
    if isinstance(model, Decoder):
        load_state_dict_into(model, weights)          # re-ties a tied lm_head the HF file leaves out
    else:
        model.load_state_dict(weights)
    opt_tensors = {k: v.to(device) for k, v in load_file(str(folder / "optimizer.safetensors")).items()}
    optimizer.load_state_dict(_join_optimizer_state(opt_tensors, state.pop("optimizer")))
    torch.set_rng_state(load_file(str(folder / "rng.safetensors"))["cpu"])
    return state
