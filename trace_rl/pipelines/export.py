"""`trace-rl export RUN_DIR OUT [--step N] [--dtype D]`: a run's checkpoint as a standalone HF model folder.

Every checkpoint a run writes is already an HF model folder (config.json, generation_config.json,
model.safetensors, tokenizer files; `trace_rl.models.hf`) with the resume state beside it
(optimizer.safetensors, rng.safetensors, state.json). `export` copies the model part — without the
optimizer state — into OUT, optionally cast to another dtype, so it can be handed to transformers, TRL or
vLLM. Checkpoints written before checkpoints were HF folders (model.safetensors + state.json only) are
rebuilt from the run's config.yaml.

Errors (no checkpoint, unknown step, OUT not empty) are `ConfigError`s: exit code 2, nothing written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from trace_rl.config import ConfigError

RESUME_FILES = ("optimizer.safetensors", "rng.safetensors", "state.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def find_checkpoints(run_dir: str | Path) -> dict[int, Path]:
    """{step: folder} of the complete checkpoints in a run directory (folders named checkpoint* holding a
    state.json and model.safetensors; unfinished `*.tmp` folders and sharded FSDP checkpoints are skipped) and
    of the model snapshots `loop.keep_models` keeps (`<run>/models/step-<N>/`). A checkpoint wins over a
    snapshot of the same step, and the newest folder when two checkpoints hold one step."""
    run_dir = Path(run_dir)
    found: dict[int, Path] = {}
    folders = [p for p in run_dir.rglob("state.json") if p.parent.name.startswith("checkpoint")
               and not p.parent.name.endswith(".tmp") and (p.parent / "model.safetensors").is_file()]
    for state in sorted(folders, key=lambda p: p.stat().st_mtime):
        try:
            step = int(json.loads(state.read_text())["step"])
        except (ValueError, KeyError, TypeError):
            continue
        found[step] = state.parent
    for folder in sorted((run_dir / MODELS_DIR).glob("step-*")):      # loop.keep_models snapshots
        if folder.name[5:].isdigit() and (folder / "config.json").is_file() and int(folder.name[5:]) not in found:
            found[int(folder.name[5:])] = folder
    return dict(sorted(found.items()))


MODELS_DIR = "models"          # <run>/models/step-<N>/: HF model folders of earlier checkpoints (loop.keep_models)


def keep_model_snapshot(run_dir: str | Path, step: int, keep: int) -> Path | None:
    """After a checkpoint of `step` was saved: keep its HF model part as `<run>/models/step-<step>/` (hard links
    to the checkpoint's files, so no extra disk until the checkpoint is replaced; a copy where links are not
    possible) and delete all but the newest `keep` snapshots. Returns the snapshot folder."""
    run_dir = Path(run_dir)
    source = run_dir / "checkpoint"
    if keep <= 0 or not (source / "config.json").is_file():
        return None
    root = run_dir / MODELS_DIR
    target = root / f"step-{step:06d}"
    tmp = root / f".step-{step:06d}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file() and f.name not in RESUME_FILES:
            try:
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copy2(f, tmp / f.name)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    for old in sorted(p for p in root.iterdir() if p.name.startswith("step-"))[:-keep]:
        shutil.rmtree(old)
    return target


def select_checkpoint(run_dir: str | Path, step: int | None = None) -> tuple[int, Path]:
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"export: {run_dir} is not a directory (give a run directory, e.g. runs/fp4-...)",
                          ("run_dir",))
    found = find_checkpoints(run_dir)
    if not found:
        raise ConfigError(f"export: no checkpoint in {run_dir} (a finished run or loop.checkpoint_every writes "
                          f"checkpoint/ there)", ("run_dir",))
    if step is None:
        step = max(found)
    if step not in found:
        raise ConfigError(f"export: --step {step}: no checkpoint of that step in {run_dir}; available: "
                          f"{', '.join(map(str, found))} (loop.keep_models keeps earlier ones)", ("step",))
    return step, found[step]


def _legacy_model(run_dir: Path, folder: Path):
    """(model, tokenizer, sampling) of a checkpoint without config.json, rebuilt from the run's config.yaml."""
    from safetensors.torch import load_file

    from trace_rl.engine.base import SamplingParams
    from trace_rl.models.loading import load_state_dict_into
    from trace_rl.pipelines.assemble import load_policy, stop_token_ids
    from trace_rl.pipelines.config import PipelineConfig
    from trace_rl.tasks import build_task

    saved = run_dir / "config.yaml"
    if not saved.is_file():
        raise ConfigError(f"export: {folder} is an old-style checkpoint (no config.json) and {saved} is missing, "
                          f"so the architecture is unknown", ("run_dir",))
    cfg = PipelineConfig.load(saved)
    model, tokenizer = load_policy(cfg.model_copy(update={"precision": type(cfg.precision)()}), torch.device("cpu"))
    load_state_dict_into(model, load_file(str(folder / "model.safetensors")))
    s = cfg.rollout.sampling
    sampling = SamplingParams(temperature=s.temperature, top_k=s.top_k, top_p=s.top_p, max_new_tokens=s.max_new_tokens,
                              stop_token_ids=stop_token_ids(build_task(cfg.task), tokenizer))
    return model, tokenizer, sampling


def export_checkpoint(run_dir: str | Path, out: str | Path, step: int | None = None,
                      dtype: str | None = None) -> tuple[int, Path]:
    """Write the checkpoint of `step` (None: the newest) of `run_dir` into `out` as an HF model folder.
    Returns (step, out)."""
    from trace_rl.models.hf import GENERATION_CONFIG_FILE
    from trace_rl.models.loading import load, save_pretrained
    from trace_rl.models.tokenizer import load_tokenizer

    run_dir, out = Path(run_dir), Path(out)
    if dtype is not None and dtype not in DTYPES:
        raise ConfigError(f"export: --dtype {dtype!r}; allowed: {', '.join(DTYPES)}", ("dtype",))
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"export: {out} exists and is not an empty folder; choose a new OUT", ("out",))
    step, folder = select_checkpoint(run_dir, step)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    if (folder / "config.json").is_file():           # an HF folder already: copy it without the resume state
        if dtype is None:
            shutil.copytree(folder, tmp, ignore=shutil.ignore_patterns(*RESUME_FILES))
        else:
            save_pretrained(load(folder), load_tokenizer(folder), tmp, dtype=DTYPES[dtype])
            if (folder / GENERATION_CONFIG_FILE).is_file():
                shutil.copy2(folder / GENERATION_CONFIG_FILE, tmp / GENERATION_CONFIG_FILE)
    else:
        model, tokenizer, sampling = _legacy_model(run_dir, folder)
        save_pretrained(model, tokenizer, tmp, sampling=sampling, dtype=DTYPES[dtype] if dtype else None)
    if out.exists():
        out.rmdir()
    tmp.rename(out)
    return step, out


def add_export_args(p) -> None:
    p.add_argument("run_dir", help="a run directory (holds checkpoint/ and config.yaml)")
    p.add_argument("out", help="the folder to write (must not exist, or be empty)")
    p.add_argument("--step", type=int, help="the checkpoint's step (default: the newest)")
    p.add_argument("--dtype", choices=list(DTYPES), help="cast the weights (default: as trained)")


def cmd_export(args) -> int:
    step, out = export_checkpoint(args.run_dir, args.out, args.step, args.dtype)
    print(f"exported step {step} of {args.run_dir} to {out}: an HF model folder "
          f"(AutoModelForCausalLM.from_pretrained({str(out)!r}) loads it)")
    return 0
