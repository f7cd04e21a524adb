"""Checkpoints: tensors in safetensors, everything else in JSON; written atomically, verified on load.

Layout of `<run_dir>/checkpoint/`, which is also a complete HF model folder when the policy is our
`Decoder` (`trace_rl.models.hf`: transformers' `AutoModelForCausalLM.from_pretrained`, vLLM and
`trace-rl export` read it):

- `config.json`, `generation_config.json`, the tokenizer files, and `model.safetensors`: the trainer's
  weights under HF names (a tied lm_head left out, as HF writes it); for another module, its state dict;
- `optimizer.safetensors`: every tensor of the optimizer state, keyed `<parameter name>/<state name>`
  (e.g. `model.layers.0.mlp.up_proj.weight/exp_avg`), so one file serves one process and FSDP ranks alike;
- `rng.safetensors`: the torch CPU RNG state;
- `state.json`, written last: step, policy version, collector counters, the optimizer's scalars and param
  groups (by parameter name), the run's config and its fingerprint, and the sha256 and size of every
  other file. A checkpoint is complete when its state.json parses and every hash matches.

Nothing in a checkpoint is unpickled (safetensors and JSON only), so a planted file cannot run code.

Saving never leaves a run without a complete checkpoint: files go to `checkpoint.tmp/` (each fsynced,
state.json last), then `checkpoint/` is renamed to `checkpoint.old/`, `checkpoint.tmp/` to `checkpoint/`,
and `checkpoint.old/` is deleted (the folder fsynced after each rename). A process killed at any point
leaves at least one complete checkpoint among the three folders; `find_checkpoint` takes the newest
complete one, says which, and `promote` makes it `checkpoint/` again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from trace_rl.config import ConfigError

CHECKPOINT_DIR = "checkpoint"
TMP_DIR = CHECKPOINT_DIR + ".tmp"
OLD_DIR = CHECKPOINT_DIR + ".old"
INVALID_DIR = CHECKPOINT_DIR + ".invalid"
FORMAT = 2
TENSOR_FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors")


class CheckpointError(ConfigError):
    """A checkpoint cannot continue this run (missing, incomplete, corrupted, another run's, non-finite).
    It is bad input to `--resume`: exit code 2, the message names the file and what to do."""


def _checkpoint_stage(name: str) -> None:
    """Named stages of a save ("tmp:<file>", "tmp:state.json", "swap:old", "swap:new", "done"). Nothing
    happens here; the fault-injection tests kill the process at each one (tests/pipelines/test_checkpoint.py)."""


# -- files: fsync and hashes --

def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _digest_and_sync(path: Path) -> dict:
    """sha256 and size of a just-written file, which is also fsynced (read back once, from the page cache)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
        os.fsync(f.fileno())
    return {"sha256": h.hexdigest(), "bytes": path.stat().st_size}


def _write_json(path: Path, data: dict) -> None:
    with open(path, "w") as f:
        f.write(json.dumps(data, indent=2, default=float, allow_nan=False))
        f.flush()
        os.fsync(f.fileno())


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# -- the config's identity: what a checkpoint must share with the run that resumes it --

# Fields a resumed run may change (applied to the live objects: the optimizer's lr, the loop's length);
# any other difference means the checkpoint belongs to another run.
RESUMABLE_FIELDS = (
    "loop.steps", "loop.eval_every", "loop.eval_prompts", "loop.checkpoint_every", "loop.collapse", "trainer.lr",
    "trainer.grad_clip", "model.cpu_threads", "logging.progress", "logging.plot", "logging.tensorboard",
    "logging.loggers", "logging.wandb", "logging.mlflow", "loop.keep_models", "loop.eval_reference",
)


def flatten(data, prefix: str = "") -> dict[str, object]:
    """{"a.b": 1, "c.0.d": 2} from nested dicts and lists (lists of scalars stay whole)."""
    out: dict[str, object] = {}
    items = data.items() if isinstance(data, dict) else None
    if items is None:
        return {prefix: data}
    for key, value in items:
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict):
            out.update(flatten(value, name))
        elif isinstance(value, list) and any(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                out.update(flatten(v, f"{name}.{i}") if isinstance(v, dict) else {f"{name}.{i}": v})
        else:
            out[name] = value
    return out


def identity(config: dict) -> dict[str, object]:
    return {k: v for k, v in flatten(config).items()
            if not any(k == f or k.startswith(f + ".") for f in RESUMABLE_FIELDS)}


def fingerprint(config: dict) -> str:
    """sha256 over the config's fields that define the run (everything but RESUMABLE_FIELDS)."""
    return hashlib.sha256(json.dumps(identity(config), sort_keys=True, default=str).encode()).hexdigest()[:16]


def config_differences(old: dict, new: dict, fields=None) -> dict[str, tuple]:
    """{field: (old value, new value)} over all fields, or only over `fields` (their prefixes)."""
    a, b = flatten(old), flatten(new)
    keys = sorted(set(a) | set(b))
    if fields is not None:
        keys = [k for k in keys if any(k == f or k.startswith(f + ".") for f in fields)]
    return {k: (a.get(k), b.get(k)) for k in keys if a.get(k) != b.get(k)}


# -- optimizer state by parameter name --

def _param_names(model: torch.nn.Module) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def split_optimizer_state(named_state: dict, param_groups: list[dict]) -> tuple[dict[str, torch.Tensor], dict]:
    """(tensors keyed "<param>/<name>", JSON meta) of an optimizer state keyed by parameter name."""
    tensors, scalars = {}, {}
    for param, entry in named_state.items():
        for name, value in entry.items():
            if torch.is_tensor(value):
                tensors[f"{param}/{name}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(param, {})[name] = value
    return tensors, {"scalars": scalars, "param_groups": param_groups}


def named_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, list[dict]]:
    """The optimizer's state and param groups with parameters named as in `model.named_parameters()`."""
    names = _param_names(model)
    state, groups = {}, []
    for group in optimizer.param_groups:
        params = [names[id(p)] for p in group["params"]]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
        for p, name in zip(group["params"], params):
            if p in optimizer.state and optimizer.state[p]:
                state[name] = dict(optimizer.state[p])
    return state, groups


def join_optimizer_state(tensors: dict[str, torch.Tensor], meta: dict) -> dict:
    """The inverse of split_optimizer_state: {"state": {param name: {...}}, "param_groups": [...]}."""
    state: dict[str, dict] = {}
    for key, value in tensors.items():
        param, name = key.rsplit("/", 1)
        state.setdefault(param, {})[name] = value
    for param, entry in meta["scalars"].items():
        state.setdefault(param, {}).update(entry)
    return {"state": state, "param_groups": meta["param_groups"]}


def load_named_optimizer_state(model, optimizer: torch.optim.Optimizer, named: dict, where: str) -> None:
    """Load a by-name optimizer state into `optimizer` (whose parameters belong to `model`)."""
    names = _param_names(model)
    ours = [[names[id(p)] for p in g["params"]] for g in optimizer.param_groups]
    theirs = [g["params"] for g in named["param_groups"]]
    if ours != theirs:
        missing = sorted({n for g in ours for n in g} - {n for g in theirs for n in g})
        raise CheckpointError(f"{where}: the optimizer's parameters differ from this model's"
                              f"{f' (missing: {missing[:3]})' if missing else ''}; the checkpoint belongs to "
                              f"another model or optimizer")
    index = {name: i for i, name in enumerate(n for g in ours for n in g)}
    sd = {"state": {index[name]: entry for name, entry in named["state"].items()},
          "param_groups": [{**{k: v for k, v in g.items() if k != "params"}, "params": [index[n] for n in g["params"]]}
                           for g in named["param_groups"]]}
    optimizer.load_state_dict(sd)


# -- save --

def save_checkpoint(run_dir: Path, model_state: dict[str, torch.Tensor], optimizer_state: tuple[dict, list[dict]],
                    state: dict, config: dict | None = None, *, hf_model=None, tokenizer=None,
                    sampling=None) -> Path:
    """Write a checkpoint atomically (see the module doc). `model_state`: the full state dict; `optimizer_state`:
    (named state, named param groups) as `named_optimizer_state` gives them; `hf_model` (our Decoder, possibly
    sharded: only its config is read), `tokenizer`, `sampling`: also write the HF model folder files."""
    run_dir = Path(run_dir)
    folder, tmp, old = run_dir / CHECKPOINT_DIR, run_dir / TMP_DIR, run_dir / OLD_DIR
    if tmp.exists():
        shutil.rmtree(tmp)          # an interrupted save; checkpoint/ (or .old) still holds the last one
    tmp.mkdir(parents=True)
    if hf_model is not None:
        from trace_rl.models.loading import save_pretrained

        save_pretrained(hf_model, tokenizer, tmp, sampling=sampling, state_dict=model_state)
    else:       # a module assembled in Python that is not our Decoder: its state dict, not an HF folder
        # tied weights share storage; safetensors refuses shared tensors, so store each name's own copy
        save_file({k: v.detach().contiguous().cpu().clone() for k, v in model_state.items()},
                  str(tmp / "model.safetensors"))
    _checkpoint_stage("tmp:model.safetensors")
    opt_tensors, opt_meta = split_optimizer_state(*optimizer_state)
    for name, tensors in (("optimizer.safetensors", opt_tensors), ("rng.safetensors", {"cpu": torch.get_rng_state()})):
        save_file(tensors, str(tmp / name))
        _checkpoint_stage(f"tmp:{name}")
    files = {str(p.relative_to(tmp)): _digest_and_sync(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
    record = {"format": FORMAT, **state, "optimizer": opt_meta, "files": files}
    if config is not None:
        record["config"] = config
        record["config_fingerprint"] = fingerprint(config)
    _write_json(tmp / "state.json", record)
    _fsync_dir(tmp)
    _checkpoint_stage("tmp:state.json")
    if folder.exists():
        if old.exists():
            shutil.rmtree(old)
        os.rename(folder, old)
        _fsync_dir(run_dir)
        _checkpoint_stage("swap:old")
    os.rename(tmp, folder)
    _fsync_dir(run_dir)
    _checkpoint_stage("swap:new")
    if old.exists():
        shutil.rmtree(old)
    _checkpoint_stage("done")
    return folder


# -- find, verify, load --

@dataclass
class FoundCheckpoint:
    folder: Path
    state: dict
    note: str           # which folder and why, for the user


def verify(folder: Path) -> dict:
    """state.json of a complete, intact checkpoint folder; CheckpointError naming the file otherwise."""
    state_file = folder / "state.json"
    if not state_file.is_file():
        raise CheckpointError(f"{state_file}: missing (the save that wrote {folder.name}/ did not finish)")
    try:
        state = json.loads(state_file.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{state_file}: corrupted ({err}); it is not the JSON trace-rl wrote") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT or not isinstance(state.get("files"), dict):
        raise CheckpointError(f"{state_file}: not a trace-rl checkpoint of format {FORMAT} (written by another "
                              f"version?); start the run again with --overwrite")
    for name in TENSOR_FILES:
        if name not in state["files"]:
            raise CheckpointError(f"{state_file}: lists no {name}; not a complete trace-rl checkpoint")
    for name, want in state["files"].items():
        path = folder / name
        if not path.is_file():
            raise CheckpointError(f"{path}: missing from the checkpoint")
        if path.stat().st_size != want["bytes"] or _sha256(path) != want["sha256"]:
            raise CheckpointError(f"{path}: corrupted (its sha256 differs from the one recorded in state.json "
                                  f"when it was written)")
    return state


def find_checkpoint(run_dir: Path) -> FoundCheckpoint:
    """The newest complete checkpoint among checkpoint/, checkpoint.tmp/ and checkpoint.old/."""
    run_dir = Path(run_dir)
    found, problems = [], []
    for rank, name in enumerate((CHECKPOINT_DIR, TMP_DIR, OLD_DIR)):
        folder = run_dir / name
        if not folder.is_dir():
            continue
        try:
            state = verify(folder)
        except CheckpointError as err:
            problems.append(str(err))
            continue
        found.append((int(state.get("step", -1)), -rank, folder, state))
    if not found:
        if problems:
            raise CheckpointError(f"no complete checkpoint in {run_dir}: {'; '.join(problems)}; the run cannot "
                                  f"resume (start it again with --overwrite)")
        raise CheckpointError(f"no checkpoint in {run_dir} (expected {CHECKPOINT_DIR}/state.json there); start "
                              f"without --resume")
    step, _, folder, state = max(found, key=lambda f: f[:2])
    others = [f"{f.name}/ (step {s})" for s, _, f, _ in found if f != folder] + problems
    note = f"{folder.name}/ (step {step})" + (f"; also there: {', '.join(others)}" if others else "")
    return FoundCheckpoint(folder, state, note)


def promote(run_dir: Path, found: FoundCheckpoint) -> Path:
    """Make the chosen checkpoint `checkpoint/` again and clear the other candidates (crash-safe: at every
    moment the chosen one is complete under one of the three names)."""
    run_dir = Path(run_dir)
    folder, tmp, old = run_dir / CHECKPOINT_DIR, run_dir / TMP_DIR, run_dir / OLD_DIR
    if found.folder.name != CHECKPOINT_DIR:
        if folder.exists():         # older, incomplete or corrupted: kept aside only if not complete
            aside = old if found.folder.name == TMP_DIR else run_dir / INVALID_DIR
            if aside.exists():
                shutil.rmtree(aside)
            os.rename(folder, aside)
            _fsync_dir(run_dir)
        os.rename(found.folder, folder)
        _fsync_dir(run_dir)
        found.folder = folder
    for stale in (tmp, old):
        if stale.exists():
            shutil.rmtree(stale)
    return folder


def _check_finite(tensors: dict[str, torch.Tensor], path: Path) -> None:
    for key, t in tensors.items():
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise CheckpointError(f"{path}: tensor {key!r} has {bad} non-finite values (NaN/Inf); this checkpoint "
                                  f"cannot continue the run")


def read_checkpoint(folder: Path) -> tuple[dict[str, torch.Tensor], dict, torch.Tensor, dict]:
    """(model state dict, by-name optimizer state, CPU RNG state, state.json) of a verified folder."""
    state = verify(folder)
    out = []
    for name in TENSOR_FILES:
        try:
            out.append(load_file(str(folder / name)))
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{folder / name}: unreadable ({err})") from None
    model_t, opt_t, rng = out
    _check_finite(model_t, folder / "model.safetensors")
    _check_finite(opt_t, folder / "optimizer.safetensors")
    return model_t, join_optimizer_state(opt_t, state.pop("optimizer")), rng["cpu"], state


def check_same_run(state: dict, config: dict | None, where: Path) -> dict[str, tuple]:
    """Refuse a checkpoint written under another config (fields other than RESUMABLE_FIELDS differ).
    Returns the resumable fields that changed: {field: (checkpoint value, now)}."""
    saved = state.get("config")
    if config is None or saved is None:
        return {}
    if state.get("config_fingerprint") != fingerprint(config):
        diff = config_differences(identity(saved), identity(config))
        shown = "; ".join(f"{k}: {a!r} there, {b!r} here" for k, (a, b) in list(diff.items())[:4])
        raise CheckpointError(f"{where}: written by a different run ({shown}{'; ...' if len(diff) > 4 else ''}); "
                              f"a checkpoint only continues the run whose config it was saved with")
    return config_differences(saved, config, RESUMABLE_FIELDS)
