"""Every check a run makes before its first step, without loading weights: `preflight(cfg)`.

`build(cfg)` runs it first (so `trace-rl run` fails before anything is written), and `trace-rl validate`
runs it too (so validate passes exactly the configs run accepts up to the model's weights; `validate
--build` then also loads them). Each failure is a one-line `ConfigError` naming the field (and the file
or line) and the fix:

- (optional packages, e.g. a logger's, are checked when the config is validated: `LoggingSection`);
- the task: its files (JSONL syntax, encoding, records) and both splits;
- the model: config.json / preset, the tokenizer;
- `precision.keep_high_precision` globs that match no module, `precision.guided_layers` that selects no
  FP4 layer (a typo would otherwise quietly quantize lm_head or guide nothing);
- prompt lengths: every prompt the run will draw (all records of a file task; the train prompts of each
  step and the eval prompts of a generated task, up to `MAX_PROMPTS_CHECKED`) + max_new_tokens must fit
  rollout.max_seq_len.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from trace_rl.config import ConfigError
from trace_rl.pipelines.config import DEFAULT_MODEL, PipelineConfig

ASSETS = Path(__file__).resolve().parent.parent / "assets"
DEFAULT_POLICY_DIR = ASSETS / "default_policy"
MAX_PROMPTS_CHECKED = 20_000       # a generated task's train prompts beyond this are checked when drawn



def step_seed(seed: int, step: int) -> int:
    """The seed of step `step`'s train prompts (a pure function of (seed, step): resume sees the same)."""
    return seed * 1_000_003 + step


@dataclass
class PreflightReport:
    task: object
    tokenizer: object
    notes: list[str]


def build_task_checked(cfg: PipelineConfig):
    """The task, with every way its files can be unusable turned into one ConfigError naming the field."""
    from trace_rl.tasks import build_task

    try:
        task = build_task(cfg.task)
        for split in ("train", "eval"):       # a split left empty is found now, not at the first draw
            task.problems(1, cfg.seed, split)
    except ConfigError:
        raise
    except UnicodeDecodeError as err:
        raise ConfigError(f"task: a task file is not UTF-8 text ({err.reason} at byte {err.start}); save it as "
                          f"UTF-8", ("task",)) from None
    except (ValueError, OSError, RuntimeError) as err:
        raise ConfigError(f"task ({cfg.task.kind}): {err}", ("task",)) from None
    return task


def model_skeleton(cfg: PipelineConfig):
    """(Decoder on the meta device: names and shapes, no weights; its tokenizer)."""
    import torch

    from trace_rl.models import presets
    from trace_rl.models.config import ModelConfig
    from trace_rl.models.decoder import Decoder
    from trace_rl.models.tokenizer import load_tokenizer

    if cfg.model.path is not None or cfg.model.preset == DEFAULT_MODEL:
        folder = Path(cfg.model.path).expanduser() if cfg.model.path is not None else DEFAULT_POLICY_DIR
        field = "model.path" if cfg.model.path is not None else "model.preset"
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{field}: no model at {folder} (expected config.json + *.safetensors there)", (field,))
        try:
            config = ModelConfig.from_pretrained(folder)
            tokenizer = load_tokenizer(folder)
        except (ValueError, OSError, KeyError) as err:
            raise ConfigError(f"{field}: {folder}: {err}", (field,)) from None
    else:
        if cfg.model.preset not in presets.PRESETS:
            raise ConfigError(f"model.preset: unknown preset {cfg.model.preset!r}; available: "
                              f"{', '.join([DEFAULT_MODEL, *presets.PRESETS])}", ("model.preset",))
        config = presets.preset(cfg.model.preset)
        tokenizer = presets.char_tokenizer_for(config)
    with torch.device("meta"):
        model = Decoder(config)
    return model, tokenizer


def check_module_patterns(plan, model) -> None:
    """Globs of the precision plan must name something in this model."""
    from trace_rl.correction.guided import GUIDED_FORMATS
    from trace_rl.engine.guidance import select_guided_layers
    from trace_rl.formats import per_token

    names = [n for n, _ in model.named_modules() if n]
    if plan.is_quantized:
        for glob in plan.keep_high_precision:
            if not any(fnmatchcase(n, glob) or fnmatchcase(n.rsplit(".", 1)[-1], glob) for n in names):
                raise ConfigError(
                    f"precision.keep_high_precision: {glob!r} matches no module of this model, so it keeps nothing "
                    f"in high precision; module names look like {', '.join(_examples(list(model.linears())))}, "
                    f"model.embed_tokens (a glob matches the full name or its last part); fix or remove it",
                    ("precision.keep_high_precision",))
    if plan.trainer == "guided" and plan.guided_layers not in ("all", "deeper_half"):
        linears = [n for n in model.linears() if per_token(plan.activation_format(n)) in GUIDED_FORMATS]
        if not select_guided_layers(linears, plan.guided_layers, model.config.num_layers):
            raise ConfigError(
                f"precision.guided_layers: {plan.guided_layers!r} matches none of this model's {len(linears)} FP4 "
                f"Linear layers (e.g. {', '.join(_examples(linears))}); use 'all', 'deeper_half' or a glob over "
                f"those full names", ("precision.guided_layers",))


def _examples(names: list[str]) -> list[str]:
    picks = [n for n in names if ".layers.0." in n][:2] + [n for n in names if ".layers." not in n][:1]
    return picks or names[:3]


def check_prompt_lengths(cfg: PipelineConfig, task, tokenizer) -> str:
    """Every prompt the run will feed (see the module doc) must leave room for max_new_tokens."""
    budget = cfg.rollout.max_seq_len - cfg.rollout.sampling.max_new_tokens
    draws: list[tuple[str, list]] = []
    if hasattr(task, "split_size"):                   # a finite set of records: all of them
        for split in ("train", "eval"):
            draws.append((f"{split} record", task.problems(task.split_size(split), 0, split)))
        note = f"all {sum(len(p) for _, p in draws)} records"
    else:
        per_step = cfg.loop.prompts_per_step
        steps = min(cfg.loop.steps, max(1, MAX_PROMPTS_CHECKED // per_step))
        for step in range(steps):
            draws.append((f"train prompt of step {step + 1}",
                           task.problems(per_step, step_seed(cfg.seed, step), "train")))
        draws.append(("eval prompt", task.problems(cfg.loop.eval_prompts, cfg.seed, "eval")))
        note = (f"the train prompts of steps 1-{steps}" + (f" (of {cfg.loop.steps}; later steps are checked when "
                f"drawn)" if steps < cfg.loop.steps else "") + " and the eval prompts")
    longest, where, text = 0, "", ""
    for what, problems in draws:
        for p in problems:
            n = len(tokenizer.encode(p.prompt))
            if n > longest:
                longest, where, text = n, p.meta.get("source", what) if isinstance(p.meta, dict) else what, p.prompt
    if longest > budget:
        raise ConfigError(
            f"rollout.max_seq_len: {cfg.rollout.max_seq_len} is too small: the longest prompt ({where}: "
            f"{text[:40]!r}{'...' if len(text) > 40 else ''}) is {longest} tokens, + rollout.sampling.max_new_tokens "
            f"{cfg.rollout.sampling.max_new_tokens} = {longest + cfg.rollout.sampling.max_new_tokens}; raise "
            f"rollout.max_seq_len to at least that, or lower max_new_tokens", ("rollout.max_seq_len",))
    return f"prompt lengths: {note} fit (longest {longest} + {cfg.rollout.sampling.max_new_tokens} new tokens <= " \
           f"max_seq_len {cfg.rollout.max_seq_len})"


def preflight(cfg: PipelineConfig) -> PreflightReport:
    """All checks of the module doc, in order; returns what they built (task, tokenizer) and what they saw."""
    task = build_task_checked(cfg)
    model, tokenizer = model_skeleton(cfg)
    check_module_patterns(cfg.precision, model)
    notes = [check_prompt_lengths(cfg, task, tokenizer)]
    return PreflightReport(task, tokenizer, notes)
